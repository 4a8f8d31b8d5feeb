"""A critic that sees the task (``env.critic_state=true``, ``policy.value_from=critic_state``): the multi-task env
reports each slot's full ManiSkill scene state, zero-padded, plus task and instruction one-hots, beside the
actor's observation; the exact flow VLAs' value head reads it and PPO trains it; configs where the env reports
none are refused before a run; a checkpoint's head of another width starts fresh under ``init_from``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.refusals import assert_one_line_refusal

pytest.importorskip("mani_skill")

TASKS = ["PushCubeToColor-v1", "PushCube-v1", "PullCube-v1"]


def _cfg(**kw):
    from simulators.maniskill_multitask import ManiSkillMultiTaskConfig

    values = dict(tasks=list(TASKS), control_mode="pd_ee_delta_pos", obs_mode="state", num_envs=3, critic_state=True)
    return ManiSkillMultiTaskConfig(**{**values, **kw})


@pytest.fixture(scope="module")
def env():
    from simulators.maniskill_multitask import ManiSkillMultiTaskEnv
    from vlarl import system_env

    system_env.apply()
    e = ManiSkillMultiTaskEnv(_cfg(max_episode_steps=2), num_envs=3)
    yield e
    e.close()


def test_the_critic_state_is_each_tasks_own_full_state_padded_plus_one_hots(env):
    """For a fresh reset, slot i's vector starts with the full state of a new single-task env of its task reset
    from the same seed, bit for bit; zeros pad it to the widest task (the language task has two more goals);
    then the slot's task one-hot and the one-hot of the words it reports."""
    from simulators.maniskill import fresh_reset, import_maniskill, make_scene_env
    from simulators.maniskill_multitask import ManiSkillMultiTaskEnv, task_config

    gym = import_maniskill()
    seeds = [7, 8, 9]
    obs = env.reset(seed=seeds)
    words = ManiSkillMultiTaskEnv.instructions(env.cfg)
    crit = obs["critic_state"].numpy()
    assert crit.dtype == np.float32 and crit.shape == (3, env.spec.critic_state_dim)
    widths = []
    for i, (task, seed) in enumerate(zip(TASKS, seeds, strict=True)):
        own = make_scene_env(gym, task_config(env.cfg, task), False)
        try:
            fresh_reset(own, seed)
            full = own.unwrapped.get_state().reshape(-1).numpy()
        finally:
            own.close()
        widths.append(full.shape[0])
        np.testing.assert_array_equal(crit[i, :full.shape[0]], full)  # bit for bit
        sim = env.spec.critic_state_dim - len(TASKS) - len(words)
        assert not crit[i, full.shape[0]:sim].any()  # zero padding
        assert crit[i, sim:sim + len(TASKS)].tolist() == [float(j == i) for j in range(len(TASKS))]
        assert crit[i, sim + len(TASKS):].tolist() == [float(w == obs["instruction"][i]) for w in words]
    assert widths[0] > widths[1] == widths[2]  # the language task's goals: padding was exercised
    assert env.spec.critic_state_dim == max(widths) + len(TASKS) + len(words)
    # the actor's state is unchanged: the robot's own 25 dims
    assert tuple(obs["state"].shape) == (3, 25)


def test_the_critic_state_sits_beside_the_observation_it_was_made_with(env):
    """After a chunk: each slot's vector is its scene now; an ended episode's final_obs keeps the end state, the
    next obs the reset one (the 2-step limit ends every episode in this chunk)."""
    env.reset(seed=[1, 2, 3])
    res = env.chunk_step(torch.full((3, 2, 4), 0.5))
    assert bool(res.done.all()) and res.final_obs is not None
    for i, e in enumerate(env.envs):
        now = e.unwrapped.get_state().reshape(-1).numpy()
        np.testing.assert_array_equal(res.obs["critic_state"][i, :now.shape[0]].numpy(), now)
    assert not torch.equal(res.final_obs["critic_state"], res.obs["critic_state"])
    # the evaluation's per-task envs need no critic
    from simulators.maniskill_multitask import ManiSkillMultiTaskEnv

    assert not any(c.critic_state for _, c in ManiSkillMultiTaskEnv.task_configs(env.cfg))


