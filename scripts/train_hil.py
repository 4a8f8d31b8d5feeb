"""Learn on the Franka with a human in the loop (robots/hil.py): the composition root that hands robots the pieces
it may not import itself (the LeRobot v3 writer and reader, the MLP policy family, the VLM critic).

    python scripts/train_hil.py output=outputs/hil_reach hil.episodes=200 hil.interventions.device=scripted
    python scripts/train_hil.py output=outputs/hil_reach resume=true          # after a kill or a stop: goes on
    python scripts/train_hil.py output=outputs/hil_rlpd hil.learner.name=rlpd  # vlarl's chunked RLPD as learner
    python scripts/train_hil.py env.franky.ip=<FCI address> env.franky.realtime=enforce \
        hil.interventions.device=keyboard hil.reward.source=operator_key     # a real arm, a human operator

Keys: ``env.*`` = robots.reach_task.FrankaReachConfig, ``hil.*`` = robots.hil.HILConfig; ``policy_dir`` starts
from a saved policy (else a fresh MLP with ``chunk_size`` / ``init_log_std``, tanh-squashed for ``sac`` / ``rlpd``).
Bad input: one line, exit 2.

Learners (``hil.learner.name``): ``awac`` (robots.learner) and ``sac`` / ``rlpd`` (vlarl.algorithms.sac on the
robot's episodes, robots.rlpd_learner), which this script registers: robots may not import vlarl.

Operator stop (``operator_stop=true``): a line ``s``, ``q`` or an empty line on stdin (with the keyboard device:
its ``x`` key) stops the arm at once and ends the run after recording the episode; ``resume=true`` goes on. Set
``operator_stop=false`` for a run without a terminal of its own (an interactive shell's background job that reads
stdin is stopped by the terminal).
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robots.hil import HILConfig, run
from robots.reach_task import FrankaReachConfig

SQUASHED_LEARNERS = ("sac", "rlpd")  # their actor is tanh-squashed (SAC's log-prob of a bounded action)


def sac_algorithms() -> dict[str, Any]:
    """vlarl's chunked SAC with ``SACConfig`` / ``RLPDConfig`` defaults, as ``robots.rlpd_learner.ChunkedSAC``."""
    from robots.rlpd_learner import ChunkedSAC
    from vlarl.algorithms.replay import TRANSITION_KEYS
    from vlarl.algorithms.sac import make_sac_state, sac_steps, validate_sac
    from vlarl.config.schema import RLPDConfig, SACConfig

    return {name: ChunkedSAC(schema=schema, validate=validate_sac, make_state=make_sac_state, steps=sac_steps,
                             transition_keys=TRANSITION_KEYS) for name, schema in (("sac", SACConfig), ("rlpd", RLPDConfig))}


def register_sac_learners() -> None:
    """``hil.learner.name=sac`` / ``rlpd`` as robot learners. Module-level pieces only, so the factory pickles by
    reference to a Ray learner."""
    from functools import partial

    from robots.learner import register_learner
    from robots.rlpd_learner import SACLearner

    for name, algorithm in sac_algorithms().items():
        register_learner(name, partial(SACLearner, algorithm=algorithm))


@dataclass
class TrainHILConfig:
    env: FrankaReachConfig = field(default_factory=FrankaReachConfig)
    hil: HILConfig = field(default_factory=HILConfig)
    policy_dir: str = ""  # a save_pretrained directory to start from; "" = a fresh MLP
    chunk_size: int = 5
    init_log_std: float = -3.5  # std ~0.03 m: about the safety layer's per-step limit (in action units, squashed too)
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    output: str = "outputs/hil"
    resume: bool = False
    operator_stop: bool = True  # stdin (or the keyboard device's x) stops the arm and ends the run
    video_codec: str = "h264"


def load_config(argv: list[str]) -> TrainHILConfig:
    from omegaconf import OmegaConf

    base = OmegaConf.structured(TrainHILConfig)
    base.env.franky.ip, base.env.franky.realtime = "127.0.0.1", "ignore"
    bad = [a for a in argv if "=" not in a]
    if bad:
        raise ValueError(f"argument '{bad[0]}' must look like key=value (e.g. hil.episodes=100)")
    try:
        cfg = OmegaConf.to_object(OmegaConf.merge(base, OmegaConf.from_dotlist(argv)))
    except Exception as exc:
        raise ValueError(f"invalid configuration: {str(exc).splitlines()[0]}") from exc
    cfg.hil.interventions.validate()
    from robots.learner import LEARNERS

    name = cfg.hil.learner.name
    if name not in {*LEARNERS, *SQUASHED_LEARNERS}:
        raise ValueError(f"hil.learner.name='{name}' is unknown; choose one of {sorted({*LEARNERS, *SQUASHED_LEARNERS})}")
    if name in SQUASHED_LEARNERS:  # vlarl takes seconds to import: only for a run that uses it
        from robots.rlpd_learner import algorithm_config

        register_sac_learners()
        algorithm_config(sac_algorithms()[name], cfg.hil.learner)  # checked before anything is written
    return cfg


