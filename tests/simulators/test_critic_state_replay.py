"""``scripts/demo_critic_state.py`` (``simulators.critic_state_replay``): demonstrations recorded in the multi-task
RGB env get, by an open-loop replay in the state env, exactly the critic states the RGB env reported while they
were recorded; an episode that replays differently, or an env that is not the multi-task one, is one line, exit 2,
nothing written."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.helpers.refusals import assert_one_line_refusal

pytest.importorskip("mani_skill")

ROOT = Path(__file__).resolve().parents[2]
RUN = ["env=maniskill_multitask_rgb", "env.image_size=16"]  # the run's overrides: its tasks decide the layout


def _script():
    spec = importlib.util.spec_from_file_location("demo_critic_state", ROOT / "scripts/demo_critic_state.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Two short episodes (the language task, PullCube) stepped in the RGB env with critic states on; the file
    holds what vlarl's recorders write (actions, obs, success, task/seed/instruction attrs) and the critic
    states the env reported, kept aside as the expected answer."""
    from simulators.maniskill_multitask import ManiSkillMultiTaskConfig, ManiSkillMultiTaskEnv
    from vlarl import system_env

    system_env.apply()
    cfg = ManiSkillMultiTaskConfig(tasks=["PushCubeToColor-v1", "PushCube-v1", "PullCube-v1"],
                                   control_mode="pd_ee_delta_pos", obs_mode="rgb", image_size=16, critic_state=True)
    env = ManiSkillMultiTaskEnv(cfg, num_envs=3)
    rng = np.random.default_rng(0)
    path, expected = tmp_path_factory.mktemp("demos") / "demos.h5", {}
    with h5py.File(path, "w") as f:
        for k, (slot, seed) in enumerate(((0, 7), (2, 9))):
            first = env.reset_scene(slot, seed, None)
            rows, flags, states = [first.critic], [], [first.state]
            actions = rng.uniform(-1, 1, (4, env.spec.action_dim)).astype(np.float32)
            for a in actions:
                step = env.step_scene(slot, a)
                rows.append(env.critic_vector(slot))
                flags.append(step.success)
                states.append(env.scene_obs(slot, step.obs).state)
            g = f.create_group(f"traj_{k}")
            g["actions"], g["obs"], g["success"] = actions, np.stack(states), np.asarray(flags)
            g.attrs.update(task=env.slot_tasks[slot], seed=seed, instruction=env.instructions[slot])
            expected[f"traj_{k}"] = np.stack(rows)
    env.close()
    return path, expected


def test_replayed_critic_states_are_the_ones_the_rgb_env_reported(recorded, tmp_path, capsys):
    src, expected = recorded
    out = tmp_path / "with_critic_state.h5"
    assert _script().main(["--demos", str(src), "--out", str(out), "--", *RUN]) == 0
    assert "2 episodes with critic states" in capsys.readouterr().out
    with h5py.File(out, "r") as f:
        for name, rows in expected.items():
            assert f[name]["critic_state"].shape == rows.shape == (5, rows.shape[1])
            np.testing.assert_array_equal(f[name]["critic_state"][()], rows)
            np.testing.assert_array_equal(f[name]["actions"][()], h5py.File(src, "r")[name]["actions"][()])
        assert list(f.attrs["critic_state_tasks"]) == ["PushCubeToColor-v1", "PushCube-v1", "PullCube-v1"]
        # the language task's instruction one-hot is set in its rows (the words say which goal counts)
        words = list(f.attrs["critic_state_instructions"])
        drawn = f["traj_0"].attrs["instruction"]
        assert f["traj_0"]["critic_state"][0, -len(words) + words.index(drawn)] == 1.0


def test_an_episode_that_replays_differently_is_one_line_and_nothing_is_written(recorded, tmp_path, capsys):
    src, _ = recorded
    bent = tmp_path / "bent.h5"
    bent.write_bytes(src.read_bytes())
    with h5py.File(bent, "a") as f:
        f["traj_1"]["success"][-1] = True  # recorded as a success it never was
    out = tmp_path / "never.h5"
    main = _script().main
    assert_one_line_refusal(main, ["--demos", str(bent), "--out", str(out), "--", *RUN], "demo_critic_state",
                            "traj_1 (PullCube-v1, seed 9) replays differently", capsys, tmp_path)
    assert_one_line_refusal(main, ["--demos", str(src), "--out", str(out), "--", "env=maniskill_pushcube"],
                            "demo_critic_state", "critic states come from the multi-task env", capsys, tmp_path)
    assert_one_line_refusal(main, ["--demos", str(tmp_path / "none.h5"), "--out", str(out)], "demo_critic_state",
                            "does not exist", capsys, tmp_path)
    assert not out.exists()
