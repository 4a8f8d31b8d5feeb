"""vlarl's language task ``PushCubeToColor-v1`` through vlarl's ManiSkill env: each episode's instruction names
the goal that counts, the observation does not, and the scripted expert succeeds only towards the named goal."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("mani_skill")

B = 2


@pytest.fixture(scope="module")
def env():
    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv
    from vlarl import system_env

    system_env.apply()
    cfg = ManiSkillConfig(task="PushCubeToColor-v1", control_mode="pd_ee_delta_pos", obs_mode="state",
                          reward_mode="normalized_dense")
    e = ManiSkillEnv(cfg, num_envs=B)
    yield e
    e.close()


def _play(env, seeds: list[int], swap: bool) -> tuple[list[str], np.ndarray]:
    """One episode per env with the expert; ``swap`` makes it push to the goal the instruction does not name."""
    from simulators.language_tasks import scripted_push_to_colour_action

    obs = env.reset(seed=seeds[0])
    instructions = list(obs["instruction"])
    tasks = [e.unwrapped for e in env.envs]
    rng = np.random.default_rng(0)
    phases = [0] * B
    success = np.zeros(B, dtype=bool)
    finished = np.zeros(B, dtype=bool)  # an env's first episode is over (later ones are auto-reset draws)
    while not finished.all():
        actions = torch.zeros(B, 1, 4)
        for i, t in enumerate(tasks):
            if not finished[i]:
                actions[i, 0], phases[i] = scripted_push_to_colour_action(t, phases[i], rng, 1.0, to_named=not swap)
        r = env.chunk_step(actions)
        success |= ~finished & r.success.numpy().any(-1)
        finished |= r.done.numpy()
    return instructions, success


def test_instruction_names_the_goal_and_the_state_does_not(env):
    from simulators.language_tasks import INSTRUCTIONS

    seen = set()
    for seed in range(6):
        obs = env.reset(seed=seed)
        for i, task in enumerate(e.unwrapped for e in env.envs):
            want = INSTRUCTIONS[0] if bool(task.target_is_red[0]) else INSTRUCTIONS[1]
            assert obs["instruction"][i] == want
            seen.add(want)
            state = np.asarray(obs["state"][i])
            red, blue = (task.goals[c].pose.p[0].numpy() for c in ("red", "blue"))
            # both goals are in the observation (red first), whichever is named
            i_red = _find(state, red)
            i_blue = _find(state, blue)
            assert 0 <= i_red < i_blue
    assert seen == set(INSTRUCTIONS)  # both colours are drawn across episodes


def _find(state: np.ndarray, vec: np.ndarray) -> int:
    for k in range(len(state) - 2):
        if np.allclose(state[k:k + 3], vec, atol=1e-5):
            return k
    raise AssertionError(f"{vec} is not in the state {state}")


def test_success_only_at_the_named_goal(env):
    instructions, named = _play(env, seeds=[11], swap=False)
    _, other = _play(env, seeds=[11], swap=True)
    assert named.all(), f"the expert pushing to the named goal failed: {instructions} {named}"
    assert not other.any(), "pushing the cube to the goal the instruction does not name must not succeed"


def test_auto_reset_draws_a_new_instruction():
    """Instructions follow the episode: after auto-resets inside chunk steps the obs reports the new draw."""
    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv
    from vlarl import system_env

    system_env.apply()
    cfg = ManiSkillConfig(task="PushCubeToColor-v1", control_mode="pd_ee_delta_pos", obs_mode="state",
                          max_episode_steps=2)
    e = ManiSkillEnv(cfg, num_envs=1)
    try:
        obs = e.reset(seed=0)
        seen = [obs["instruction"][0]]
        for _ in range(8):
            obs = e.chunk_step(torch.zeros(1, 2, 4)).obs
            assert obs["instruction"][0] == e.envs[0].unwrapped.episode_instructions()[0]
            seen.append(obs["instruction"][0])
        assert len(set(seen)) == 2
    finally:
        e.close()


def test_other_instruction_mode_reports_the_goal_that_does_not_count():
    """``env.task_kwargs.instruction=other``: the observation names the other goal, success stays at the drawn one
    (how ``vlarl-eval`` measures whether a policy follows the words)."""
    from simulators.language_tasks import INSTRUCTIONS
    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv
    from vlarl import system_env

    system_env.apply()
    cfg = ManiSkillConfig(task="PushCubeToColor-v1", control_mode="pd_ee_delta_pos", obs_mode="state",
                          task_kwargs={"instruction": "other"})
    e = ManiSkillEnv(cfg, num_envs=1)
    try:
        for seed in range(4):
            obs = e.reset(seed=seed)
            named_red = bool(e.envs[0].unwrapped.target_is_red[0])
            assert obs["instruction"][0] == (INSTRUCTIONS[1] if named_red else INSTRUCTIONS[0])
    finally:
        e.close()
    with pytest.raises(ValueError, match="use 'named' or 'other'"):
        ManiSkillEnv(ManiSkillConfig(task="PushCubeToColor-v1", control_mode="pd_ee_delta_pos",
                                     task_kwargs={"instruction": "both"}), num_envs=1)


def test_flipped_target_counts_the_other_goal_in_the_same_scene():
    """``target=flipped``: for a seed, the same cube and goal discs as ``drawn`` gives, the other goal named and
    counted: the expert towards the named goal succeeds, towards the goal ``drawn`` names it does not."""
    from simulators.language_tasks import INSTRUCTIONS
    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv
    from vlarl import system_env

    system_env.apply()
    scenes = {}
    for target in ("drawn", "flipped"):
        cfg = ManiSkillConfig(task="PushCubeToColor-v1", control_mode="pd_ee_delta_pos", obs_mode="state",
                              reward_mode="normalized_dense", task_kwargs={"target": target})
        e = ManiSkillEnv(cfg, num_envs=B)
        try:
            obs = e.reset(seed=5)
            tasks = [x.unwrapped for x in e.envs]
            scenes[target] = ([np.asarray(s) for s in obs["state"]], list(obs["instruction"]),
                              [bool(t.target_is_red[0]) for t in tasks])
            if target == "flipped":
                instructions, named = _play(e, seeds=[5], swap=False)
                _, other = _play(e, seeds=[5], swap=True)
                assert named.all() and not other.any()
        finally:
            e.close()
    for i in range(B):
        assert np.array_equal(scenes["drawn"][0][i], scenes["flipped"][0][i])  # cube, goals, robot: the same
        assert scenes["drawn"][2][i] != scenes["flipped"][2][i]
        assert {scenes["drawn"][1][i], scenes["flipped"][1][i]} == set(INSTRUCTIONS)
    with pytest.raises(ValueError, match="use 'drawn' or 'flipped'"):
        ManiSkillEnv(ManiSkillConfig(task="PushCubeToColor-v1", control_mode="pd_ee_delta_pos",
                                     task_kwargs={"target": "left"}), num_envs=1)


def test_grounding_target_points_at_the_goal_the_words_name(env):
    """``GroundedTask``: where the named goal is from the cube, whichever colour is named and on whichever side;
    a multi-task env gives a NaN row to a scene whose task names nothing."""
    from simulators.base import GroundedTask
    from simulators.maniskill_multitask import ManiSkillMultiTaskConfig, ManiSkillMultiTaskEnv

    sides = set()
    for seed in range(6):
        obs = env.reset(seed=seed)
        got = env.grounding_targets()
        assert got.shape == (B, 2) and got.dtype == np.float32
        for i, task in enumerate(e.unwrapped for e in env.envs):
            assert isinstance(task, GroundedTask)
            goal = task.goals["red" if "red" in obs["instruction"][i] else "blue"].pose.p[0]
            np.testing.assert_allclose(got[i], (goal - task.obj.pose.p[0])[:2].numpy(), atol=1e-5)
            np.testing.assert_allclose(abs(got[i]), [0.12, 0.09], atol=1e-4)
            sides.add(bool(got[i, 1] > 0))
    assert sides == {True, False}
    mixed = ManiSkillMultiTaskEnv(ManiSkillMultiTaskConfig(tasks=["PushCube-v1", "PushCubeToColor-v1"],
                                                           control_mode="pd_ee_delta_pos", obs_mode="state"),
                                  num_envs=2)
    try:
        mixed.reset(seed=0)
        rows = mixed.grounding_targets()
        named = [t == "PushCubeToColor-v1" for t in mixed.slot_tasks]
        assert sorted(named) == [False, True]
        assert np.isnan(rows[~np.array(named)]).all() and np.isfinite(rows[np.array(named)]).all()
    finally:
        mixed.close()
