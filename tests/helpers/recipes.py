"""The recipe the tests of the training machinery run.

``vlarl-train``'s embedded default is RLPD on PushCube from motion-planner demonstrations made on first use
(``configs/experiment/pushcube_rlpd.yaml``). Tests of the runner, workers, scheduler, CLI and policies were written
against the PPO recipe's shape (a Gaussian MLP, dense reward, no demonstrations), so they name it; the tests of the
default itself (``tests/config/test_config.py``) compose it without this pin."""

from __future__ import annotations

PPO = "experiment=pushcube_mlp_ppo"


def pinned(args: list[str]) -> list[str]:
    """``args`` with the PPO recipe first unless they choose an experiment or resume a run (whose saved config
    already holds its recipe)."""
    keeps = ("experiment=", "~experiment", "+experiment=", "resume=")
    return list(args) if any(str(a).startswith(keeps) for a in args) else [PPO, *args]
