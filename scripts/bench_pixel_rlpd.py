"""Where a pixel RLPD update's time goes: the cost of one critic step (with its share of actor steps) for variants
of the PushCube-RGB recipe (configs/experiment/pushcube_rgb_rlpd.yaml), side by side in one process.

Each variant builds the recipe's CNN actor and SAC state (``vlarl.algorithms.sac``) on a replay of random frames
and states of the RGB env's shapes, takes a few warm-up steps, then times ``sac_steps`` (critic steps, an actor step
every ``actor_every``). Variants are timed in interleaved rounds and each reports its fastest round, so a burst of
load from other processes on a shared machine hits every variant alike. Frames' content does not change the cost.

    python scripts/bench_pixel_rlpd.py                       # all variants, 2 rounds of 12 critic steps
    python scripts/bench_pixel_rlpd.py --steps 10 --rounds 3 --only current,recipe   # the recipe: shared, 48 px, light
                                                                            # CNN, batch 64, shift 4

Columns: CPU ms per critic step (amortized actor step included; the wall ms in brackets), parameters trained, and the seconds of updates per
1,000 env steps at UTD 8 / 4 / 2 with chunks of 4 (UTD u = u critic steps per chunk transition = u / 4 per env step).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field, replace

import torch

from policies.base import PolicySpec
from policies.cnn.modeling import CNNPolicy, CNNPolicyConfig
from vlarl.algorithms.sac import RLPDConfig, SACState, sac_steps

CAM = "base_camera"
STATE_DIM, ACTION_DIM, CHUNK = 25, 4, 4  # PushCube-v1 obs_mode=rgb state, pd_ee_delta_pos (+ gripper), the chunk

#: the recipe as configs/experiment/pushcube_rgb_rlpd.yaml had it before this bench (configs/policy/cnn.yaml)
RECIPE_POLICY = CNNPolicyConfig(image_size=64, cnn_channels=[32, 64, 64], vision_dim=256, hidden_sizes=[256, 256],
                                chunk_size=CHUNK, squash=True)
RECIPE_ALG = RLPDConfig(batch_size=128, utd_ratio=8.0, actor_every=2, init_alpha=0.01, critic_loss="hl_gauss",
                        critic_hidden_sizes=[64, 64], demo_ratio=0.0, learning_starts=0, buffer_size=4096)


@dataclass
class Variant:
    name: str
    policy: dict = field(default_factory=dict)  # CNNPolicyConfig overrides
    alg: dict = field(default_factory=dict)  # RLPDConfig overrides
    channels_last: bool = False


SHARED = {"critic_shares_encoder": True}
VARIANTS = [
    Variant("current"),
    Variant("shared", SHARED),
    Variant("shared, 2 critics", SHARED, {"num_critics": 2}),
    Variant("shared, batch 64", SHARED, {"batch_size": 64}),
    Variant("shared, 48 px", {**SHARED, "image_size": 48}),
    Variant("shared, light CNN", {**SHARED, "cnn_channels": [16, 32, 32], "vision_dim": 128}),
    Variant("shared, shift 4", SHARED, {"image_shift": 4}),
    Variant("shared, channels-last", SHARED, channels_last=True),
    Variant("current, shift 4", {}, {"image_shift": 4}),
    Variant("shared, 48 px, light CNN", {**SHARED, "image_size": 48, "cnn_channels": [16, 32, 32], "vision_dim": 128}),
    Variant("shared, 48 px, light CNN, batch 64", {**SHARED, "image_size": 48, "cnn_channels": [16, 32, 32],
                                                   "vision_dim": 128}, {"batch_size": 64}),
    Variant("recipe", {**SHARED, "image_size": 48,
            "cnn_channels": [16, 32, 32], "vision_dim": 128}, {"batch_size": 64, "image_shift": 4}),
]


def build(v: Variant, rows: int, seed: int = 0) -> tuple[CNNPolicy, torch.optim.Optimizer, SACState, RLPDConfig]:
    """The variant's policy, actor optimizer, SAC state with ``rows`` random transitions in its replay, config."""
    torch.manual_seed(seed)
    pcfg = replace(RECIPE_POLICY, **v.policy)
    acfg = replace(RECIPE_ALG, **v.alg)
    S = pcfg.image_size
    spec = PolicySpec(state_dim=STATE_DIM, action_dim=ACTION_DIM, action_low=[-1.0] * ACTION_DIM,
                      action_high=[1.0] * ACTION_DIM, image_keys=[CAM], image_size=[S, S],
                      instruction="push the cube to the goal")
    policy = CNNPolicy(pcfg, spec)
    st = SACState(policy, acfg, spec)
    if v.channels_last:
        for m in (policy, st.encoder, st.encoder_target):
            m.to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(policy.parameters(), lr=acfg.lr, foreach=True)
    from tensordict import TensorDict

    frames = lambda: torch.randint(0, 256, (rows, S, S, 3), dtype=torch.uint8)  # noqa: E731
    st.replay.online.extend(TensorDict({
        "state": torch.randn(rows, STATE_DIM), "next_state": torch.randn(rows, STATE_DIM),
        "actions": torch.rand(rows, CHUNK, ACTION_DIM) * 2 - 1, "step_rewards": torch.zeros(rows, CHUNK),
        "step_mask": torch.ones(rows, CHUNK, dtype=torch.bool), "terminated": torch.zeros(rows, dtype=torch.bool),
        "truncated": torch.zeros(rows, dtype=torch.bool),
        "images": TensorDict({CAM: frames()}, batch_size=[rows]),
        "next_images": TensorDict({CAM: frames()}, batch_size=[rows])}, batch_size=[rows]))
    return policy, optimizer, st, acfg


def trained_parameters(policy: CNNPolicy, st: SACState) -> int:
    seen = {id(p): p for p in [*policy.parameters(), *st.q_params] if p.requires_grad}
    return sum(p.numel() for p in seen.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="critic steps timed per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    chosen = [v for v in VARIANTS if not args.only or v.name in args.only.split(",")]
    built = {v.name: build(v, rows=1024) for v in chosen}
    best: dict[str, float] = {}
    walls: dict[str, float] = {}
    for _ in range(args.rounds):
        for v in chosen:
            policy, opt, st, cfg = built[v.name]
            sac_steps(policy, opt, st, cfg, 2)  # warm-up (allocator, first-call paths)
            t0, c0 = time.perf_counter(), time.process_time()
            sac_steps(policy, opt, st, cfg, args.steps)
            dt, wall = (time.process_time() - c0) / args.steps, (time.perf_counter() - t0) / args.steps
            if dt < best.get(v.name, float("inf")):
                best[v.name], walls[v.name] = dt, wall
    load = os.getloadavg()[0]
    print(f"pixel RLPD update cost, 1 torch thread, load average {load:.1f}, best of {args.rounds} rounds of "
          f"{args.steps} critic steps (actor every 2); CPU time of this process (wall time in brackets: other "
          f"processes' load)")
    print("| variant | ms / critic step | x current | trained params | update s / 1k env steps at UTD 8 / 4 / 2 |")
    print("|---|---|---|---|---|")
    base = best.get("current")
    for v in chosen:
        dt = best[v.name]
        per_k = [1000 * u / CHUNK * dt for u in (8, 4, 2)]
        ratio = f"{dt / base:.2f}" if base else "-"
        print(f"| {v.name} | {dt * 1000:.0f} ({walls[v.name] * 1000:.0f}) | {ratio} | {trained_parameters(*built[v.name][::2]) / 1e3:.0f}k | "
              + " / ".join(f"{s:.0f}" for s in per_k) + " |")


if __name__ == "__main__":
    main()
