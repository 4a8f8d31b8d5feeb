"""OpenVLA-OFT's continuous L1 head as SAC's actor (``policy=openvla_oft policy.squash=true``): the squashed
log-prob is torch's tanh + affine transformed Gaussian, gradients reach the head, squash=false is the PPO Gaussian
as before, an image bandit learned through the real ActorWorker with ``algorithm=sac``, the save / load round trip,
and the one-line refusals. Tiny OFT built here (random weights, nothing downloaded)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

from policies import Policy, make_policy
from policies.ar_vla import OpenVLAOFTPolicyConfig
from policies.ar_vla.openvla_policy import OpenVLAPolicy
from tests.algorithms.test_sac_pixels import CAM, SPEC, D, S, T, bandit_traj, colour_images
from tests.helpers.recipes import PPO
from vlarl.algorithms.sac import actor_problem
from vlarl.config.construct import check_policy
from vlarl.config.schema import SACConfig
from vlarl.workers.actor_worker import ActorWorker

torch.set_num_threads(1)

SQUASHED = OpenVLAOFTPolicyConfig(action_head="l1", chunk_size=2, squash=True)
# the bandit's actor: the critics' own encoder sized for its 16 px frames (policies/cnn's CNNCriticEncoder)
BANDIT = replace(SQUASHED, chunk_size=T, critic_cnn={"image_size": S, "cnn_channels": [8], "vision_dim": 16,
                                                     "text_encoder": "none"})
BANDIT_SAC = SACConfig(num_steps=1, batch_size=64, buffer_size=4096, learning_starts=64, utd_ratio=0.5,
                       critic_hidden_sizes=[32, 32], gamma=0.9, tau=0.05, lr=1e-3, q_lr=3e-3, alpha_lr=3e-3,
                       init_alpha=0.01, max_grad_norm=0.0)
RGB_ENV = SimpleNamespace(name="maniskill", obs_mode="rgb", image_size=64, task="PushCube-v1")


def _oft(spec, **kw) -> OpenVLAPolicy:
    torch.manual_seed(0)
    return make_policy(replace(SQUASHED, **kw), spec)


def test_log_prob_is_the_tanh_affine_transformed_gaussians(vla_spec, obs):
    pol = _oft(vla_spec)
    pol.stat_mask[2] = False  # a dim the statistics leave as predicted (OFT's gripper): tanh, no affine map
    with torch.no_grad():
        mean = pol._forward(obs, None)[0]
    low, high = torch.tensor([-1.0, -2.0, -1.0]), torch.tensor([1.0, 2.0, 1.0])
    ref = TransformedDistribution(Normal(mean.double(), pol.log_std.exp().double().detach()),
                                  [TanhTransform(), AffineTransform((low + high).double() / 2, (high - low).double() / 2)])
    actions, logp = pol.rsample(obs)
    assert actions.shape == logp.shape == (3, 2, 3)
    torch.testing.assert_close(logp.double(), ref.log_prob(actions.double()), atol=1e-4, rtol=0)
    s = pol.sample(obs)  # the rollout's sample keeps its pre-tanh Gaussian draw, which evaluate re-scores
    assert set(s.replay) == {"actions", "pre_tanh"} and torch.equal(s.replay["actions"], s.actions)
    assert (s.actions > low).all() and (s.actions < high).all()
    torch.testing.assert_close(s.logprob.double(), ref.log_prob(s.actions.double()), atol=1e-4, rtol=0)
    torch.testing.assert_close(pol.evaluate(obs, s.replay)[0], s.logprob, atol=1e-6, rtol=0)
    torch.testing.assert_close(pol.act(obs), (low + high) / 2 + (high - low) / 2 * torch.tanh(mean))  # squashed mean


def test_rsample_gradients_reach_the_l1_head_and_the_backbone(vla_spec, obs):
    pol = _oft(vla_spec)
    actions, logp = pol.rsample(obs)
    (actions.sum() + logp.sum()).backward()
    grads = {n for n, p in pol.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert "log_std" in grads and any(n.startswith("model.action_head.") for n in grads)
    assert any(n.startswith("model.language_model.model.layers.") for n in grads)
    assert any(n.startswith("model.proprio_projector.") for n in grads)


def test_squash_false_is_the_ppo_gaussian_as_before(vla_spec, obs):
    """squash=false: the same weights as squash=true (the flag adds none and draws no random numbers) and the
    unsquashed Gaussian's outputs, by hand from its L1 mean: sample clipped to [-1, 1] then un-normalized,
    Normal log-probs, ``normalized_actions`` replayed, ``act`` the un-normalized mean (checked bitwise against
    the code before the squashed actor existed when it was added)."""
    plain, squashed = _oft(vla_spec, squash=False), _oft(vla_spec)
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), squashed.state_dict().values(),
                                                 strict=True))
    with torch.no_grad():
        mean, value = plain._forward(obs, None)
    std = plain.log_std.detach().exp()
    torch.manual_seed(7)
    x = mean + std * torch.randn_like(mean)
    torch.manual_seed(7)
    s = plain.sample(obs)
    assert set(s.replay) == {"normalized_actions"} and torch.equal(s.replay["normalized_actions"], x)
    assert torch.equal(s.actions, plain.stats.unnormalize(x.clamp(-1, 1)))
    assert torch.equal(s.logprob, Normal(mean, std).log_prob(x)) and torch.equal(s.value, value)
    lp, ent, _ = plain.evaluate(obs, s.replay)
    assert torch.equal(lp.detach(), s.logprob) and torch.equal(ent.detach(), Normal(mean, std).entropy())
    assert torch.equal(plain.act(obs), plain.stats.unnormalize(mean.clamp(-1, 1)))


@pytest.mark.heavy
def test_sac_through_the_actor_worker_learns_an_image_bandit():
    """``algorithm=sac`` with the squashed tiny OFT on the pixel SAC bandit (tests/algorithms/test_sac_pixels: the
    best chunk is +0.5 on reddish frames, -0.5 on bluish ones, only the image tells which). The backbone is NOT
    frozen: its weights are random, so its 8-wide hidden states carry little of the colour; with
    ``freeze_vlm=true`` (the L1 head, proprio projector and log std train: 386 weights) the same budget ends at the
    best constant chunk (reward 0.77, right sign 0.50, seed 0). Trained end to end, over seeds 0, 1, 2 (10
    iterations): ``act``'s mean reward 0.53 / 0.24 / 0.55 -> 0.955 / 0.950 / 0.971, right sign 1.0 on all three
    (the best constant chunk scores 0.75); ~15 s of one core."""
    actor = ActorWorker(BANDIT, BANDIT_SAC, SPEC, seed=0)
    policy, st = actor.policy, actor.alg_state
    # the critics own a fresh CNN over the model's camera: image features, raw state and the chunk
    assert st.cameras == [CAM] and st.q.shape()["in_dim"] == 16 + D + T * 1
    assert not {id(p) for p in st.encoder.parameters()} & {id(p) for p in policy.parameters()}
    backbone = [p.detach().clone() for p in policy.model.language_model.parameters()]

    def score() -> tuple[float, float]:
        images, sign = colour_images(200, torch.Generator().manual_seed(1))
        a = policy.act({"state": torch.zeros(200, D), "images": {CAM: images}, "instruction": []})[..., 0]
        return float((1 - (a - sign[:, None] / 2) ** 2).mean()), float((torch.sign(a) == sign[:, None]).all(-1)
                                                                        .float().mean())

    start, _ = score()
    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        metrics = actor.train(bandit_traj(policy, g))
    end, right_sign = score()
    assert metrics["critic_steps"] == 16 and torch.isfinite(torch.tensor(metrics["actor_loss"]))
    assert end > 0.85 and end > start + 0.3 and right_sign >= 0.9, (start, end, right_sign)
    assert any(not torch.equal(a, b) for a, b in zip(backbone, policy.model.language_model.parameters(),
                                                     strict=True))


def test_save_and_load_keeps_the_squashed_actor(vla_spec, obs, tmp_path):
    pol = _oft(vla_spec, critic_cnn={"image_size": 32, "cnn_channels": [8, 16]})
    with torch.no_grad():
        pol.log_std.fill_(-0.3)
        pol.model.action_head.model.fc2.bias.fill_(0.7)  # a trained-looking head, so act is not near the centre
    pol.save_pretrained(tmp_path)
    again = Policy.from_pretrained(tmp_path)
    assert isinstance(again, OpenVLAPolicy) and again.squash and again.config.critic_cnn == pol.config.critic_cnn
    assert torch.equal(again.act(obs), pol.act(obs))
    assert actor_problem(again, replace(SACConfig(), buffer_size=1000)) is None


def test_sft_fits_the_squashed_chunk_that_act_returns(vla_spec, obs):
    """With ``squash`` ``act`` is the tanh of the head's mean mapped onto the action bounds; SFT's L1 is taken on
    that, so demonstrated actions near the bounds are acted near them after SFT (an L1 on the raw mean would fit
    the mean to the normalized action and act tanh of it: 0.72 where 0.9 was shown)."""
    pol = _oft(vla_spec)
    u = torch.tensor([0.9, -0.9, 0.6]).expand(3, 2, 3)  # normalized actions, two of them near the bounds
    pre = torch.atanh(u)
    shown = pol._squashed(Normal(pre, torch.ones(3)), pre)[0]  # the env-unit chunk act() gives for mean atanh(u)
    opt = torch.optim.Adam(pol.parameters(), lr=1e-3)
    for _ in range(150):
        opt.zero_grad()
        loss = pol.sft_loss(obs, shown)
        loss.backward()
        opt.step()
    width = pol.stat_high - pol.stat_low
    err = ((pol.act(obs) - shown).abs() / width).amax()
    assert loss.item() < 0.02 and err < 0.02, (loss.item(), err.item())
    assert torch.equal(pol.stats.normalize(shown).sign(), u.sign())  # the shown chunk is the u above, normalized


def test_refusals_are_one_line(vla_spec):
    msg = check_policy(replace(SQUASHED, action_head="tokens"), RGB_ENV, SACConfig())
    assert "\n" not in msg and "policy.squash=true needs the continuous L1 head" in msg
    assert "set policy=openvla_oft policy.action_head=l1, or policy.squash=false" in msg
    msg = actor_problem(_oft(vla_spec, squash=False), SACConfig())
    assert "\n" not in msg and "which policy=openvla_oft has switched off: set policy.squash=true" in msg
    msg = check_policy(replace(SQUASHED, critic_cnn={"imagesize": 32}), RGB_ENV, SACConfig())
    assert "\n" not in msg and "policy.critic_cnn has keys ['imagesize']" in msg
    assert check_policy(SQUASHED, RGB_ENV, replace(SACConfig(), buffer_size=20_000)) is None
    # pixel SAC's memory refusal covers it unchanged (200k x 2 x 64 x 64 x 3 bytes = 4.6 GiB)
    assert "lower algorithm.buffer_size" in check_policy(SQUASHED, RGB_ENV, SACConfig())
    # OpenVLA and the look-alike have no continuous head: squash is not one of their keys (Hydra names the valid ones)
    from vlarl.config.loader import ConfigError, load_train_config

    for family in ("openvla", "ar_vla"):
        with pytest.raises(ConfigError, match="unknown config key 'policy.squash'") as e:
            load_train_config([PPO, f"policy={family}", "policy.squash=true"])
        assert "\n" not in str(e.value)


@pytest.mark.slow
@pytest.mark.sim
def test_vlarl_train_sac_with_the_oft_actor_on_rgb_pushcube(tmp_path):
    """Two iterations of the documented command (docs/sac_vla_actors.md) at test size: critic and actor steps with
    finite losses, the replay keeps the camera frames, the checkpoint restores the squashed actor (63 s on the
    2-core machine)."""
    run_dir = tmp_path / "run"
    cmd = [str(Path(sys.executable).parent / "vlarl-train"), PPO, "algorithm=sac", "policy=openvla_oft",
           "policy.squash=true", "env=maniskill_pushcube_rgb", "env.num_envs=4", "env.num_workers=1",
           "env.image_size=64", "policy.critic_cnn.cnn_channels=[8,16]", "policy.critic_cnn.vision_dim=32",
           "algorithm.num_steps=2", "algorithm.learning_starts=8", "algorithm.utd_ratio=1", "algorithm.batch_size=16",
           "algorithm.buffer_size=1000", "algorithm.critic_hidden_sizes=[64,64]", "total_env_steps=64",
           "eval.episodes=2", "eval.num_envs=2", "eval.every_iterations=0", "eval.video_episodes=0",
           "time_limit_minutes=0", "logger.progress_bar=false", f"run_dir={run_dir}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
                       env={**os.environ, "RAY_DEDUP_LOGS": "0"}, cwd=Path(__file__).resolve().parents[2])
    assert p.returncode == 0, f"{cmd} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/critic_steps" in r]
    assert [r["train/critic_steps"] for r in train] == [8.0, 8.0]  # utd_ratio 1 x 4 envs x 2 chunk steps
    assert all(math.isfinite(r["train/critic_loss"]) and math.isfinite(r["train/actor_loss"]) for r in train)
    latest = run_dir / "checkpoints" / "latest"
    state = torch.load(latest / "algorithm_state.pt", weights_only=False)
    assert state["replay"]["online"]["rows"]["images"]["base_camera"].shape == (16, 64, 64, 3)
    restored = Policy.from_pretrained(latest)
    assert isinstance(restored, OpenVLAPolicy) and restored.squash
