"""ManiSkill task coverage and bad input: reward modes pass through, every offline task has an
instruction and a config route, and unknown tasks, missing assets, unsupported reward/control modes,
missing cameras and simulator crashes are one-line errors that name the fix. All on real tasks."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from simulators.base import EnvError
from tests.helpers.recipes import PPO

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mani_skill") is None, reason="pip install -e .[maniskill]"
)

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "maniskill_tasks.md"


def _make(num_envs: int = 1, **kw):
    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv

    return ManiSkillEnv(ManiSkillConfig(**{"max_episode_steps": 20, **kw}), num_envs=num_envs)


def _table_rows() -> dict[str, list[str]]:
    rows = {}
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and re.match(r"^[\w-]+-v\d+$", cells[0]):
            rows[cells[0]] = cells
    return rows


def test_reward_modes_pass_through():
    """Same seed, same actions: PushCube's dense reward is 4x its normalized one (ManiSkill's max
    reward for the task), and the sparse reward is exactly the success signal."""
    g = torch.Generator().manual_seed(0)
    actions = torch.rand(1, 8, 8, generator=g) * 2 - 1
    rewards, success = {}, {}
    for mode in ("sparse", "dense", "normalized_dense"):
        env = _make(reward_mode=mode)
        try:
            assert env.envs[0].unwrapped.reward_mode == mode
            env.reset(seed=3)
            res = env.chunk_step(actions)
            rewards[mode], success[mode] = res.rewards, res.success
        finally:
            env.close()
    assert float(rewards["dense"].abs().sum()) > 0
    torch.testing.assert_close(rewards["dense"], 4.0 * rewards["normalized_dense"], rtol=1e-5, atol=1e-6)
    assert torch.equal(rewards["sparse"], success["sparse"].float())
    assert not torch.equal(rewards["sparse"], rewards["dense"])


@pytest.mark.parametrize("task, close", [("PickCub-v1", "PickCube-v1"), ("stackcube", "StackCube-v1")])
def test_unknown_task_says_did_you_mean(task, close):
    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv

    with pytest.raises(
        EnvError, match=rf"unknown ManiSkill task env.task='{task}'\. Did you mean \[.*'{close}'"
    ) as e:
        ManiSkillEnv.validate_config(ManiSkillConfig(task=task))
    assert "\n" not in str(e.value)


def test_missing_asset_names_asset_command_and_place():
    """PickSingleYCB needs the YCB object set, which is not on this machine: a start-up error (no
    download prompt, no stack trace) that names the asset, the command and where it goes."""
    from simulators.maniskill_tasks import asset_dir, missing_assets

    if not missing_assets("PickSingleYCB-v1"):
        pytest.skip("the YCB assets are installed here")
    with pytest.raises(EnvError) as e:
        _make(task="PickSingleYCB-v1")
    msg = str(e.value)
    assert "\n" not in msg
    assert "['ycb']" in msg and "`python -m mani_skill.utils.download_asset ycb`" in msg
    assert str(asset_dir()) in msg and "mani_skill2_ycb" in msg


def test_download_prompt_and_missing_scene_become_clear_errors():
    """Past the start-up check, ManiSkill itself meets the missing files: its (y|n) download prompt
    (stdin closed, so it reads EOF) and a scene dataset it opens without declaring are both turned
    into the same clear error."""
    from simulators.maniskill import ManiSkillConfig, _make_quietly, make_kwargs
    from simulators.maniskill_tasks import import_maniskill, missing_assets

    gym = import_maniskill()
    for task, asset in (("PickSingleYCB-v1", "ycb"), ("ReplicaCAD_SceneManipulation-v1", "ReplicaCAD")):
        if not missing_assets(task):
            continue
        kwargs = make_kwargs(
            ManiSkillConfig(task=task, control_mode=""), sim_backend="cpu", num_envs=1, render=False
        )
        with pytest.raises(EnvError, match=rf"download_asset {asset}`"):
            _make_quietly(gym, task, kwargs)


def test_reward_and_control_modes_the_task_lacks():
    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv

    with pytest.raises(
        EnvError,
        match=r"'PlugCharger-v1' has no working 'dense' reward; set env.reward_mode to one of \['sparse'\]",
    ):
        ManiSkillEnv.validate_config(ManiSkillConfig(task="PlugCharger-v1", reward_mode="dense"))
    with pytest.raises(
        EnvError, match=r"declared, but its dense reward is not implemented.*\['normalized_dense'\]"
    ):
        ManiSkillEnv.validate_config(ManiSkillConfig(task="MS-HumanoidWalk-v1", reward_mode="dense"))
    with pytest.raises(EnvError, match="env.reward_mode='shaped' is unknown"):
        ManiSkillEnv.validate_config(ManiSkillConfig(reward_mode="shaped"))
    with pytest.raises(
        EnvError, match=r"env.control_mode='pd_warp'.*pd_joint_delta_pos.*env.control_mode=''"
    ):
        _make(control_mode="pd_warp")


def test_camera_the_task_lacks_names_its_cameras():
    with pytest.raises(EnvError, match=r"'PushCube-v1' does not have; its cameras are \['base_camera'\]"):
        _make(num_envs=2, cameras=["wrist"])


def test_real_simulator_failure_names_task_seed_and_state_id(monkeypatch):
    """MS-HumanoidWalk-v1 declares a dense reward that ManiSkill 3.0.1 does not implement: with the
    start-up guard lifted, its real NotImplementedError inside step is reported naming env, task,
    seed and reset-state id (what a crashed env worker's report carries back through Ray)."""
    from simulators import maniskill_tasks
    from simulators.serial import SimulatorCrash

    monkeypatch.delitem(maniskill_tasks.BROKEN_REWARD_MODES, "MS-HumanoidWalk-v1")
    env = _make(task="MS-HumanoidWalk-v1", reward_mode="dense")
    try:
        env.reset(reset_state_ids=[7])
        with pytest.raises(
            SimulatorCrash,
            match=r"env 0 .*task 'MS-HumanoidWalk-v1', seed 7, reset_state_id 7\) crashed in step: NotImplementedError",
        ):
            env.chunk_step(torch.zeros(1, 2, env.spec.action_dim))
    finally:
        env.close()


def test_simulator_crash_names_task_and_seed():
    """A failure inside ManiSkill's step in the second of two envs (injected at the simulator
    boundary) names that env and its seed; the env still works after."""
    from simulators.serial import SimulatorCrash

    env = _make(num_envs=2)
    try:
        env.reset(seed=[40, 41])
        inner = env.envs[1]

        def broken_step(action):
            raise RuntimeError("PhysX: invalid parameter")

        inner.step = broken_step
        with pytest.raises(
            SimulatorCrash,
            match=r"env 1 .*task 'PushCube-v1', seed 41, reset_state_id None\) crashed in step: RuntimeError",
        ):
            env.chunk_step(torch.zeros(2, 1, env.spec.action_dim))
        del inner.step
        assert tuple(env.chunk_step(torch.zeros(2, 1, env.spec.action_dim)).rewards.shape) == (2, 1)
    finally:
        env.close()


def test_task_table_covers_the_registry_and_offline_tasks_have_instructions():
    """docs/maniskill_tasks.md (scripts/audit_maniskill_tasks.py) lists every registered task; each
    task it found working offline has its own instruction, and the asset column agrees with the
    start-up check."""
    from simulators.maniskill_tasks import INSTRUCTIONS, missing_assets, registered_tasks

    rows = _table_rows()
    assert set(rows) == set(registered_tasks()), "regenerate with python scripts/audit_maniskill_tasks.py"
    offline = [t for t, c in rows.items() if c[1] == "yes"]
    assert {"PushCube-v1", "PickCube-v1", "StackCube-v1", "PegInsertionSide-v1", "PushT-v1"} <= set(offline)
    assert [t for t in offline if t not in INSTRUCTIONS] == []
    for task, cells in rows.items():
        assert (cells[2] != "-") == bool(missing_assets(task)), task


CONFIGS = sorted(p.stem for p in (ROOT / "configs" / "env").glob("maniskill*.yaml") if "gpu" not in p.stem)


@pytest.mark.parametrize("name", CONFIGS)
def test_env_configs_compose_and_validate(name):
    from simulators.registry import env_class
    from vlarl.config import load_train_config

    cfg = load_train_config([PPO, f"env={name}"])
    assert cfg.env.name == ("maniskill_multitask" if "multitask" in name else "maniskill")
    env_class(cfg.env.name).validate_config(cfg.env)  # task id(s), reward mode, assets


def test_any_task_through_the_generic_config():
    from simulators.maniskill import ManiSkillEnv
    from vlarl.config import load_train_config

    cfg = load_train_config([PPO, "env=maniskill", "env.task=RollBall-v1", "env.reward_mode=sparse"])
    assert (cfg.env.task, cfg.env.reward_mode) == ("RollBall-v1", "sparse")
    ManiSkillEnv.validate_config(cfg.env)


def test_physx_gpu_library_out_of_reach_is_one_line_naming_the_copy():
    """SAPIEN downloads its GPU PhysX library the first time a physx_cuda scene is made; the lent H200 reaches
    no network, and the raw error was a 40-line requests traceback that blamed assets. The network is the
    boundary here (it cannot exist on the GPU machine): gym.make raises what requests raised there."""
    import requests

    from simulators.maniskill import _make_quietly

    url = ("https://github.com/sapien-sim/physx-precompiled/releases/download/105.1-physx-5.3.1.patch0/"
           "linux-so.zip")

    class NoNetworkGym:
        @staticmethod
        def make(task, **kwargs):
            raise requests.exceptions.ConnectionError(f"HTTPSConnectionPool: Max retries exceeded with url: {url}")

    with pytest.raises(EnvError) as err:
        _make_quietly(NoNetworkGym, "PushCube-v1", {"sim_backend": "physx_cuda"})
    msg = str(err.value)
    assert "\n" not in msg and "GPU PhysX library" in msg
    assert "~/.sapien/physx/105.1-physx-5.3.1.patch0/libPhysXGpu_64.so" in msg
    assert "env.sim_backend=cpu" in msg and "download_asset" not in msg
