"""ManiSkill GPU-parallel adapter: clear errors on CPU machines, and the physx_cuda run on a GPU."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from simulators.base import EnvError

needs_maniskill = pytest.mark.skipif(
    importlib.util.find_spec("mani_skill") is None, reason="pip install -e .[maniskill]"
)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="physx_cuda needs a CUDA GPU")
# the batched-env contract (tests/simulators/test_contract.py), run on physx_cuda with 4 scenes
CONTRACT_CHECKS = ["test_schema_and_spec", "test_chunk_auto_reset_final_obs_and_metrics",
                   "test_determinism_under_seed", "test_reset_state_ids", "test_bad_actions_are_clear_errors"]


@needs_maniskill
def test_backend_errors_name_the_fix():
    from simulators.maniskill_gpu import ManiSkillGPUConfig, ManiSkillGPUEnv

    with pytest.raises(EnvError, match="env=maniskill"):
        ManiSkillGPUEnv.validate_config(ManiSkillGPUConfig(sim_backend="cpu"), num_envs=4)
    with pytest.raises(EnvError, match="unknown"):
        ManiSkillGPUEnv.validate_config(ManiSkillGPUConfig(sim_backend="vulkan"), num_envs=1)
    if not torch.cuda.is_available():
        with pytest.raises(EnvError, match="needs a CUDA GPU"):
            ManiSkillGPUEnv.validate_config(ManiSkillGPUConfig(sim_backend="physx_cuda"), num_envs=64)


@needs_maniskill
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="physx_cuda needs a CUDA GPU")
def test_physx_cuda_batch_stays_on_gpu_with_partial_resets_and_groups():
    from simulators.maniskill_gpu import ManiSkillGPUConfig
    from simulators.registry import make_env

    B, T = 64, 4
    env = make_env(ManiSkillGPUConfig(task="PushCube-v1", max_episode_steps=6), num_envs=B)
    try:
        ids = [i // 8 for i in range(B)]  # 8 GRPO groups of 8
        obs = env.reset(reset_state_ids=ids)
        assert obs["state"].device.type == "cuda"
        s = obs["state"].view(8, 8, -1)
        assert bool((s == s[:, :1]).all()), "envs of one group differ"
        a = torch.zeros(B, T, env.spec.action_dim, device="cuda")
        r1 = env.chunk_step(a)
        r2 = env.chunk_step(a)
        assert r1.rewards.device.type == "cuda" and r2.final_obs is not None
        assert bool(r2.done.all()) and int(r2.step_mask.sum()) == 2 * B
        assert bool((r2.episode["episode_len"] == 6).all())
        s2 = r2.obs["state"].view(8, 8, -1)
        assert bool((s2 == s2[:, :1]).all()), "groups differ after the partial reset"
        torch.testing.assert_close(r2.obs["state"], obs["state"], rtol=0, atol=1e-5)  # back to the group's start
    finally:
        env.close()


@needs_maniskill
def test_group_scene_restarts_from_its_initial_state_after_auto_reset():
    """reset_state_ids pin a scene through auto-resets: after its episode ends (mid-chunk), the scene
    starts again from the state it had at reset, whatever happened in between. Same code path as
    physx_cuda (ManiSkill's partial reset with reset_to_env_states), run on the CPU backend."""
    from simulators.maniskill_gpu import ManiSkillGPUConfig
    from simulators.registry import make_env

    env = make_env(ManiSkillGPUConfig(task="PushCube-v1", sim_backend="cpu", max_episode_steps=6), num_envs=1)
    try:
        start = env.reset(reset_state_ids=[3])["state"].clone()
        g = torch.Generator().manual_seed(0)
        low, high = torch.as_tensor(env.spec.action_low), torch.as_tensor(env.spec.action_high)
        act = lambda: low + (high - low) * torch.rand(1, 4, env.spec.action_dim, generator=g)  # noqa: E731
        r1 = env.chunk_step(act())
        assert not torch.allclose(r1.obs["state"], start), "random actions left the scene where it started"
        r2 = env.chunk_step(act())
        assert bool(r2.done.all()) and r2.final_obs is not None
        assert not torch.allclose(r2.final_obs["state"], start)
        torch.testing.assert_close(r2.obs["state"], start, rtol=0, atol=1e-5)
        r3 = env.chunk_step(act())  # the restarted episode runs on from there
        assert int(r3.step_mask.sum()) == 4
    finally:
        env.close()


@pytest.fixture(scope="module")
def cuda_sim():
    from tests.helpers.sim_cases import SimCase, build

    case = SimCase("maniskill_gpu", dict(task="PushCube-v1", obs_mode="state", sim_backend="physx_cuda",
                                         max_episode_steps=6), 4, "mani_skill")
    env = build(case)
    yield case, env
    env.close()


@needs_maniskill
@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("check", CONTRACT_CHECKS)
def test_contract_on_physx_cuda(cuda_sim, check):
    """The CUDA variant of the simulator contract: the same checks, on GPU tensors."""
    import tests.simulators.test_contract as contract  # the module, so its tests are not collected here again

    getattr(contract, check)(cuda_sim)


def test_cuda_contract_runs_every_contract_check():
    """A check added to the contract is run on physx_cuda too (names kept in step)."""
    import tests.simulators.test_contract as contract

    assert sorted(CONTRACT_CHECKS) == sorted(n for n in dir(contract) if n.startswith("test_"))


@needs_maniskill
def test_env_worker_builds_its_simulator_on_the_gpu_it_is_bound_to(monkeypatch):
    """An env worker placed on GPU 3 makes that GPU torch's current device before it builds its envs, and the
    physx_cuda adapter names the current device to ManiSkill (sim and render). No CUDA here: the device index
    is faked (torch.cuda.set_device / current_device recorded), the env itself runs on the CPU backend."""
    import simulators.maniskill_gpu as msg
    from simulators.maniskill_gpu import ManiSkillGPUConfig
    from vlarl.scheduler.placement import WorkerPlacement
    from vlarl.workers.env_worker import EnvWorker

    current = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: current.append(torch.device(d).index))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[-1])
    placed = WorkerPlacement("env", 0, devices=[3], device_type="gpu", pin=False)
    worker = EnvWorker(ManiSkillGPUConfig(task="PushCube-v1", sim_backend="cpu", max_episode_steps=6), 1, 0,
                       placement=placed)
    try:
        assert current == [3]
        assert msg.sim_backends(ManiSkillGPUConfig(sim_backend="physx_cuda")) == ("physx_cuda:3", "cuda:3")
        assert msg.sim_backends(ManiSkillGPUConfig(sim_backend="cpu")) == ("physx_cpu", None)
        assert worker.reset([0])["state"].shape[0] == 1
    finally:
        worker.close()
    current.clear()  # a worker without a placement keeps the caller's device
    unplaced = EnvWorker(ManiSkillGPUConfig(task="PushCube-v1", sim_backend="cpu", max_episode_steps=6), 1, 0)
    unplaced.close()
    assert current == []


@needs_maniskill
@pytest.mark.gpu
@needs_cuda
def test_env_worker_on_a_bound_gpu_steps_there():
    from simulators.maniskill_gpu import ManiSkillGPUConfig
    from vlarl.scheduler.placement import WorkerPlacement
    from vlarl.workers.env_worker import EnvWorker

    last = torch.cuda.device_count() - 1
    placed = WorkerPlacement("env", 0, devices=[last], device_type="gpu", pin=False)
    worker = EnvWorker(ManiSkillGPUConfig(task="PushCube-v1", max_episode_steps=6), 16, 0, placement=placed)
    try:
        assert worker.envs[0].device == torch.device("cuda", last)
        worker.reset(list(range(16)))
        r = worker.chunk_step(torch.zeros(16, 2, worker.spec().action_dim, device=f"cuda:{last}"))
        assert r.rewards.device == torch.device("cuda", last)
    finally:
        worker.close()