def test_ppo_with_value_from_critic_state_trains_a_value_head_on_it():
    """The tiny exact SmolVLA on a real 3-task rollout from pixels: its value head is a 2x256 MLP on the C-dim
    critic state (the actor reads neither it nor the head), PPO moves the head, and the value follows the
    critic state, not the trunk."""
    from policies import make_policy
    from simulators.maniskill_multitask import ManiSkillMultiTaskEnv
    from vlarl import system_env
    from vlarl.algorithms.ppo import ppo_update
    from vlarl.config import load_train_config
    from vlarl.config.schema import PPOConfig
    from vlarl.data.trajectory import Trajectory, stack_obs
    from vlarl.runner import policy_spec_from_env

    system_env.apply()
    torch.manual_seed(0)
    env = ManiSkillMultiTaskEnv(_cfg(obs_mode="rgb", image_size=32, max_episode_steps=50), num_envs=3)
    try:
        cfg = load_train_config(["experiment=multitask_smolvla_sft_rl", "env.critic_state=true",
                                 "policy.value_from=critic_state"])
        spec = policy_spec_from_env(env.spec)
        policy = make_policy(cfg.policy, spec)
        C = spec.critic_state_dim
        assert policy.value_head[1].in_features == C
        obs = env.reset(seed=[4, 5, 6])
        obs_list, samples, rewards = [], [], []
        for _ in range(3):
            s = policy.sample(obs)
            obs_list.append(obs)
            samples.append(s)
            res = env.chunk_step(s.actions)
            rewards.append(res.rewards.sum(-1).float())
            obs = res.obs
    finally:
        env.close()
    traj = Trajectory(
        obs=stack_obs(obs_list), replay={k: torch.stack([s.replay[k] for s in samples]) for k in samples[0].replay},
        logprob=torch.stack([s.logprob for s in samples]), values=torch.stack([s.value for s in samples]),
        rewards=torch.stack(rewards), dones=torch.zeros(3, 3), truncated=torch.zeros(3, 3),
        final_values=torch.zeros(3, 3), next_value=torch.zeros(3))
    assert traj.obs["critic_state"].shape == (3, 3, C)
    flat = traj.flat_obs()
    v = policy.value(flat)
    blind = policy.value({**flat, "critic_state": torch.zeros_like(flat["critic_state"])})
    assert not torch.allclose(v, blind)  # the value reads the critic state
    head = {k: p.detach().clone() for k, p in policy.value_head.named_parameters()}
    trunk = {k: p.detach().clone() for k, p in policy.named_parameters() if not k.startswith("value_head.")}
    ppo = PPOConfig(update_epochs=2, num_minibatches=1, lr=0.0, critic_lr=1e-2, target_kl=0.0)
    opt = torch.optim.Adam([{"params": [p for n, p in policy.named_parameters() if not n.startswith("value_head.")],
                             "lr": 0.0},
                            {"params": list(policy.value_head.parameters()), "lr": 1e-2}])
    stats = ppo_update(policy, opt, traj, ppo, generator=torch.Generator().manual_seed(0))
    assert np.isfinite(stats["value_loss"])
    moved = [k for k, p in policy.value_head.named_parameters() if not torch.equal(p, head[k])]
    assert moved  # PPO trained the head on the critic state
    assert all(torch.equal(p, trunk[k]) for k, p in policy.named_parameters() if k in trunk)  # lr 0 elsewhere
    # act() without a critic state (an evaluation's per-task env) still acts
    acts = policy.act({k: v for k, v in obs.items() if k != "critic_state"})
    assert acts.shape[0] == 3


@pytest.mark.parametrize("args, match", [
    (["policy.value_from=critic_state"], "policy.value_from=critic_state needs an env that reports "
                                         "obs['critic_state'] (a privileged state for the critic); set "
                                         "env.critic_state=true"),
    (["env=maniskill_pushcube_rgb", "policy.value_from=critic_state"], "set env.critic_state=true"),
])
def test_vlarl_train_refuses_a_critic_state_the_env_does_not_report(args, match, tmp_path, monkeypatch, capsys):
    from vlarl.cli import train_main

    monkeypatch.chdir(tmp_path)
    assert_one_line_refusal(train_main, ["experiment=multitask_smolvla_sft_rl", *args, f"run_dir={tmp_path}/run"],
                            "vlarl-train", match, capsys, tmp_path)
    assert not (tmp_path / "run").exists()


def test_init_from_starts_a_fresh_head_for_a_critic_state_of_another_width(tmp_path, capsys):
    """A checkpoint whose head read a C-wide critic state, resumed into an env of another width (other tasks):
    the trunk loads, the head is new at the new width; the same width loads the trained head as saved."""
    from dataclasses import replace

    from policies import make_policy
    from policies.base import PolicySpec
    from vlarl.config import load_train_config
    from vlarl.init_from import load_init_weights

    cfg = load_train_config(["experiment=multitask_smolvla_sft_rl", "env.critic_state=true",
                             "policy.value_from=critic_state"])
    spec = PolicySpec(state_dim=25, action_dim=4, action_low=[-1.0] * 4, action_high=[1.0] * 4,
                      image_keys=["base_camera"], image_size=[32, 32], task="multitask",
                      instruction="push the cube to the red goal", critic_state_dim=103)
    torch.manual_seed(0)
    trained = make_policy(cfg.policy, spec)
    trained.save_pretrained(tmp_path / "ckpt")
    same = load_init_weights(tmp_path / "ckpt", cfg.policy, spec)
    assert torch.equal(same["value_head.1.weight"], trained.state_dict()["value_head.1.weight"])
    assert "starts fresh" not in capsys.readouterr().out
    other = load_init_weights(tmp_path / "ckpt", cfg.policy, replace(spec, critic_state_dim=77))
    assert "obs['critic_state'] width 77 (checkpoint: 103); the value head starts fresh" in capsys.readouterr().out
    assert other["value_head.1.weight"].shape == (256, 77)
    kept = [k for k in other if not k.startswith("value_head.")]
    assert kept and all(torch.equal(other[k], trained.state_dict()[k]) for k in kept)
