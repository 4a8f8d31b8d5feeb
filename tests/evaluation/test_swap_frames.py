"""vlarl-eval swap_frames=true: a pixel policy evaluated on another scene's frames (does it read its cameras?)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.recipes import PPO
from vlarl.evaluation.ablation import FramesFromAnotherScene, check_swap_plan

pytestmark = pytest.mark.sim


def _rgb_env_cfg():
    from vlarl.config.loader import load_train_config

    return load_train_config([PPO, "env=maniskill_pushcube_rgb", "env.image_size=32"]).env


@pytest.fixture(scope="module")
def oft_checkpoint(tmp_path_factory) -> Path:
    """A tiny random-init OpenVLA-OFT that reads the 32 px base camera of PushCube, saved as training saves it."""
    from policies import make_policy
    from simulators.registry import make_env
    from vlarl.config.loader import load_train_config
    from vlarl.runner import policy_spec_from_env

    env_cfg = _rgb_env_cfg()
    saved = json.dumps(asdict(env_cfg))  # before the env is built (building may fill fields in)
    probe = make_env(env_cfg, num_envs=1)
    spec = policy_spec_from_env(probe.spec)
    probe.close()
    torch.manual_seed(0)
    cfg = load_train_config([PPO, "env=maniskill_pushcube_rgb", "env.image_size=32", "policy=openvla_oft",
                             "policy.chunk_size=2"]).policy
    directory = tmp_path_factory.mktemp("swap") / "ckpt"
    make_policy(cfg, spec).save_pretrained(directory)
    (directory / "env.json").write_text(saved)
    return directory


class _Recorder:
    """Acts zero and keeps what it was shown."""

    name, spec = "recorder", None

    def __init__(self):
        self.seen: list[dict] = []

    def act(self, obs):
        self.seen.append(obs)
        return torch.zeros(len(obs["state"]), 1, 1)


def test_each_env_gets_the_next_scenes_frames_and_keeps_its_own_state():
    from simulators.registry import make_env

    env = make_env(_rgb_env_cfg(), num_envs=3)
    try:
        obs = env.reset(seed=[1_000_000, 1_000_001, 1_000_002])
    finally:
        env.close()
    rec = _Recorder()
    FramesFromAnotherScene(rec).act(obs)
    shown = rec.seen[0]
    for key, frames in obs["images"].items():
        frames = np.asarray(frames)
        assert not np.array_equal(frames[0], frames[1]), "three seeds must be three scenes"
        got = np.asarray(shown["images"][key])
        for i in range(3):
            np.testing.assert_array_equal(got[i], frames[(i - 1) % 3])
    np.testing.assert_array_equal(np.asarray(shown["state"]), np.asarray(obs["state"]))
    assert shown.get("instruction") == obs.get("instruction")


def test_batches_that_cannot_swap_are_refused():
    with pytest.raises(ValueError, match="no camera frames"):
        FramesFromAnotherScene(_Recorder()).act({"state": torch.zeros(2, 3), "images": {}})
    with pytest.raises(ValueError, match="at least 2 envs"):
        FramesFromAnotherScene(_Recorder()).act({"state": torch.zeros(1, 3),
                                                 "images": {"base": torch.zeros(1, 4, 4, 3, dtype=torch.uint8)}})
    with pytest.raises(ValueError, match=r"num_envs=4"):
        check_swap_plan(7, 3)  # a last batch of one episode
    with pytest.raises(ValueError, match=r"e\.g\. num_envs=4\)"):
        check_swap_plan(7, 2)  # the suggestion fits: 7 over 3 would leave one too
    with pytest.raises(ValueError, match="num_envs >= 2"):
        check_swap_plan(100, 1)
    check_swap_plan(100, 6)  # last batch of 4: fine
    check_swap_plan(3, 6)  # one batch of 3 envs (never more envs than episodes)


def test_cli_swapped_evaluation_differs_and_is_recorded(oft_checkpoint, tmp_path):
    from vlarl.evaluation.cli import main

    common = [f"checkpoint={oft_checkpoint}", "episodes=4", "num_envs=2", "video_episodes=0"]
    assert main([*common, f"output={tmp_path / 'plain'}"]) == 0
    assert main([*common, "swap_frames=true"]) == 0  # the default folder: beside the plain one, not over it
    plain = json.loads((tmp_path / "plain" / "eval.json").read_text())
    swapped = json.loads((oft_checkpoint / "eval" / "PushCube-v1_seed1000000_swapped" / "eval.json").read_text())
    assert plain["swap_frames"] is False and swapped["swap_frames"] is True
    assert swapped["episodes"] == plain["episodes"] == 4
    assert [e["seed"] for e in swapped["per_episode"]] == [e["seed"] for e in plain["per_episode"]]
    # the policy reads its frames, so other frames move the arm elsewhere: the returns of the same seeds differ
    assert any(abs(a["return"] - b["return"]) > 1e-6 for a, b in zip(plain["per_episode"], swapped["per_episode"],
                                                                      strict=True))


@pytest.mark.parametrize("args,message", [
    (["episodes=5", "num_envs=2"], "leave a last batch of one scene"),
    (["episodes=4", "num_envs=1"], "num_envs >= 2"),
])
def test_cli_refuses_a_plan_that_cannot_swap(oft_checkpoint, tmp_path, capsys, args, message):
    from vlarl.evaluation.cli import main

    out = tmp_path / "out"
    assert main([f"checkpoint={oft_checkpoint}", "swap_frames=true", *args, f"output={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not out.exists()


def test_cli_refuses_a_state_only_checkpoint(tmp_path, capsys):
    from policies.base import PolicySpec
    from simulators.maniskill import ManiSkillConfig
    from tests.evaluation.conftest import save_tiny_checkpoint

    spec = PolicySpec(state_dim=35, action_dim=8, action_low=[-1.0] * 8, action_high=[1.0] * 8, task="PushCube-v1")
    ckpt = save_tiny_checkpoint(tmp_path / "ckpt", ManiSkillConfig(task="PushCube-v1", num_envs=2, num_workers=1),
                                spec)
    from vlarl.evaluation.cli import main

    out = tmp_path / "out"
    assert main([f"checkpoint={ckpt}", "swap_frames=true", "episodes=4", "num_envs=2", f"output={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "reads no camera" in err[0]
    assert not out.exists()
