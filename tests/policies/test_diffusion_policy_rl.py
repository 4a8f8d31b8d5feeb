"""``policy=diffusion_policy`` as an RL policy: DPPO's chain likelihood, PPO on a chunk bandit, SFT, DSRL over it,
its own checkpoints, and a few PPO iterations through ``vlarl-train`` on ManiSkill PushCube (state)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from policies.base import Policy, PolicySpec
from policies.diffusion_policy.config import DiffusionPolicyConfig
from policies.registry import make_policy
from tests.helpers.chunk_bandit import one_step_trajectory
from tests.helpers.recipes import PPO
from tests.helpers.train_cli import vlarl_train
from vlarl.algorithms.ppo import ppo_update
from vlarl.config.schema import PPOConfig
from vlarl.data.trajectory import Trajectory

torch.set_num_threads(1)
D, A, T = 5, 2, 4
SPEC = PolicySpec(state_dim=D, action_dim=A, action_low=[-1.0] * A, action_high=[1.0] * A, instruction="push")
TARGET = torch.tensor([0.5, -0.4])
ARCH = dict(down_dims=[16, 32], n_groups=4, diffusion_step_embed_dim=16, num_inference_steps=5)
BIN = Path(sys.executable).parent


def _obs(state: torch.Tensor) -> dict:
    return {"state": state, "images": {}, "instruction": ["push"] * state.shape[0]}


def _policy(**kw) -> Policy:
    torch.manual_seed(0)
    kw = {"chunk_size": T, "robot_state_dim": 2, "arch": dict(ARCH), **kw}
    return make_policy(DiffusionPolicyConfig(**kw), SPEC)


def test_evaluate_rescores_the_sampled_chain_and_floors_the_std():
    pol = _policy(rl_steps=3, min_std=0.2)
    state = torch.randn(6, D)
    s = pol.sample(_obs(state))
    assert s.actions.shape == (6, T, A) and s.logprob.shape == (6, T, A) and s.value.shape == (6,)
    chain = s.replay["chain"]
    assert chain.shape == (6, 6, pol.net_config.horizon, A)  # K + 1 states of the whole horizon
    lp, ent, v = pol.evaluate(_obs(state), s.replay)
    assert torch.allclose(lp, s.logprob, atol=1e-4) and torch.allclose(v, s.value)
    # two deterministic steps, then three Gaussian ones whose std is at least the floor
    assert torch.equal(chain[:, 1], pol._step_gaussian(0, chain[:, 0], pol._cond(_obs(state))[0])[0])
    for k in range(2, 5):
        _, std = pol._step_gaussian(k, chain[:, k], pol._cond(_obs(state))[0])
        assert std.item() >= 0.2
    per_step = 0.5 + 0.5 * math.log(2 * math.pi)
    assert ent.sum().item() >= 6 * pol.net_config.horizon * A * 3 * (per_step + math.log(0.2)) - 1e-3


def test_a_camera_policy_in_training_mode_rescores_with_the_features_it_sampled_with():
    """Random crops are SFT's augmentation only: sample and evaluate (PPO's ratio) see the centre crop."""
    spec = PolicySpec(state_dim=D, action_dim=A, action_low=[-1.0] * A, action_high=[1.0] * A, image_keys=["cam"],
                      image_size=[72, 72])
    torch.manual_seed(0)
    pol = make_policy(DiffusionPolicyConfig(chunk_size=T, arch={**ARCH, "crop_shape": [64, 64],
                                                                "crop_is_random": True}), spec).train()
    g = torch.Generator().manual_seed(2)
    obs = {"state": torch.randn(3, D, generator=g), "instruction": ["push"] * 3,
           "images": {"cam": torch.randint(0, 256, (3, 72, 72, 3), generator=g, dtype=torch.uint8)}}
    s = pol.sample(obs)
    lp, _, _ = pol.evaluate(obs, s.replay)
    assert torch.allclose(lp, s.logprob, atol=1e-4)
    assert pol.net.diffusion.rgb_encoder.training  # the module's own mode is left as it was
    demo = torch.zeros(3, T, A)
    a, b = (pol.sft_loss(obs, demo, generator=torch.Generator().manual_seed(0)) for _ in range(2))
    assert not torch.equal(a, b)  # the crop is drawn anew: SFT augments


@pytest.mark.slow
def test_ppo_moves_the_policy_towards_the_rewarded_chunk():
    """20 PPO updates of 16 chunks (~1 min): one ratio per action (its denoising steps' log-probs summed)."""
    pol = _policy()
    opt = torch.optim.Adam([p for p in pol.parameters() if p.requires_grad], lr=1e-3)
    cfg = PPOConfig(update_epochs=4, num_minibatches=2, lr=1e-3, logprob_level="action", target_kl=0.0, gamma=0.0,
                    gae_lambda=0.0)
    g = torch.Generator().manual_seed(0)
    probe = torch.randn(16, D, generator=g)

    def score(actions: torch.Tensor) -> torch.Tensor:
        return -(actions - TARGET).abs().mean((1, 2))

    before = score(pol.act(_obs(probe))).mean().item()
    history = []
    for it in range(20):
        state = torch.randn(16, D, generator=g)
        s = pol.sample(_obs(state))
        r = score(s.actions)
        history.append(r.mean().item())
        traj = Trajectory(obs={"state": state[None], "images": {}, "instruction": ["push"]},
                          replay={k: v[None] for k, v in s.replay.items()}, logprob=s.logprob[None],
                          values=s.value[None], rewards=r[None], dones=torch.ones(1, 16), truncated=torch.zeros(1, 16),
                          final_values=torch.zeros(1, 16), next_value=torch.zeros(16))
        ppo_update(pol, opt, traj, cfg, generator=torch.Generator().manual_seed(it))
    after = score(pol.act(_obs(probe))).mean().item()
    assert sum(history[-3:]) / 3 > sum(history[:3]) / 3 + 0.1, history
    assert after > before + 0.15, (before, after)


def test_sft_loss_decreases_and_sft_moves_act_to_the_demonstrations():
    pol = _policy()
    g = torch.Generator().manual_seed(1)
    state = torch.randn(32, D, generator=g)
    demo = torch.tanh(state[:, :A, None].expand(-1, A, T).transpose(1, 2))  # the chunk a state asks for
    pol.update_normalization(_obs(state))
    err_before = (pol.act(_obs(state)) - demo).abs().mean().item()
    opt = torch.optim.Adam(pol.parameters(), lr=3e-3)
    losses = []
    for i in range(150):
        loss = pol.sft_loss(_obs(state), demo, generator=torch.Generator().manual_seed(i))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10, (losses[:3], losses[-3:])
    err = (pol.act(_obs(state)) - demo).abs().mean().item()
    assert err < 0.5 * err_before, (err_before, err)


def test_own_checkpoint_round_trips_with_running_statistics(tmp_path):
    pol = _policy(noise_scheduler_type="DDPM")
    state = 3 * torch.randn(20, D) + 2
    pol.update_normalization(_obs(state))
    assert not torch.allclose(pol.state_norm.mean, torch.zeros(D))
    frozen = _policy(freeze_state_norm=True)
    frozen.update_normalization(_obs(state))
    assert torch.equal(frozen.state_norm.mean, torch.zeros(D))
    pol.save_pretrained(tmp_path / "p")
    back = Policy.from_pretrained(tmp_path / "p")
    assert back.net_config.noise_scheduler_type == "DDPM" and back.config.chunk_size == T
    assert torch.equal(back.act(_obs(state)), pol.act(_obs(state)))


def test_bad_settings_are_one_line_refusals():
    for kw, match in ((dict(min_std=0.0), "min_std"), (dict(robot_state_dim=9), "robot_state_dim"),
                      (dict(arch={**ARCH, "nope": 1}), "nope"), (dict(noise_scheduler_type="PNDM"), "PNDM"),
                      (dict(arch={**ARCH, "horizon": 6}), "multiple of")):
        with pytest.raises(ValueError, match=match) as e:
            _policy(**kw)
        assert "\n" not in str(e.value)


def test_dsrl_steers_the_frozen_diffusion_policy(tmp_path):
    """``policy=noise_steering`` over a saved diffusion_policy, trained by DSRL through the ActorWorker on a chunk
    bandit: the noise actor moves, the base stays bit-identical, the decoded reward rises."""
    from dataclasses import replace

    from policies.diffusion import NoiseSteeringConfig
    from vlarl.config.schema import DSRLConfig
    from vlarl.workers.actor_worker import ActorWorker

    base = _policy()
    base.save_pretrained(tmp_path / "base")
    cfg = DSRLConfig(num_steps=1, batch_size=64, learning_starts=64, utd_ratio=0.5, critic_hidden_sizes=[32, 32],
                     gamma=0.9, tau=0.05, lr=3e-3, q_lr=3e-3, alpha_lr=3e-3, init_alpha=0.01, max_grad_norm=0.0)
    actor = ActorWorker(NoiseSteeringConfig(base_path=str(tmp_path / "base"), hidden_sizes=[32, 32]),
                        replace(cfg, critic_input="noise"), SPEC, seed=0)
    policy = actor.policy
    assert policy.noise_shape == (base.net_config.horizon, A)
    before = policy.base_state_dict()
    state = torch.linspace(-1, 1, 16)[:, None].expand(-1, D).contiguous()

    def reward(actions: torch.Tensor) -> torch.Tensor:
        return 1 - (actions - TARGET).pow(2).mean(-1)  # [B, T]

    start = reward(policy.act(_obs(state))).mean().item()
    assert torch.allclose(policy.act(_obs(state)), base.act(_obs(state)))  # zero-mean steering = the base's act
    g = torch.Generator().manual_seed(0)
    for _ in range(8):
        s_state = torch.rand(32, D, generator=g) * 2 - 1
        sample = policy.sample(_obs(s_state))
        actor.train(one_step_trajectory(s_state, sample, reward(sample.actions), ["push"]))
    end = reward(policy.act(_obs(state))).mean().item()
    assert all(torch.equal(v, policy.base.state_dict()[k]) for k, v in before.items())
    assert end > start, (start, end)


@pytest.mark.slow
@pytest.mark.sim
def test_ppo_trains_diffusion_policy_on_pushcube_through_vlarl_train(tmp_path):
    run_dir = tmp_path / "run"
    rows = vlarl_train(run_dir, ["policy=diffusion_policy", "env=maniskill_pushcube",
           "policy.chunk_size=4", "policy.num_inference_steps=4", "policy.rl_steps=2", "+policy.arch.down_dims=[16,32]",
           "+policy.arch.n_groups=4", "env.num_envs=4", "algorithm.num_steps=4", "algorithm.num_minibatches=2",
           "algorithm.update_epochs=1", "total_env_steps=128", "eval.episodes=2", "eval.num_envs=2"], timeout=900)
    train = [r for r in rows if "train/policy_loss" in r]
    assert len(train) >= 2 and all(math.isfinite(r["train/policy_loss"]) for r in train)
    assert all(r["train/approx_kl"] != 0.0 for r in train), "PPO never moved the policy"
    pol = Policy.from_pretrained(run_dir / "checkpoints" / "latest")
    assert pol.name == "diffusion_policy" and pol.config.chunk_size == 4
    fresh = make_policy(DiffusionPolicyConfig(chunk_size=4, arch=dict(down_dims=[16, 32], n_groups=4)), pol.spec)
    assert pol.net_config.down_dims == [16, 32]
    assert pol.act({"state": torch.zeros(2, pol.spec.state_dim)}).shape == (2, 4, pol.spec.action_dim)
    assert fresh.net_config.horizon == pol.net_config.horizon


def test_run_configs_validate_on_the_meta_device(tmp_path):
    """vlarl-train's config check builds the policy shape-only with placeholder env sizes: a LeRobot checkpoint and
    the SFT-then-DPPO experiment (robot_state_dim 18 > the placeholder's 8) pass it; a missing checkpoint is one line."""
    from vlarl.config import ConfigError, load_train_config

    state_fixture = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "diffusion_policy" / "state"
    cfg = load_train_config([PPO, "policy=diffusion_policy", f"policy.pretrained_path={state_fixture}",
                             "policy.robot_state_dim=5", "policy.chunk_size=0"])
    assert cfg.policy.pretrained_path == str(state_fixture)
    cfg = load_train_config(["experiment=pushcube_diffusion_policy_sft_rl"])
    assert cfg.policy.robot_state_dim == 18 and cfg.algorithm.logprob_level == "action"
    with pytest.raises(ConfigError, match="config.json") as e:
        load_train_config([PPO, "policy=diffusion_policy", f"policy.pretrained_path={tmp_path}"])
    assert "\n" not in str(e.value)
