"""``vlarl-eval checkpoint=<dir> env.<key>=...`` without ``env=``: the keys go to the checkpoint's own env (its
env.json) and are checked against that env's fields, so one task of a multi-task checkpoint is evaluated alone with
``env.tasks=[...]``; a key that env lacks, a dropped key, or a task argument its constructor lacks is one line."""

from __future__ import annotations

import json

import pytest

from tests.helpers.checkpoints import pushcube_checkpoint
from tests.helpers.refusals import assert_one_line_refusal

pytest.importorskip("mani_skill")
pytestmark = pytest.mark.sim


@pytest.fixture
def multitask_checkpoint(tmp_path):
    """The tiny PushCube MLP saved as if trained on PushCube and PullCube (full state: 35 dims each)."""
    ck = pushcube_checkpoint(tmp_path / "ck")
    (ck / "env.json").write_text(json.dumps({
        "name": "maniskill_multitask", "tasks": ["PushCube-v1", "PullCube-v1"], "obs_mode": "state", "state": "full",
        "control_mode": "pd_joint_delta_pos", "max_episode_steps": 2}))
    return ck


def test_env_tasks_evaluates_one_task_of_a_multitask_checkpoint(multitask_checkpoint, tmp_path, capsys):
    from vlarl.cli import eval_main

    out = tmp_path / "ev"
    args = [f"checkpoint={multitask_checkpoint}", "env.tasks=[PullCube-v1]", "episodes=2", "num_envs=1",
            "video_episodes=0", f"output={out}"]
    assert eval_main(args) == 0, capsys.readouterr().err
    ev = json.loads((out / "eval.json").read_text())
    assert list(ev["tasks"]) == ["PullCube-v1"] and ev["episodes"] == 2
    assert ev["env_config"]["tasks"] == ["PullCube-v1"] and ev["env_config"]["state"] == "full"  # the rest kept
    assert ev["env_config"]["max_episode_steps"] == 2 and ev["tasks"]["PullCube-v1"]["episode_len"] == 2


@pytest.mark.parametrize("bad, match", [
    ("env.taskz=[PullCube-v1]", "'env.taskz=[PullCube-v1]' on the checkpoint's env (maniskill_multitask): unknown "
                                "config key 'taskz'. Did you mean 'task'"),
    ("~env.tasks", "a checkpoint's env keeps all its keys; set env.tasks=<value> instead"),
    ("+env.task_kwargs.PullCube-v1.colour=red", "ManiSkill task 'PullCube-v1' takes no argument 'colour'"),
])
def test_a_key_the_checkpoints_env_cannot_take_is_one_line(bad, match, multitask_checkpoint, tmp_path, capsys):
    from vlarl.cli import eval_main

    args = [f"checkpoint={multitask_checkpoint}", bad, "episodes=1", "num_envs=1", f"output={tmp_path / 'ev'}"]
    assert_one_line_refusal(eval_main, args, "vlarl-eval", match, capsys, tmp_path)
    assert not (tmp_path / "ev").exists()
