"""Time of one chunked SAC/RLPD update step on the CPU, side by side for the settings that decide it.

    python scripts/bench_sac_update.py                     # PushCube RLPD shapes: 10 critics, batch 128, UTD 8
    python scripts/bench_sac_update.py --threads 1 2 --critics 10 2

One critic step (plus an actor step every ``actor_every``) on a replay of random transitions shaped as
``experiment=pushcube_mlp_rlpd``'s (state 35, chunk 4 x 3 actions). Each setting is timed ``--repeats`` times,
interleaved, and the best is kept; the table gives ms per critic step, the seconds per 256-env-step iteration
(512 critic steps at UTD 8 with chunk 4) and the ratio to the first row.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def setting(critic_loss: str, num_critics: int, batch: int, actor_every: int = 2, hidden: int = 128):
    from tensordict import TensorDict

    from policies.base import PolicySpec
    from policies.mlp import MLPPolicy, MLPPolicyConfig
    from vlarl.algorithms.sac import SACState
    from vlarl.config.schema import RLPDConfig

    T, A, D, N = 4, 3, 35, 4096
    spec = PolicySpec(state_dim=D, action_dim=A, action_low=[-1.0] * A, action_high=[1.0] * A)
    torch.manual_seed(0)
    policy = MLPPolicy(MLPPolicyConfig(hidden_sizes=[256, 256], chunk_size=T, squash=True, activation="relu"), spec)
    cfg = RLPDConfig(batch_size=batch, critic_hidden_sizes=[hidden, hidden], actor_every=actor_every, learning_starts=0,
                     init_alpha=0.01, critic_loss=critic_loss, num_critics=num_critics, demos="", demo_ratio=0.0)
    state = SACState(policy, cfg, spec)
    state.replay.online.extend(TensorDict({
        "state": torch.randn(N, D), "actions": torch.rand(N, T, A) * 2 - 1, "step_rewards": torch.rand(N, T),
        "step_mask": torch.ones(N, T, dtype=torch.bool), "terminated": torch.zeros(N, dtype=torch.bool),
        "truncated": torch.zeros(N, dtype=torch.bool), "next_state": torch.randn(N, D)}, batch_size=[N]))
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-4, foreach=True)
    return policy, optimizer, state, cfg


def main(argv: list[str] | None = None) -> int:
    from vlarl.algorithms.sac import sac_steps

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--critic-loss", nargs="+", default=["mse", "hl_gauss"])
    p.add_argument("--critics", nargs="+", type=int, default=[10])
    p.add_argument("--threads", nargs="+", type=int, default=[1])
    p.add_argument("--batch", nargs="+", type=int, default=[128])
    p.add_argument("--actor-every", nargs="+", type=int, default=[2])
    p.add_argument("--hidden", nargs="+", type=int, default=[128], help="critic hidden width (two layers)")
    p.add_argument("--steps", type=int, default=128, help="critic steps per timing")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    rows = list(itertools.product(args.critic_loss, args.critics, args.batch, args.actor_every, args.hidden,
                                  args.threads))
    built = {key[:-1]: setting(*key[:-1]) for key in rows}
    best: dict[tuple, float] = {}
    for _ in range(args.repeats):
        for key in rows:
            torch.set_num_threads(key[-1])
            policy, optimizer, state, cfg = built[key[:-1]]
            sac_steps(policy, optimizer, state, cfg, 4)  # warm
            t = time.perf_counter()
            sac_steps(policy, optimizer, state, cfg, args.steps)
            ms = (time.perf_counter() - t) / args.steps * 1000
            best[key] = min(best.get(key, float("inf")), ms)
    first = best[rows[0]]
    print("| critic loss | critics | batch | actor every | critic width | torch threads | ms per critic step "
          "| s per 256-step iteration | vs first row |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in rows:
        print(f"| {' | '.join(str(k) for k in key)} | {best[key]:.2f} | {best[key] * 512 / 1000:.2f} "
              f"| {first / best[key]:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
