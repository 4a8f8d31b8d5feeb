"""Demonstrations for a pixel RLPD actor: state demonstrations replayed in vlarl's RGB env record the frames the
policy reads (``simulators.maniskill_rerender``), read back by ``read_maniskill_h5(cameras=...)`` equal to a fresh
render of the same seed and step; ``SACState`` of a CNN actor replays them with their images through
``sac_update``; demonstrations without the actor's camera, or at another size, are refused in one line (and by
``vlarl-train`` before anything is written)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from policies.base import PolicySpec
from policies.cnn.modeling import CNNPolicy, CNNPolicyConfig
from simulators.maniskill import ManiSkillConfig
from simulators.maniskill_rerender import rerender_file
from simulators.registry import make_env
from tests.helpers.checkpoints import tree_hash
from vlarl.algorithms.sac import SACState, pixel_demos_problem, sac_update
from vlarl.cli import train_main
from vlarl.config.schema import RLPDConfig
from vlarl.data.demonstrations import CameraEpisode, demo_cameras, read_maniskill_h5
from vlarl.data.expert_demos import record_demos
from vlarl.data.trajectory import Trajectory

pytestmark = pytest.mark.sim
torch.set_num_threads(1)

CAM, S, T = "base_camera", 32, 2


def rgb_cfg(size: int = S) -> ManiSkillConfig:
    """PushCube as configs/experiment/pushcube_rgb_rlpd.yaml sets it up, at ``size`` px."""
    return ManiSkillConfig(task="PushCube-v1", control_mode="pd_ee_delta_pos", obs_mode="rgb", image_size=size,
                           reward_mode="sparse", ignore_terminations=False)


@pytest.fixture(scope="module")
def demos(tmp_path_factory) -> tuple[Path, Path]:
    """One scripted-expert PushCube episode (state, seed 0) and its re-rendered copy at 32 px."""
    root = tmp_path_factory.mktemp("pixel_demos")
    state = root / "state.h5"
    record_demos(state, episodes=1, seed=0, log=lambda m: None)
    rendered = root / "rgb.h5"
    logs: list[str] = []
    done = rerender_file(state, rendered, rgb_cfg(), log=logs.append)
    assert len(done) == 1 and done[0].solved and "success at step" in logs[0], logs
    return state, rendered


def test_rerendered_frames_match_a_fresh_render_of_the_same_seed_and_step(demos):
    state_file, rendered = demos
    (src,) = read_maniskill_h5(state_file)
    (ep,) = read_maniskill_h5(rendered, cameras=[CAM])
    assert isinstance(ep, CameraEpisode) and ep.success
    L = len(ep.actions)
    assert L == len(src.actions) and np.array_equal(ep.actions, src.actions)
    frames = ep.images[CAM]
    assert frames.shape == (L, S, S, 3) and frames.dtype == np.uint8 and ep.final_images[CAM].shape == (S, S, 3)
    assert demo_cameras(rendered) == {CAM: (S, S)} and demo_cameras(state_file) == {}
    # the frames change as the arm moves: not one image repeated
    assert not np.array_equal(frames[0], ep.final_images[CAM])
    env = make_env(rgb_cfg(), num_envs=1)  # a fresh env from the same seed, stepped to each recorded step
    try:
        obs = env.reset(seed=[0])
        seen = {0: (obs["images"][CAM][0], obs["state"][0])}
        for i, a in enumerate(ep.actions):
            res = env.chunk_step(a[None, None, :])
            last = res.final_obs if res.final_obs is not None else res.obs
            seen[i + 1] = (last["images"][CAM][0], last["state"][0])
    finally:
        env.close()
    assert bool(res.success[0, 0])  # the replay ends in the success the demonstration records
    for i in range(L):
        assert np.array_equal(frames[i], seen[i][0]), f"frame {i} differs from a fresh render"
        assert np.allclose(ep.state[i], seen[i][1], atol=1e-5)
    assert np.array_equal(ep.final_images[CAM], seen[L][0])
    # the RGB env's state vector, not the state env's (ManiSkill leaves the cube's pose out of obs_mode=rgb)
    assert ep.state.shape[1] == len(seen[0][1]) and ep.state.shape[1] != src.state.shape[1]


def _pixel_policy(rendered: Path) -> tuple[CNNPolicy, PolicySpec]:
    (ep,) = read_maniskill_h5(rendered, cameras=[CAM])
    D, A = ep.state.shape[1], ep.actions.shape[1]
    spec = PolicySpec(state_dim=D, action_dim=A, action_low=[-1.0] * A, action_high=[1.0] * A, image_keys=[CAM],
                      image_size=[S, S], instruction="push the cube")
    cfg = CNNPolicyConfig(image_size=S, cnn_channels=[8], vision_dim=16, text_encoder="none",
                          hidden_sizes=[32, 32], chunk_size=T, squash=True)
    return CNNPolicy(cfg, spec), spec


def test_pixel_rlpd_update_replays_image_demonstrations(demos):
    _, rendered = demos
    torch.manual_seed(0)
    policy, spec = _pixel_policy(rendered)
    cfg = RLPDConfig(demos=str(rendered), num_demos=20, num_steps=1, batch_size=16, buffer_size=256,
                     learning_starts=4, utd_ratio=1.0, critic_hidden_sizes=[32, 32], num_critics=4)
    st = SACState(policy, cfg, spec)
    (ep,) = read_maniskill_h5(rendered, cameras=[CAM])
    L = len(ep.actions)
    demo_rows = st.replay.demos.buffer.storage[:L]
    assert len(st.replay.demos) == L
    # the demonstration transitions carry the recorded frames: the obs at each step, the next one a chunk later
    assert torch.equal(demo_rows["images", CAM], torch.as_tensor(ep.images[CAM]))
    assert torch.equal(demo_rows["next_images", CAM][0], torch.as_tensor(ep.images[CAM][T]))
    assert bool(demo_rows["terminated"][-1]) and float(demo_rows["step_rewards"][-1].sum()) == 1.0
    # one online iteration: B envs at the demonstration's first observations, the policy's own chunks
    B = 8
    obs = {"state": torch.as_tensor(ep.state[:B]), "images": {CAM: torch.as_tensor(ep.images[CAM][:B])},
           "instruction": []}
    sample = policy.sample(obs)
    z = torch.zeros(1, B)
    traj = Trajectory(obs={k: (v[None] if k == "state" else {CAM: v[CAM][None]} if k == "images" else v)
                           for k, v in obs.items()},
                      replay={k: v[None] for k, v in sample.replay.items()}, logprob=sample.logprob[None],
                      values=z, rewards=z, dones=z, truncated=z, final_values=z, next_value=torch.zeros(B),
                      step_rewards=torch.zeros(1, B, T), step_mask=torch.ones(1, B, T, dtype=torch.bool),
                      next_state=torch.as_tensor(ep.state[1:B + 1])[None],
                      next_images={CAM: torch.as_tensor(ep.images[CAM][1:B + 1])[None]})
    encoder = [p.detach().clone() for p in st.encoder.parameters()]
    metrics = sac_update(policy, torch.optim.Adam(policy.parameters(), lr=1e-3), traj, cfg, state=st)
    assert metrics["critic_steps"] == B and metrics["demo_fraction"] == 0.5
    assert math.isfinite(metrics["critic_loss"]) and math.isfinite(metrics["actor_loss"])
    assert any(not torch.equal(a, b) for a, b in zip(encoder, st.encoder.parameters(), strict=True))


def test_demonstrations_without_the_actors_camera_are_refused_in_one_line(demos, tmp_path, monkeypatch, capsys):
    state_file, rendered = demos
    policy, _ = _pixel_policy(rendered)
    assert pixel_demos_problem(policy, RLPDConfig(demos=str(rendered))) is None
    assert pixel_demos_problem(policy, RLPDConfig(demos="auto")) is None  # made from the run's own RGB env
    msg = pixel_demos_problem(policy, RLPDConfig(demos=str(state_file)))
    assert msg is not None and "\n" not in msg
    assert "holds state-only demonstrations" in msg and "['base_camera']" in msg and "algorithm.demos=auto" in msg
    other, _ = _pixel_policy(rendered)
    other.spec.image_size = (64, 64)
    msg = pixel_demos_problem(other, RLPDConfig(demos=str(rendered)))
    assert msg is not None and "\n" not in msg and "(32, 32)" in msg and "(64, 64)" in msg
    with pytest.raises(ValueError, match="holds no frames of camera"):
        read_maniskill_h5(state_file, cameras=[CAM])
    # vlarl-train refuses before a run directory exists
    monkeypatch.chdir(tmp_path)
    before = tree_hash(tmp_path)
    assert train_main(["experiment=pushcube_rgb_rlpd", f"algorithm.demos={state_file}", "run_dir=run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds state-only demonstrations" in err[0], err
    assert tree_hash(tmp_path) == before and not (tmp_path / "run").exists()


def test_the_cache_key_holds_the_frames_size():
    from vlarl.demos import cache_folder, planning_env, retime_choice

    cfg = rgb_cfg(64)
    assert cache_folder(cfg, 20, retime=True).name == "PushCube-v1_pd_ee_delta_pos_rgb64_n20_retimed"
    assert cache_folder(rgb_cfg(32), 20, retime=True) != cache_folder(cfg, 20, retime=True)
    # planned and re-timed with state observations (PushCube's default there), the RGB config left as it was
    assert planning_env(cfg).obs_mode == "state" and cfg.obs_mode == "rgb" and retime_choice(None, cfg)


@pytest.mark.slow
def test_vlarl_demos_with_an_rgb_env_writes_frames(tmp_path, capsys):
    """The whole path: ManiSkill's planner, the replay, re-timing in state, re-rendering in the RGB env."""
    from simulators.maniskill_demos import planner_python
    from vlarl.demos import main

    if not planner_python().exists():
        pytest.skip("the motion planner's environment is not installed: bash scripts/setup_planner.sh")
    out = tmp_path / "demos"
    assert main(["env=maniskill_pushcube_rgb", "env.control_mode=pd_ee_delta_pos", f"env.image_size={S}",
                 "env.reward_mode=sparse", "env.ignore_terminations=false", f"output={out}", "episodes=1",
                 "lerobot=false"]) == 0
    assert '"rendered": 1' in capsys.readouterr().out
    (ep,) = read_maniskill_h5(out / "trajectories.h5", cameras=[CAM])
    assert ep.success and ep.images[CAM].shape == (len(ep.actions), S, S, 3) and len(ep.actions) < 20
