"""Pixel SAC (``algorithm=sac policy=cnn policy.squash=true``): a contextual bandit whose context is only an image's
colour, learned through ``sac_update``; image transitions surviving ``SACState.state_dict``; the one-line refusals
(replay image memory); and two iterations of ``vlarl-train`` on RGB PushCube."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from policies.base import PolicySpec
from policies.cnn.modeling import CNNPolicy, CNNPolicyConfig
from tests.helpers.recipes import PPO
from vlarl.algorithms.sac import SACState, actor_problem, sac_update
from vlarl.config.construct import check_policy
from vlarl.config.schema import RLPDConfig, SACConfig
from vlarl.data.trajectory import Trajectory

torch.set_num_threads(1)

T, A, D, B, S = 2, 1, 2, 32, 16
CAM = "base_camera"
SPEC = PolicySpec(state_dim=D, action_dim=A, action_low=[-1.0] * A, action_high=[1.0] * A, image_keys=[CAM],
                  image_size=[S, S], instruction="push the cube")
TINY = CNNPolicyConfig(image_size=S, cnn_channels=[8], vision_dim=16, text_encoder="none", normalize_state=False,
                       hidden_sizes=[32, 32], chunk_size=T, squash=True)
SMALL = SACConfig(num_steps=1, batch_size=64, buffer_size=4096, learning_starts=64, utd_ratio=1.0,
                  critic_hidden_sizes=[32, 32],
                  gamma=0.9, tau=0.05, lr=3e-3, q_lr=3e-3, alpha_lr=3e-3, init_alpha=0.01, max_grad_norm=0.0)


def colour_images(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` solid images uint8 [n, S, S, 3] of random red / blue mixes (a little pixel noise) and their sign:
    +1 where red outweighs blue, -1 else (mixes closer than 0.2 are not drawn)."""
    red = torch.rand(n, generator=g)
    blue = torch.where(torch.rand(n, generator=g) < 0.5, red + 0.2 + 0.3 * torch.rand(n, generator=g),
                       red - 0.2 - 0.3 * torch.rand(n, generator=g)).clamp(0, 1)
    blue = torch.where((red - blue).abs() < 0.2, 1 - red, blue)
    rgb = torch.stack([red, torch.full_like(red, 0.5), blue], -1)  # [n, 3]
    img = rgb[:, None, None, :] * 255 + torch.randn(n, S, S, 3, generator=g) * 8
    return img.clamp(0, 255).to(torch.uint8), torch.sign(red - blue)


def bandit_traj(policy, g: torch.Generator) -> Trajectory:
    """One chunk step of B envs whose state is all zeros: every action of the chunk earns
    ``1 - (a - sign / 2)^2`` and the episode ends (the best chunk is +0.5 on red images, -0.5 on blue ones)."""
    images, sign = colour_images(B, g)
    state = torch.zeros(B, D)
    sample = policy.sample({"state": state, "images": {CAM: images}, "instruction": []})
    rewards = 1 - (sample.actions[..., 0] - sign[:, None] / 2) ** 2  # [B, T]
    z = torch.zeros(1, B)
    return Trajectory(
        obs={"state": state[None], "images": {CAM: images[None]}, "instruction": []},
        replay={k: v[None] for k, v in sample.replay.items()}, logprob=sample.logprob[None], values=z,
        rewards=rewards.sum(-1)[None], dones=torch.ones(1, B), truncated=z, final_values=z,
        next_value=torch.zeros(B),
        step_rewards=rewards[None], step_mask=torch.ones(1, B, T, dtype=torch.bool), next_state=state[None],
        next_images={CAM: images[None]})


def right_sign_fraction(policy, g: torch.Generator, n: int = 200) -> float:
    images, sign = colour_images(n, g)
    actions = policy.act({"state": torch.zeros(n, D), "images": {CAM: images}, "instruction": []})[..., 0]
    return float((torch.sign(actions) == sign[:, None]).all(-1).float().mean())


