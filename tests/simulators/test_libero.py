"""LIBERO specifics: suites, gripper convention, init states, image orientation, clear errors."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from simulators.base import EnvError
from simulators.libero import SUITE_MAX_STEPS, LiberoConfig, LiberoEnv, quat_to_axis_angle

needs_libero = pytest.mark.skipif(
    importlib.util.find_spec("libero") is None, reason="pip install -e .[libero]"
)


def test_quat_to_axis_angle_matches_hand_computed():
    s = np.sqrt(0.5)
    # 90 degrees about z, (x, y, z, w) order
    np.testing.assert_allclose(quat_to_axis_angle(np.array([0, 0, s, s])), [0, 0, np.pi / 2], atol=1e-6)
    # -q is the same rotation, but the published LIBERO state (robosuite's quat2axisangle, LeRobot, OFT) keeps
    # the quaternion's sign: angle 2 acos(w) = 3 pi / 2 about -z, which checkpoints were trained on
    np.testing.assert_allclose(quat_to_axis_angle(np.array([0, 0, -s, -s])), [0, 0, -3 * np.pi / 2], atol=1e-6)
    np.testing.assert_allclose(quat_to_axis_angle(np.array([0, 0, 0, 1.0])), [0, 0, 0])
    np.testing.assert_allclose(quat_to_axis_angle(np.array([1.0, 0, 0, 0])), [np.pi, 0, 0], atol=1e-6)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(task="libero_100"), "unknown LIBERO suite"),
        (dict(cameras=["frontview"]), "do not have"),
        (dict(reward_mode="dense"), "sparse"),
        (dict(obs_mode="depth"), "obs_mode"),
        (dict(task_ids=[]), "task_ids"),
    ],
)
def test_bad_config_is_a_clear_error(overrides, match):
    with pytest.raises(EnvError, match=match):
        LiberoEnv.validate_config(LiberoConfig(**overrides))


@needs_libero
def test_task_id_out_of_range():
    with pytest.raises(EnvError, match="tasks 0..9"):
        LiberoEnv(LiberoConfig(task="libero_goal", task_ids=[10]), num_envs=1)


@needs_libero
@pytest.mark.parametrize(
    "suite, n",
    [
        ("libero_spatial", 10),
        ("libero_object", 10),
        ("libero_goal", 10),
        ("libero_10", 10),
        ("libero_90", 90),
    ],
)
def test_suites_ship_bddl_and_init_states(suite, n):
    """Every task of the five suites has its BDDL file and 50 standard init states (no network)."""
    from pathlib import Path

    from simulators.libero import suite_tasks

    b = suite_tasks(suite)
    assert b.get_num_tasks() == n and suite in SUITE_MAX_STEPS
    for i in (0, n - 1):
        assert Path(b.get_task_bddl_file_path(i)).is_file()
        assert len(b.get_task_init_states(i)) == 50
        assert b.get_task(i).language


@needs_libero
def test_gripper_convention_minus_one_opens_plus_one_closes():
    """state[6:8] are the finger joints (+left, -right): their gap shrinks under +1 and grows under -1."""
    from tests.helpers.sim_cases import shared_env

    env = shared_env("libero")
    obs = env.reset(reset_state_ids=[0])
    gap0 = float(obs["state"][0, 6] - obs["state"][0, 7])
    close = torch.zeros(1, 5, 7)
    close[..., 6] = 1.0
    res = env.chunk_step(close)
    gap_closed = float(res.obs["state"][0, 6] - res.obs["state"][0, 7])
    open_ = torch.zeros(1, 5, 7)
    open_[..., 6] = -1.0
    res = env.chunk_step(open_)
    gap_open = float(res.obs["state"][0, 6] - res.obs["state"][0, 7])
    assert gap_closed < gap0 - 0.01, (gap0, gap_closed)
    assert gap_open > gap_closed + 0.01, (gap_closed, gap_open)


@needs_libero
def test_init_state_ids_pick_the_standard_states_and_images_are_upright():
    """Id k loads init state k of the task's 50; images are the raw render rotated by 180 degrees."""
    from tests.helpers.sim_cases import shared_env

    env = shared_env("libero")
    a = env.reset(reset_state_ids=[7])
    b = env.reset(reset_state_ids=[57])  # ids wrap around the 50 standard states
    assert torch.equal(a["state"], b["state"])
    assert torch.equal(a["images"]["agentview"], b["images"]["agentview"])
    sim_state = env.envs[0].get_sim_state()
    init = env.init_states[0][7]
    # objects keep the init state's positions up to the settle steps' motion
    assert np.abs(sim_state[1:10] - init[1:10]).max() < 0.05
    # the raw MuJoCo render is upside down; obs images are it rotated by 180 degrees
    size = env.cfg.image_size
    raw = env.envs[0].sim.render(camera_name="agentview", width=size, height=size)
    img = a["images"]["agentview"][0].numpy().astype(float)
    d_rotated = np.abs(img - raw[::-1, ::-1]).mean()
    d_raw = np.abs(img - raw).mean()
    assert d_rotated < 2.0 and d_raw > 5 * d_rotated + 5, (d_rotated, d_raw)
    assert a["instruction"][0].startswith("pick up the black bowl")


