"""What each algorithm knob costs in the update: one PPO/GRPO update on the same synthetic rollout
of an MLP chunk policy, timed side by side in one run, as a ratio to the default PPO update.

    python scripts/bench_algorithms.py [--steps 50 --envs 16 --chunk 4 --repeats 3]

KL and decoupled PPO each add a no-grad forward pass of a policy over the batch (reference /
proximal log-probs); the rest are elementwise and should cost ~nothing.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from policies.base import PolicySpec
from policies.mlp import MLPPolicyConfig
from policies.registry import make_policy
from vlarl.algorithms.registry import algorithm_spec
from vlarl.config.schema import GRPOConfig, PPOConfig
from vlarl.data.trajectory import Trajectory


def rollout(policy, N: int, B: int, D: int, g: torch.Generator) -> Trajectory:
    states = torch.randn(N, B, D, generator=g)
    samples = [policy.sample({"state": states[t], "images": {}, "instruction": []}) for t in range(N)]
    T = samples[0].actions.shape[1]
    dones = (torch.rand(N, B, generator=g) < 0.05).float()
    dones[-1] = 1.0
    ep = torch.where(dones.bool(), (torch.rand(N, B, generator=g) < 0.3).float(), torch.full((N, B), float("nan")))
    return Trajectory(
        obs={"state": states, "images": {}, "instruction": []},
        replay={"actions": torch.stack([s.replay["actions"] for s in samples])},
        logprob=torch.stack([s.logprob for s in samples]), values=torch.stack([s.value for s in samples]),
        rewards=torch.randn(N, B, generator=g), dones=dones, truncated=torch.zeros(N, B),
        final_values=torch.zeros(N, B), next_value=torch.zeros(B),
        step_mask=torch.ones(N, B, T, dtype=torch.bool), step_rewards=torch.randn(N, B, T, generator=g),
        episode_success=ep, episode_return=ep, policy_version=torch.zeros(N, B),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--envs", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    D, A = 25, 8
    spec = PolicySpec(state_dim=D, action_dim=A, action_low=[-1.0] * A, action_high=[1.0] * A)
    pcfg = MLPPolicyConfig(hidden_sizes=[256, 256, 256], chunk_size=args.chunk)
    torch.manual_seed(0)
    traj = rollout(make_policy(pcfg, spec), args.steps, args.envs, D, torch.Generator().manual_seed(0))
    ppo = PPOConfig(target_kl=0.0)
    variants = {
        "ppo (default)": ppo,
        "ppo logprob_level=token": replace(ppo, logprob_level="token"),
        "ppo dual_clip=3": replace(ppo, dual_clip=3.0),
        "ppo value_loss=huber, value_clip=0.2": replace(ppo, value_loss="huber", value_clip=0.2),
        "ppo loss_agg_mode=traj-mean": replace(ppo, loss_agg_mode="traj-mean"),
        "ppo kl_coef=0.1 (reference forward)": replace(ppo, kl_coef=0.1),
        "ppo decoupled (proximal forward)": replace(ppo, decoupled=True),
        "grpo group_size=4": GRPOConfig(group_size=4, target_kl=0.0),
    }
    rows = []
    for name, cfg in variants.items():
        times = []
        for _ in range(args.repeats):
            torch.manual_seed(0)
            pol = make_policy(pcfg, spec)
            ref = make_policy(pcfg, spec).requires_grad_(False) if cfg.kl_coef > 0 else None
            opt = torch.optim.Adam(pol.parameters(), lr=cfg.lr, eps=1e-5)
            t0 = time.perf_counter()
            algorithm_spec(cfg.name).update(pol, opt, traj, cfg, torch.Generator().manual_seed(0), reference=ref)
            times.append(time.perf_counter() - t0)
        rows.append((name, min(times)))
    base = rows[0][1]
    print(f"update on {args.steps} x {args.envs} chunk steps, chunk {args.chunk}, MLP 3x256, 1 thread, "
          f"best of {args.repeats}")
    print(f"{'variant':42s} {'seconds':>9s} {'x default':>10s}")
    for name, t in rows:
        print(f"{name:42s} {t:9.3f} {t / base:10.2f}")


if __name__ == "__main__":
    main()