def initial_policy(cfg: TrainHILConfig, env: Any) -> str:
    """A fresh MLP policy for the env, saved beside the run (or ``policy_dir``)."""
    if cfg.policy_dir:
        return cfg.policy_dir
    from policies.base import PolicySpec
    from policies.mlp import MLPPolicy, MLPPolicyConfig

    a, half = env.spec.action_dim, 0.1
    spec = PolicySpec(state_dim=env.spec.state_dim, action_dim=a, action_low=[-half] * a, action_high=[half] * a,
                      max_episode_steps=env.spec.max_episode_steps, task=env.spec.task, instruction=env.spec.instruction)
    squash = cfg.hil.learner.name in SQUASHED_LEARNERS
    # a squashed Gaussian lives before tanh(u) * half: the same std in metres is a log std larger by -log(half)
    log_std = cfg.init_log_std - math.log(half) if squash else cfg.init_log_std
    policy = MLPPolicy(MLPPolicyConfig(hidden_sizes=list(cfg.hidden), activation="relu", chunk_size=cfg.chunk_size,
                                       init_log_std=log_std, squash=squash), spec)
    out = Path(cfg.output) / "initial_policy"
    if not out.is_dir():
        policy.save_pretrained(out)
    return str(out)


def writer_factory(fps: int, codec: str):
    from vlarl.data.lerobot_writer import LeRobotDatasetWriter

    return lambda path: LeRobotDatasetWriter(path, fps=fps, robot_type="franka", codec=codec)


def read_episode(path: Path) -> dict[str, np.ndarray]:
    """One recorded episode back as the learner's arrays (robots.hil.episode_arrays)."""
    import json

    from vlarl.data.lerobot_v3 import read_lerobot_dataset

    ep = read_lerobot_dataset(path, cameras=[])[0]
    col = {k: read_lerobot_dataset(path, state_key=None, action_key=k, cameras=[])[0].actions
           for k in ("next.reward", "intervention")}
    return {"state": ep.state, "action": ep.actions, "reward": col["next.reward"].reshape(-1),
            "intervention": col["intervention"].reshape(-1) > 0.5,
            "final_state": np.asarray(json.loads(ep.meta["final_state"]), np.float32),
            "terminated": bool(ep.meta.get("success", False)), "meta": dict(ep.meta)}


def load_critic(path: str):
    from policies.critics.base import Critic

    critic = Critic.from_pretrained(path).eval()
    return critic.score


def operator_stop(cfg: TrainHILConfig):
    """The env's operator stop: stdin lines, or (keyboard device, which owns stdin) only its ``x`` key."""
    import io

    from robots.safety import OperatorStop

    if not cfg.operator_stop:
        return None
    return OperatorStop(io.StringIO() if cfg.hil.interventions.device == "keyboard" else None)


def main(argv: list[str] | None = None) -> int:
    import torch

    from robots.franky_driver import RobotLinkError
    from robots.hil import check_output
    from robots.reach_task import FrankaReachEnv

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("robots.safety").setLevel(logging.ERROR)  # clamps are counted per episode instead
    try:
        cfg = load_config(list(sys.argv[1:] if argv is None else argv))
        check_output(cfg.output, cfg.resume)
        if cfg.policy_dir:  # a learner that cannot train it (e.g. sac/rlpd and an unsquashed policy): one line
            from policies.base import Policy
            from robots.learner import make_learner

            make_learner(Policy.from_pretrained(cfg.policy_dir), cfg.hil.learner)
        critic = load_critic(cfg.hil.reward.critic_path) if cfg.hil.reward.source == "critic" else None
        env = FrankaReachEnv(cfg.env, operator_stop=operator_stop(cfg))
    except (ValueError, OSError, RobotLinkError, ImportError) as exc:
        print(f"train_hil: error: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    try:
        rows = run(cfg.hil, env, initial_policy(cfg, env), cfg.output,
                   writer_factory(int(cfg.env.policy_hz), cfg.video_codec), read_episode, resume=cfg.resume,
                   critic=critic)
    finally:
        env.close()
    evals = [(r["episode"], r["robot_minutes"], r["eval/success"]) for r in rows if "eval/success" in r]
    print("episode  robot_min  heldout_success")
    for e, m, s in evals:
        print(f"{e:7d}  {m:9.2f}  {s:15.2f}")
    if rows and rows[-1].get("fault") == "operator stop":
        print(f"stopped by the operator after episode {rows[-1]['episode']}; resume=true goes on")
    return 0


if __name__ == "__main__":
    sys.exit(main())
