"""Add the critics' privileged state to a demonstration file, for RLPD with critics on the scene state.

    python scripts/demo_critic_state.py --demos outputs/mt_oft/demos/trajectories.h5 \
        --out outputs/mt_oft/demos/with_critic_state.h5 -- experiment=multitask_oft_rlpd
    vlarl-train experiment=multitask_oft_rlpd env.critic_state=true algorithm.critic_obs=critic_state \
        algorithm.demos=outputs/mt_oft/demos/with_critic_state.h5 init_from=outputs/mt_oft/sft

The overrides after ``--`` are the training run's: its env config (tasks, instructions, control mode) decides the
critic vector's layout, so the file matches the run (``simulators.critic_state_replay``). Each episode is replayed
from its seed; one that replays differently is refused. Bad input: one line, exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demos", required=True, help="a ManiSkill .h5 of vlarl's recorders (traj_<i> attrs task, seed)")
    ap.add_argument("--out", required=True, help="the new file (with traj_<i>/critic_state)")
    args = ap.parse_args(own)
    from omegaconf import OmegaConf

    from simulators.base import EnvError
    from vlarl import system_env
    from vlarl.config.loader import ConfigError, compose_train_config

    if not Path(args.demos).is_file():
        print(f"demo_critic_state: error: --demos '{args.demos}' does not exist; pass a demonstration .h5", file=sys.stderr)
        return 2
    if Path(args.out).exists():
        print(f"demo_critic_state: error: --out '{args.out}' exists; name a new file", file=sys.stderr)
        return 2
    try:  # the env config alone: the run's demonstrations are what this makes
        env_cfg = OmegaConf.to_object(compose_train_config(overrides).env)
    except ConfigError as e:
        print(f"demo_critic_state: error: {e}", file=sys.stderr)
        return 2
    system_env.apply()
    from simulators.critic_state_replay import add_critic_state

    try:
        n = add_critic_state(args.demos, args.out, env_cfg)
    except EnvError as e:
        print(f"demo_critic_state: error: {e}", file=sys.stderr)
        return 2
    print(f"[critic-state] {n} episodes with critic states -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
