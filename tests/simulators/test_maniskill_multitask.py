"""Several ManiSkill tasks in one batched env (``simulators/maniskill_multitask.py``): slot g runs tasks[g % n]
with its task's words, the state is the robot's own in every task, success is reported per task in training
metrics and in evaluation, and configs one policy cannot serve are refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.helpers.refusals import assert_one_line_refusal

pytest.importorskip("mani_skill")

TASKS = ["PushCubeToColor-v1", "PushCube-v1", "PullCube-v1"]
SIZE = 16  # px: the layout is what is tested, not the pictures


def _cfg(**kw):
    from simulators.maniskill_multitask import ManiSkillMultiTaskConfig

    values = dict(tasks=list(TASKS), control_mode="pd_ee_delta_pos", obs_mode="rgb", image_size=SIZE, num_envs=6)
    return ManiSkillMultiTaskConfig(**{**values, **kw})


@pytest.fixture(scope="module")
def env():
    """Worker 1 of a 6-env, 2-worker run: its slots are global envs 3, 4, 5."""
    from simulators.maniskill_multitask import ManiSkillMultiTaskEnv
    from vlarl import system_env

    system_env.apply()
    e = ManiSkillMultiTaskEnv(_cfg(max_episode_steps=3), num_envs=3, worker_index=1)
    yield e
    e.close()


def test_slots_run_their_tasks_with_their_instructions(env):
    from simulators.maniskill_tasks import instruction_for, task_instructions

    assert env.slot_tasks == [TASKS[3 % 3], TASKS[4 % 3], TASKS[5 % 3]]
    assert [type(e.unwrapped).__name__ for e in env.envs] == ["PushCubeToColorEnv", "PushCubeEnv", "PullCubeEnv"]
    obs = env.reset(seed=[10, 11, 12])
    words = obs["instruction"]
    assert words[0] in task_instructions("PushCubeToColor-v1")  # the language task's draw for the episode
    assert words[1:] == [instruction_for("PushCube-v1"), instruction_for("PullCube-v1")]
    assert words[1] != words[2]
    # one layout: the robot's own 25 dims (PullCube's goal position, which ManiSkill keeps under rgb, is dropped)
    assert env.spec.state_dim == 25 and tuple(obs["state"].shape) == (3, 25)
    assert env.spec.image_keys == ("base_camera",) and tuple(obs["images"]["base_camera"].shape) == (3, SIZE, SIZE, 3)
    pull = env.envs[2].unwrapped
    qpos = pull.agent.robot.get_qpos()[0].numpy()
    tcp = pull.agent.tcp.pose.raw_pose[0].numpy()
    np.testing.assert_allclose(obs["state"][2, :9].numpy(), qpos, atol=1e-6)
    np.testing.assert_allclose(obs["state"][2, -7:].numpy(), tcp, atol=1e-6)
    # the language task's words follow its episode across resets
    seen = {env.reset(seed=[s, 11, 12])["instruction"][0] for s in range(6)}
    assert seen == set(task_instructions("PushCubeToColor-v1"))


def test_episode_metrics_are_reported_per_task(env):
    env.reset(seed=[1, 2, 3])
    res = env.chunk_step(torch.zeros(3, 3, 4))  # the 3-step limit ends every episode in this chunk
    assert bool(res.done.all())
    for j, task in enumerate(env.slot_tasks):
        for k in ("success_once", "success_at_end"):
            v = res.episode[f"{k}/{task}"]
            assert not torch.isnan(v[j]) and float(v[j]) == float(res.episode[k][j])
            assert torch.isnan(v[[i for i in range(3) if i != j]]).all()

    from vlarl.data.metrics import EpisodeStats

    stats = EpisodeStats(window=8)
    stats.add({**res.episode, "success_once/PushCube-v1": torch.tensor([float("nan"), 1.0, float("nan")])})
    summary = stats.summary()
    assert summary["success_once/PushCube-v1"] == 1.0 and summary["success_once/PullCube-v1"] == 0.0
    assert summary["success_once"] == 0.0  # the pooled metric is the plain one


@pytest.mark.heavy
def test_evaluation_runs_and_reports_every_task_on_its_own():
    """``evaluate`` of a multi-task config: one plan per task (every slot of its env runs that task), the same
    held-out seeds per task, eval.json's ``tasks`` holding each."""
    from simulators.maniskill_tasks import instruction_for, task_instructions
    from vlarl.evaluation import evaluate

    seen: list[set[str]] = []

    class Still:  # a policy that holds still and notes the words it is given
        def act(self, obs):
            seen.append(set(obs["instruction"]))
            return torch.zeros(len(obs["instruction"]), 2, 4)

    ev = evaluate(Still(), _cfg(max_episode_steps=2), episodes=2, seed=1_000_000, num_envs=2, progress=False)
    assert list(ev["tasks"]) == TASKS and ev["episodes"] == 6
    assert all(r["episodes"] == 2 and r["seeds"] == [1_000_000, 1_000_001] for r in ev["tasks"].values())
    assert seen[0] <= set(task_instructions("PushCubeToColor-v1"))  # the first plan's envs all run the language task
    assert seen[-1] == {instruction_for("PullCube-v1")}
    assert {instruction_for("PushCube-v1")} in seen