def test_pixel_sac_learns_a_bandit_whose_context_is_the_image_colour():
    torch.manual_seed(0)
    policy = CNNPolicy(TINY, SPEC)
    st = SACState(policy, SMALL, SPEC)
    assert st.cameras == [CAM] and st.q.shape()["in_dim"] == 16 + D + T * A  # features of image and state, chunk
    opt = torch.optim.Adam(policy.parameters(), lr=SMALL.lr)
    g = torch.Generator().manual_seed(0)
    before = right_sign_fraction(policy, torch.Generator().manual_seed(1))
    encoder = [p.detach().clone() for p in st.encoder.parameters()]
    for _ in range(15):
        metrics = sac_update(policy, opt, bandit_traj(policy, g), SMALL, g, state=st)
    assert metrics["critic_steps"] == B and math.isfinite(metrics["critic_loss"])
    after = right_sign_fraction(policy, torch.Generator().manual_seed(1))
    assert after >= 0.9 > before, (before, after)
    # the critic's own encoder was trained by the critic loss; its target copy trails it
    assert any(not torch.equal(a, b) for a, b in zip(encoder, st.encoder.parameters(), strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(st.encoder.parameters(), st.encoder_target.parameters(),
                                                     strict=True))
    assert 1.4 < metrics["q"] < 2.0  # a best chunk is worth 1 + gamma = 1.9


def test_image_transitions_survive_the_state_dict():
    torch.manual_seed(0)
    cfg = replace(SMALL, learning_starts=10_000)  # fill only
    policy = CNNPolicy(TINY, SPEC)
    st = SACState(policy, cfg, SPEC)
    g = torch.Generator().manual_seed(0)
    trajs = [bandit_traj(policy, g) for _ in range(2)]
    for traj in trajs:
        sac_update(policy, torch.optim.Adam(policy.parameters()), traj, cfg, state=st)
    buf = io.BytesIO()
    torch.save(st.state_dict(), buf)  # as the actor writes algorithm_state.pt
    buf.seek(0)
    again = SACState(CNNPolicy(TINY, SPEC), cfg, SPEC)
    again.load_state_dict(torch.load(buf, weights_only=False))
    a, b = st.replay.online.buffer.storage[:2 * B], again.replay.online.buffer.storage[:2 * B]
    assert len(again.replay) == 2 * B
    assert b["images", CAM].dtype == torch.uint8 and b["images", CAM].shape == (2 * B, S, S, 3)
    assert torch.equal(b["images", CAM], torch.cat([t.obs["images"][CAM][0] for t in trajs]))
    assert torch.equal(b["next_images", CAM], a["next_images", CAM])
    assert all(torch.equal(a[k], b[k]) for k in ("state", "actions", "step_rewards", "next_state"))
    assert all(torch.equal(x, y) for x, y in zip(st.encoder_target.state_dict().values(),
                                                 again.encoder_target.state_dict().values(), strict=True))


def test_pixel_refusals_are_one_line():
    env = SimpleNamespace(name="maniskill", obs_mode="rgb", image_size=128, task="PushCube-v1")  # configs/env/maniskill_pushcube_rgb
    cnn = replace(TINY, squash=True)
    # 200k transitions x 2 x 128 x 128 x 3 bytes = 18.3 GiB
    msg = check_policy(cnn, env, SACConfig())
    assert msg is not None and "\n" not in msg
    assert "algorithm.buffer_size=200000" in msg and "lower algorithm.buffer_size to at most 43690" in msg
    assert check_policy(cnn, env, replace(SACConfig(), buffer_size=20_000)) is None
    # demonstrations made from an RGB env hold its frames; state-only ones are refused in
    # tests/algorithms/test_pixel_demos.py (with a real file of each)
    assert check_policy(cnn, env, replace(RLPDConfig(), buffer_size=20_000, demos="auto")) is None
    msg = actor_problem(CNNPolicy(replace(TINY, squash=False), SPEC), SACConfig())
    assert "which policy=cnn has switched off: set policy.squash=true" in msg and "\n" not in msg


BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.sim
def test_pixel_sac_trains_on_rgb_pushcube(tmp_path):
    """Two iterations of ``vlarl-train algorithm=sac policy=cnn policy.squash=true`` on RGB PushCube: critic
    steps happen with finite losses and the checkpoint's replay holds the camera images."""
    run_dir = tmp_path / "run"
    cmd = [str(BIN / "vlarl-train"), PPO, "algorithm=sac", "policy=cnn", "policy.squash=true", "env=maniskill_pushcube_rgb",
           "env.num_envs=4", "env.num_workers=1", "env.image_size=64", "policy.image_size=64",
           "policy.cnn_channels=[8,16]", "policy.vision_dim=32", "policy.hidden_sizes=[64,64]",
           "algorithm.num_steps=2", "algorithm.learning_starts=8", "algorithm.utd_ratio=1", "algorithm.batch_size=16",
           "algorithm.buffer_size=1000", "algorithm.critic_hidden_sizes=[64,64]", "total_env_steps=16",
           "eval.episodes=2", "eval.num_envs=2", "eval.every_iterations=0", "eval.video_episodes=0",
           "time_limit_minutes=0",
           "logger.progress_bar=false", f"run_dir={run_dir}"]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
                       env={**os.environ, "RAY_DEDUP_LOGS": "0"}, cwd=ROOT)
    assert p.returncode == 0, f"{cmd} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    print(f"vlarl-train pixel SAC: {time.time() - t0:.0f} s")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/critic_steps" in r]
    assert [r["train/critic_steps"] for r in train] == [8.0, 8.0]  # utd_ratio 1 x 4 envs x 2 chunk steps
    assert all(math.isfinite(r["train/critic_loss"]) and math.isfinite(r["train/actor_loss"]) for r in train)
    state = torch.load(run_dir / "checkpoints" / "latest" / "algorithm_state.pt", weights_only=False)
    rows = state["replay"]["online"]["rows"]
    images, next_images = rows["images"][CAM], rows["next_images"][CAM]
    assert images.shape == next_images.shape == (16, 64, 64, 3) and images.dtype == torch.uint8
    assert images.float().std() > 0 and "encoder" in state and "encoder_target" in state
