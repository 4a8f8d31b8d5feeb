"""GRPO over several tasks (``simulators/maniskill_multitask.py`` with ``env.task_block``): a group of
``group_size`` consecutive env slots shares one reset state, so it must hold one task; ``env.task_block`` gives
each block of slots one task, and a GRPO config whose groups would mix tasks is refused before a run."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.refusals import assert_one_line_refusal

pytest.importorskip("mani_skill")

TASKS = ["PushCubeToColor-v1", "PushCube-v1", "PullCube-v1"]


def _cfg(**kw):
    from simulators.maniskill_multitask import ManiSkillMultiTaskConfig

    values = dict(tasks=list(TASKS), control_mode="pd_ee_delta_pos", obs_mode="state", num_envs=12, num_workers=2)
    return ManiSkillMultiTaskConfig(**{**values, **kw})


def test_slots_run_tasks_in_blocks_across_workers():
    from simulators.maniskill_multitask import ManiSkillMultiTaskEnv, slot_tasks

    cfg = _cfg(task_block=4)  # 12 envs over 2 workers of 6: global slot g runs tasks[(g // 4) % 3]
    a, b, c = TASKS
    assert slot_tasks(cfg, 6, 0) == [a, a, a, a, b, b]
    assert slot_tasks(cfg, 6, 1) == [b, b, c, c, c, c]
    assert ManiSkillMultiTaskEnv.global_slot_tasks(cfg) == [a] * 4 + [b] * 4 + [c] * 4
    # the default block of 1 spreads consecutive slots over the tasks, as before
    assert slot_tasks(_cfg(), 6, 1) == [a, b, c, a, b, c]
    assert ManiSkillMultiTaskEnv.global_slot_tasks(_cfg(num_envs=6, task_block=2)) == [a, a, b, b, c, c]


def test_a_grpo_group_shares_task_seed_and_words():
    """Drive the env as GRPO's collect does (``group_reset_ids``): both members of each group run the same task
    from the same seed, so their scenes' full states are equal bit for bit and the language task gives both the
    same words; the groups differ, and over a few rounds the language task draws both instructions."""
    from simulators.maniskill_multitask import ManiSkillMultiTaskEnv
    from simulators.maniskill_tasks import task_instructions
    from vlarl import system_env
    from vlarl.algorithms.grpo import group_reset_ids

    system_env.apply()
    cfg = _cfg(tasks=["PushCubeToColor-v1", "PushCube-v1"], task_block=2, num_envs=4, num_workers=1)
    env = ManiSkillMultiTaskEnv(cfg, num_envs=4, worker_index=0)
    try:
        assert env.slot_tasks == ["PushCubeToColor-v1"] * 2 + ["PushCube-v1"] * 2
        words_seen, starts = set(), []
        for base in range(6):
            ids = group_reset_ids(4, 2, base * 2)
            obs = env.reset(reset_state_ids=ids)
            words = obs["instruction"]
            states = [e.unwrapped.get_state()[0].numpy() for e in env.envs]
            for g in (0, 2):  # the two groups: slots 0-1 and 2-3
                assert ids[g] == ids[g + 1] and env._seeds[g] == env._seeds[g + 1]
                assert words[g] == words[g + 1]
                np.testing.assert_array_equal(states[g], states[g + 1])
                np.testing.assert_array_equal(obs["state"][g].numpy(), obs["state"][g + 1].numpy())
            assert ids[0] != ids[2]
            words_seen.add(words[0])
            starts.append(states[0])
        # each round's language group starts elsewhere (so equal members are no accident of one fixed start) ...
        assert len({s.tobytes() for s in starts}) == len(starts)
        assert words_seen == set(task_instructions("PushCubeToColor-v1"))  # ... and draws both instructions
    finally:
        env.close()


@pytest.mark.parametrize("args, match", [
    (["env.task_block=1"], "algorithm.group_size=4 makes env slots 0-3 one GRPO group, but they run different "
                           "tasks (PushCubeToColor-v1, PushCube-v1, PullCube-v1)"),
    (["env.task_block=2"], "set env.task_block=4 (= algorithm.group_size"),
    (["env.task_block=8", "env.num_envs=16"], "env.num_envs=16 leaves tasks without an env: env.task_block=8"),
])
def test_vlarl_train_refuses_groups_that_mix_tasks(args, match, tmp_path, monkeypatch, capsys):
    from vlarl.cli import train_main

    monkeypatch.chdir(tmp_path)
    assert_one_line_refusal(train_main, ["experiment=multitask_smolvla_sft_grpo", *args, f"run_dir={tmp_path}/run"],
                            "vlarl-train", match, capsys, tmp_path)
    assert not (tmp_path / "run").exists()


def test_the_grpo_recipe_loads_with_task_pure_groups():
    from simulators.maniskill_multitask import ManiSkillMultiTaskEnv
    from vlarl.config import load_train_config

    cfg = load_train_config(["experiment=multitask_smolvla_sft_grpo"])
    K = cfg.algorithm.group_size
    assert cfg.algorithm.name == "grpo" and cfg.env.task_block == K and cfg.env.reward_mode == "sparse"
    slots = ManiSkillMultiTaskEnv.global_slot_tasks(cfg.env)
    groups = [set(slots[i:i + K]) for i in range(0, len(slots), K)]
    assert all(len(g) == 1 for g in groups) and {t for g in groups for t in g} == set(TASKS)
