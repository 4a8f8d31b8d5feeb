"""``scripts/train_hil.py``: learn on the Franka with a human in the loop (``vlarl.hil.run``), and the CLI
prologue it shares with ``scripts/robot_soak.py`` (config from ``key=value`` arguments, the first policy).

    python scripts/train_hil.py output=outputs/hil_reach hil.episodes=200 hil.interventions.device=scripted
    python scripts/train_hil.py output=outputs/hil_reach resume=true          # after a kill or a stop: goes on
    python scripts/train_hil.py output=outputs/hil_rlpd hil.learner.name=rlpd  # vlarl's chunked RLPD as learner
    python scripts/train_hil.py env.franky.ip=<FCI address> env.franky.realtime=enforce \\
        hil.interventions.device=keyboard hil.reward.source=operator_key     # a real arm, a human operator

Keys: ``env.*`` = robots.reach_task.FrankaReachConfig, ``hil.*`` = vlarl.hil.config.HILConfig; ``policy_dir``
starts from a saved policy (else a fresh MLP with ``chunk_size`` / ``init_log_std``, tanh-squashed for ``sac`` /
``rlpd``). Bad input: one line, exit 2, nothing written.

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

from robots.reach_task import FrankaReachConfig
from vlarl.hil.config import HILConfig

SQUASHED_LEARNERS = ("sac", "rlpd")  # their actor is tanh-squashed (SAC's log-prob of a bounded action)


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


def prologue() -> None:
    """What every robot-learning script does first: one torch thread, INFO logs, the safety layer's per-clamp
    lines off (clamps are counted per episode instead)."""
    import torch

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("robots.safety").setLevel(logging.ERROR)


def load_config(argv: list[str]) -> TrainHILConfig:
    """``key=value`` arguments over the defaults (franky at 127.0.0.1, the env's own resets off: the loop resets
    it); every learner and operator key checked before anything is written (ValueError, one line)."""
    from omegaconf import OmegaConf

    from vlarl.hil.learner import algorithm_config

    base = OmegaConf.structured(TrainHILConfig)
    base.env.franky.ip, base.env.franky.realtime, base.env.auto_reset = "127.0.0.1", "ignore", False
    bad = [a for a in argv if "=" not in a]
    if bad:
        raise ValueError(f"argument '{bad[0]}' must look like key=value (e.g. hil.episodes=100)")
    try:
        cfg = OmegaConf.to_object(OmegaConf.merge(base, OmegaConf.from_dotlist(argv)))
    except Exception as exc:
        raise ValueError(f"invalid configuration: {str(exc).splitlines()[0]}") from exc
    if cfg.env.auto_reset:
        raise ValueError("env.auto_reset=true: the learning loop resets the env itself (a seed per episode); "
                         "leave env.auto_reset=false")
    cfg.hil.interventions.validate()
    algorithm_config(cfg.hil.learner)
    return cfg


def initial_policy(cfg: TrainHILConfig, env: Any) -> str:
    """``policy_dir``, or a fresh MLP policy for the env saved beside the run (``<output>/initial_policy``)."""
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


def load_critic(path: str) -> Any:
    """The VLM process-reward critic's ``score`` (``hil.reward.source=critic``)."""
    from policies.critics.base import Critic

    return Critic.from_pretrained(path).eval().score


def operator_stop(cfg: TrainHILConfig) -> Any:
    """The env's operator stop: stdin lines, or (keyboard device, which owns stdin) only its ``x`` key."""
    import io

    from robots.safety import OperatorStop

    if not cfg.operator_stop:
        return None
    return OperatorStop(io.StringIO() if cfg.hil.interventions.device == "keyboard" else None)


def main(argv: list[str] | None = None) -> int:
    """``scripts/train_hil.py``: 0 when the run ended (budget, robot time or an operator stop), 2 on bad input."""
    from robots.franky_driver import RobotLinkError
    from robots.reach_task import FrankaReachEnv
    from vlarl.hil.episodes import lerobot_writer
    from vlarl.hil.runner import check_output, run

    prologue()
    try:
        cfg = load_config(list(sys.argv[1:] if argv is None else argv))
        check_output(cfg.output, cfg.resume)
        if cfg.policy_dir:  # a learner that cannot train it (e.g. sac/rlpd and an unsquashed policy): one line
            from policies.base import Policy
            from vlarl.hil.learner import RobotLearner

            RobotLearner(Policy.from_pretrained(cfg.policy_dir), cfg.hil.learner)
        critic = load_critic(cfg.hil.reward.critic_path) if cfg.hil.reward.source == "critic" else None
        env = FrankaReachEnv(cfg.env, operator_stop=operator_stop(cfg))
    except (ValueError, OSError, RobotLinkError, ImportError) as exc:
        print(f"train_hil: error: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    try:
        rows = run(cfg.hil, env, initial_policy(cfg, env), cfg.output,
                   lerobot_writer(int(cfg.env.policy_hz), cfg.video_codec), resume=cfg.resume, critic=critic)
    finally:
        env.close()
    evals = [(r["episode"], r["robot_minutes"], r["eval/success"]) for r in rows if "eval/success" in r]
    print("episode  robot_min  heldout_success")
    for e, m, s in evals:
        print(f"{e:7d}  {m:9.2f}  {s:15.2f}")
    if rows and rows[-1].get("fault") == "operator stop":
        print(f"stopped by the operator after episode {rows[-1]['episode']}; resume=true goes on")
    return 0