def test_slots_run_task_ids_in_blocks_across_workers():
    """``env.task_block``: global slot g runs ``task_ids[(g // task_block) % len(task_ids)]``; 1 spreads as before."""
    from simulators.libero import slot_task_ids

    cfg = LiberoConfig(task_ids=[3, 5, 7], task_block=4, num_envs=12, num_workers=2)
    assert slot_task_ids(cfg, 6, 0) == [3, 3, 3, 3, 5, 5]
    assert slot_task_ids(cfg, 6, 1) == [5, 5, 7, 7, 7, 7]
    assert LiberoEnv.global_slot_tasks(cfg) == ["libero_spatial/3"] * 4 + ["libero_spatial/5"] * 4 + [
        "libero_spatial/7"] * 4
    assert slot_task_ids(LiberoConfig(task_ids=[3, 5, 7]), 6, 1) == [3, 5, 7, 3, 5, 7]
    with pytest.raises(EnvError, match="task_block=0 must be >= 1"):
        LiberoEnv.validate_config(LiberoConfig(task_block=0))


@needs_libero
def test_grpo_recipe_groups_hold_one_task_and_a_mixed_one_is_refused(tmp_path, monkeypatch, capsys):
    """SimpleVLA-RL compares the 8 samples of one task's prompt; the LIBERO GRPO recipe's groups (8 consecutive of
    512 slots over the suite's 10 tasks) each hold one task, and ``env.task_block=1`` is refused in one line."""
    from tests.helpers.libero_checkpoints import OFT_LIBERO
    from tests.helpers.refusals import assert_one_line_refusal
    from vlarl.cli import train_main
    from vlarl.config import load_train_config

    args = ["experiment=libero_spatial_oft_grpo", f"policy.pretrained_path={OFT_LIBERO}", "policy.unnorm_key=fixture_sim"]
    cfg = load_train_config(args)
    K, slots = cfg.algorithm.group_size, LiberoEnv.global_slot_tasks(cfg.env)
    assert len(slots) == 512 and cfg.env.task_block == K == 8
    assert all(len(set(slots[i:i + K])) == 1 for i in range(0, 512, K)) and len(set(slots)) == 10
    monkeypatch.chdir(tmp_path)
    assert_one_line_refusal(train_main, [*args, "env.task_block=1", f"run_dir={tmp_path}/run"], "vlarl-train",
                            "algorithm.group_size=8 makes env slots 0-7 one GRPO group, but they run different tasks",
                            capsys, tmp_path)
    assert not (tmp_path / "run").exists()
