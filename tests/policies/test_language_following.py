"""A VLA that reads: the tiny exact SmolVLA fixture, SFT'd on the language task ``PushCubeToColor-v1``
(``scripts/make_language_fixture.py``), pushes the cube towards the goal its instruction names. The same start
states are played twice, once with the words naming the red goal and once with the words naming the blue one;
the goal the cube ends nearer to must follow the words in most episodes. A policy that ignores its instruction
reaches the same goal both times and fails this test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("mani_skill")

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "language" / "smolvla"
SEEDS = [1_000_000 + i for i in range(4)]  # held-out start states (demonstrations used seeds 0..)
B = len(SEEDS)


def _final_goal_reached(policy, env, colour: str) -> np.ndarray:
    """Play one episode per env from ``SEEDS`` with the instruction naming ``colour``; return, per env, which goal
    the cube ends nearer to (True: red)."""
    from simulators.language_tasks import instruction_for_colour

    obs = env.reset(seed=SEEDS)
    tasks = [e.unwrapped for e in env.envs]
    done = np.zeros(B, dtype=bool)
    nearer_red = np.zeros(B, dtype=bool)
    words = [instruction_for_colour(colour)] * B
    while not done.all():
        with torch.no_grad():
            actions = policy.act({**obs, "instruction": words})
        for i, t in enumerate(tasks):  # where the cube is now, for envs whose first episode is still running
            if not done[i]:
                cube = t.obj.pose.p[0, :2]
                d_red = float((cube - t.goals["red"].pose.p[0, :2]).norm())
                d_blue = float((cube - t.goals["blue"].pose.p[0, :2]).norm())
                nearer_red[i] = d_red < d_blue
        r = env.chunk_step(actions)
        done |= r.done.numpy()
        obs = r.obs
    return nearer_red


@pytest.mark.skipif(not FIXTURE.is_dir(), reason="make it with scripts/make_language_fixture.py")
def test_swapping_the_instruction_changes_the_goal_reached():
    from policies.base import Policy
    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv
    from vlarl import system_env

    system_env.apply()
    torch.manual_seed(0)
    policy = Policy.from_pretrained(FIXTURE).eval()
    env = ManiSkillEnv(ManiSkillConfig(task="PushCubeToColor-v1", control_mode="pd_ee_delta_pos", obs_mode="state",
                                       reward_mode="normalized_dense", max_episode_steps=25), num_envs=B)
    try:
        to_red = _final_goal_reached(policy, env, "red")
        to_blue = _final_goal_reached(policy, env, "blue")
    finally:
        env.close()
    follows = int((to_red & ~to_blue).sum())  # red words -> red goal and blue words -> blue goal
    assert follows >= B - 1, (f"the cube followed the words in {follows} of {B} start states "
                              f"(nearer red with red words {to_red.tolist()}, with blue words {to_blue.tolist()})")


@pytest.mark.heavy
@pytest.mark.skipif(not FIXTURE.is_dir(), reason="make it with scripts/make_language_fixture.py")
def test_vlarl_eval_swaps_the_words_with_a_task_kwarg(tmp_path):
    """``vlarl-eval checkpoint=<fixture> +env.task_kwargs.instruction=other``: the saved env config is kept and the
    override reaches the task (recorded in eval.json), so the same held-out episodes are played with the other
    goal's words."""
    import json
    import subprocess
    import sys
    from pathlib import Path as P

    exe = P(sys.executable).parent / "vlarl-eval"
    out = tmp_path / "other"
    res = subprocess.run([str(exe), f"checkpoint={FIXTURE}", "episodes=2", "num_envs=2", "num_workers=1",
                          "video_episodes=0", f"output={out}", "+env.task_kwargs.instruction=other"],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    ev = json.loads((out / "eval.json").read_text())
    assert ev["task"] == "PushCubeToColor-v1"
    assert ev["env_config"]["task_kwargs"] == {"instruction": "other"}
    assert ev["env_config"]["control_mode"] == "pd_ee_delta_pos"  # the rest comes from the checkpoint's env.json
