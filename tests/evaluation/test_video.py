"""Evaluation videos (``vlarl.evaluation.video.record_video``): one frame per env step, grabbed through the
chunk stepper's declared observer, with the outcome's border on the frames after an episode ends."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mani_skill")

MAX_STEPS, FPS = 7, 4  # chunks of 5: an episode is a full chunk and 2 steps of the next (unless it succeeds)


def test_video_has_a_frame_per_env_step_and_bordered_endings(pushcube_checkpoint, tmp_path):
    import imageio.v2 as imageio

    from policies.base import Policy
    from simulators.frames import FAILURE_RGB, SUCCESS_RGB
    from simulators.maniskill import ManiSkillConfig
    from vlarl import system_env
    from vlarl.evaluation.video import record_video

    system_env.apply()
    policy = Policy.from_pretrained(pushcube_checkpoint).eval()
    cfg = ManiSkillConfig(task="PushCube-v1", obs_mode="state", max_episode_steps=MAX_STEPS)
    path = record_video(policy, cfg, tmp_path / "v" / "eval.mp4", episodes=2, seed=1_000_000, fps=FPS)
    frames = imageio.mimread(path)
    # reset frame + one per control step of the longest episode + one second holding the ends; one frame
    # per chunk would give 1 + 2 frames before the hold
    assert len(frames) == 1 + MAX_STEPS + FPS
    assert len({f.shape for f in frames}) == 1
    assert not np.allclose(frames[1], frames[MAX_STEPS], atol=8)  # the arm moved across the steps' frames
    last = frames[-1].astype(int)
    corner = last[-5, 5]  # bottom-left pixel of the first tile: the border of its outcome (video codec blurs it)
    assert min(np.abs(corner - np.array(c)).max() for c in (SUCCESS_RGB, FAILURE_RGB)) < 40
    first = frames[0].astype(int)[-5, 5]
    assert min(np.abs(first - np.array(c)).max() for c in (SUCCESS_RGB, FAILURE_RGB)) >= 40  # no border yet


def test_no_mp4_writer_is_one_clear_error_before_any_rendering(monkeypatch, tmp_path):
    """Without imageio-ffmpeg (the GPU image of 2026-11-30) imageio chose tifffile by the .mp4 name and failed
    after the episodes ran; now the missing writer is named before an env is made (env_cfg=None would fail
    differently if one were)."""
    import sys

    from vlarl.evaluation.video import record_video

    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # `import imageio_ffmpeg` raises ImportError
    with pytest.raises(RuntimeError, match=r"needs the imageio-ffmpeg package \(pip install imageio-ffmpeg\)"):
        record_video(object(), None, tmp_path / "eval.mp4", episodes=1, seed=0)
    assert not (tmp_path / "eval.mp4").exists()


def test_a_video_that_fails_keeps_the_evaluation(pushcube_checkpoint, monkeypatch, tmp_path, capsys):
    """The numbers are written before the video; a failing video is one line on stderr and a
    ``video_errors`` entry, and the evaluation still returns its summary (on the H200 a missing MP4 writer
    lost a finished 100-episode evaluation and ended the run)."""
    import json

    from policies.base import Policy
    from simulators.maniskill import ManiSkillConfig
    from vlarl.evaluation import protocol, video

    def broken(*args, **kwargs):
        raise RuntimeError("no MP4 writer here")

    monkeypatch.setattr(video, "record_video", broken)
    policy = Policy.from_pretrained(pushcube_checkpoint).eval()
    cfg = ManiSkillConfig(task="PushCube-v1", obs_mode="state", max_episode_steps=MAX_STEPS)
    res = protocol.evaluate(policy, cfg, episodes=2, seed=1_000_000, num_envs=2, output_dir=tmp_path,
                            video_episodes=1, progress=False)
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["episodes"] == 2 and len(saved["per_episode"]) == 2 and 0.0 <= saved["success_once"] <= 1.0
    assert saved["video_errors"] == {"PushCube-v1": "RuntimeError: no MP4 writer here"} and "video" not in saved
    assert res["success_once"] == saved["success_once"] and (tmp_path / "eval.md").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"[vlarl] no video of PushCube-v1: RuntimeError: no MP4 writer here (the numbers are in "
                   f"{tmp_path / 'eval.json'})"]