@pytest.mark.parametrize("args, match", [
    (["env.tasks=[PushCube-v1,PushCubez-v1]"], "env.tasks: unknown ManiSkill task env.task='PushCubez-v1'"),
    (["env.control_mode=''"], "env.control_mode='' lets each of env.tasks="),
    (["env.tasks=[]"], "env.tasks is empty"),
    (["env.num_envs=2", "algorithm.num_minibatches=2"], "env.num_envs=2 is fewer than the 3 tasks"),
    (["+env.task_kwargs.PickCube-v1.x=1"], "env.task_kwargs has ['PickCube-v1'], which are not in env.tasks"),
])
def test_vlarl_train_refuses_a_config_one_policy_cannot_serve(args, match, tmp_path, monkeypatch, capsys):
    from vlarl.cli import train_main

    monkeypatch.chdir(tmp_path)
    assert_one_line_refusal(train_main, ["experiment=multitask_smolvla_sft_rl", *args, f"run_dir={tmp_path}/run"],
                            "vlarl-train", match, capsys, tmp_path)
    assert not (tmp_path / "run").exists()


def test_tasks_whose_states_differ_are_refused_in_one_line():
    """``env.state=full`` keeps ManiSkill's whole state: PushCube's (35) and the language task's (38, two goals)
    cannot feed one policy, and the build says so."""
    from simulators.base import EnvError
    from simulators.maniskill_multitask import ManiSkillMultiTaskEnv

    cfg = _cfg(tasks=["PushCube-v1", "PushCubeToColor-v1"], obs_mode="state", state="full", num_envs=2)
    with pytest.raises(EnvError) as e:
        ManiSkillMultiTaskEnv(cfg, num_envs=1)
    msg = str(e.value)
    assert "\n" not in msg and "differ in state sizes (PushCube-v1: 35, PushCubeToColor-v1: 38)" in msg
    assert "env.state=proprio" in msg
    # the default keeps the robot's own dims, the same in both
    ok = ManiSkillMultiTaskEnv(_cfg(tasks=["PushCube-v1", "PushCubeToColor-v1"], obs_mode="state", num_envs=2),
                               num_envs=2)
    try:
        assert ok.spec.state_dim == 25 and tuple(ok.reset(seed=0)["state"].shape) == (2, 25)
    finally:
        ok.close()


def test_task_kwargs_reach_only_their_task(tmp_path):
    """``+env.task_kwargs.<task>.<key>=...`` is loaded by the config and given to that task's constructor alone."""
    from simulators.maniskill_multitask import task_config
    from vlarl.config import load_train_config

    cfg = load_train_config(["experiment=multitask_smolvla_sft_rl",
                             "+env.task_kwargs.PushCubeToColor-v1.instruction=other"])
    assert task_config(cfg.env, "PushCubeToColor-v1").task_kwargs == {"instruction": "other"}
    assert task_config(cfg.env, "PushCube-v1").task_kwargs == {}
    json.dumps(cfg.env.task_kwargs)  # saved into env.json with the checkpoint
