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
