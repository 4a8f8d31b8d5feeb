"""``scripts/multitask_sft_rl.py``'s input checks: a task's own demonstration count (``--task-demos TASK=N``) must
name a task the env runs and be a whole number, and ``--sft-from`` must be a saved policy other than the one the run
writes; bad input is one line, exit 2, and no output folder."""

from __future__ import annotations

import pytest

from scripts import multitask_sft_rl as script

pytest.importorskip("mani_skill")


@pytest.mark.parametrize("args, needle", [
    (["--task-demos", "PushCubeToColor-v1=many"], "write TASK=N"),
    (["--task-demos", "PickCube-v1=5"], "does not run"),
    (["--sft-from", "{out}/sft"], "the folder this run writes its SFT policy to"),
    (["--sft-from", "{tmp}/nothing"], "does not exist"),
    (["--swap-frames", "--eval-episodes", "7", "--eval-envs", "3"], "leave a last batch of one scene"),
    (["--swap-frames", "--eval-envs", "1"], "needs num_envs >= 2"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, args, needle):
    out = tmp_path / "run"
    args = [a.format(out=out, tmp=tmp_path) for a in args]
    with pytest.raises(SystemExit) as e:
        script.main(["--out", str(out), *args, "--", "env.tasks=[PushCubeToColor-v1,PushCube-v1]"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert needle in err and "error:" in err
    assert not out.exists()


def test_an_unknown_experiment_is_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        script.main(["--out", str(out), "--experiment", "multitask_no_such_thing"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "multitask_no_such_thing" in err and "error:" in err
    assert not out.exists()


def test_an_rlpd_experiment_gets_the_scripts_own_demonstrations_and_sft_builds_without_them(tmp_path):
    """experiment=multitask_oft_rlpd reads demonstrations: the RL stage gets the file this script writes, the SFT
    stage's config holds none (the file does not exist when it is checked) and still builds the exact OFT actor;
    demonstrations named after -- are kept; a PPO experiment's overrides pass through as given."""
    from vlarl.config import load_train_config
    from vlarl.config.loader import ConfigError

    demos = tmp_path / "demos" / "trajectories.h5"
    build, rl = script.stage_overrides("multitask_oft_rlpd", ["seed=3"], demos)
    assert rl == ["seed=3", f"algorithm.demos={demos}"]
    cfg = load_train_config(["experiment=multitask_oft_rlpd", *build])  # validates with no demonstrations file
    assert (cfg.algorithm.name, cfg.algorithm.demos, cfg.algorithm.demo_ratio) == ("rlpd", "", 0.0)
    assert (cfg.policy.name, cfg.policy.action_head, cfg.policy.squash) == ("openvla_oft", "l1", True)
    assert list(cfg.env.tasks) == ["PushCubeToColor-v1", "PushCube-v1", "PullCube-v1"]
    assert (cfg.env.reward_mode, cfg.env.ignore_terminations) == ("sparse", False)
    with pytest.raises(ConfigError, match="algorithm.demos"):  # what the SFT stage would hit without the override
        load_train_config(["experiment=multitask_oft_rlpd"])
    mine = [f"algorithm.demos={tmp_path / 'other.h5'}"]
    assert script.stage_overrides("multitask_oft_rlpd", mine, demos) == (mine, mine)
    assert script.stage_overrides("multitask_smolvla_sft_rl", ["seed=3"], demos) == (["seed=3"], ["seed=3"])


@pytest.mark.heavy
def test_swap_frames_evaluates_each_policy_on_another_scenes_frames_too(tmp_path):
    """One demonstration, one epoch, two held-out episodes: with --swap-frames result.json holds the SFT policy's
    evaluation on its own frames and on the neighbouring scene's, over the same seeds."""
    import json

    out = tmp_path / "run"
    assert script.main(["--out", str(out), "--experiment", "multitask_oft_sft_rl", "--demos", "1", "--sft-epochs", "1",
                        "--eval-episodes", "2", "--eval-envs", "2", "--swap-frames",
                        "--", "env.tasks=[PushCube-v1]"]) == 0
    result = json.loads((out / "result.json").read_text())
    own, swapped = result["eval_sft"], result["eval_sft_swapped"]
    assert own["episodes"] == swapped["episodes"] == 2 and list(swapped["tasks"]) == ["PushCube-v1"]
    assert json.loads((out / "eval_sft_swapped" / "eval.json").read_text())["swap_frames"] is True
    assert json.loads((out / "eval_sft" / "eval.json").read_text())["swap_frames"] is False


def test_other_words_without_the_language_task_is_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        script.main(["--out", str(out), "--other-words", "--", "env.tasks=[PushCube-v1,PullCube-v1]"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--other-words" in err and "PushCubeToColor-v1" in err and "error:" in err
    assert not out.exists()


@pytest.mark.heavy
def test_other_words_evaluates_the_language_task_under_the_other_goals_words(tmp_path):
    """With --other-words result.json holds a third evaluation of the SFT policy: the language task alone, each
    episode reporting the words of the goal that does not count, over the same held-out seeds."""
    import json

    out = tmp_path / "run"
    assert script.main(["--out", str(out), "--experiment", "multitask_oft_sft_rl", "--demos", "1", "--sft-epochs", "1",
                        "--eval-episodes", "2", "--eval-envs", "2", "--other-words",
                        "--", "env.tasks=[PushCubeToColor-v1,PushCube-v1]"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert list(result["eval_sft"]["tasks"]) == ["PushCubeToColor-v1", "PushCube-v1"]
    other = result["eval_sft_other_words"]
    assert list(other["tasks"]) == ["PushCubeToColor-v1"] and other["episodes"] == 2
    ev = json.loads((out / "eval_sft_other_words" / "eval.json").read_text())
    assert ev["env_config"]["task_kwargs"] == {"PushCubeToColor-v1": {"instruction": "other"}}
    own = json.loads((out / "eval_sft" / "eval.json").read_text())
    assert ev["seed_start"] == own["seed_start"] == 1_000_000
    assert own["env_config"]["task_kwargs"] == {}


def test_paired_words_without_a_language_task_is_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        script.main(["--out", str(out), "--paired-words", "--", "env.tasks=[PushCube-v1,PullCube-v1]"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--paired-words" in err and "add one of ['PushCubeToColor-v1']" in err
    assert not out.exists()


def test_demos_only_records_the_demonstrations_and_stops(tmp_path):
    """--demos-only writes <out>/demos (what scripts/pretrain_vision.py reads before SFT) and nothing of SFT or
    evaluation."""
    import json

    from vlarl.data.demonstrations import read_maniskill_h5

    out = tmp_path / "run"
    assert script.main(["--out", str(out), "--experiment", "multitask_oft_sft_rl", "--demos", "2", "--demos-only",
                        "--", "env.tasks=[PushCubeToColor-v1]"]) == 0
    demos = out / "demos" / "trajectories.h5"
    episodes = read_maniskill_h5(demos, cameras=["base_camera"])
    assert len(episodes) == 2
    summary = json.loads((out / "demos" / "summary.json").read_text())
    assert summary["tasks"]["PushCubeToColor-v1"]["kept"] == 2
    assert sorted(p.name for p in out.iterdir()) == ["demos"]  # no sft/, no evaluation, no result.json


def test_demos_only_with_an_rl_stage_is_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        script.main(["--out", str(out), "--demos-only", "--rl-env-steps", "100"])
    assert e.value.code == 2
    assert "--demos-only records the demonstrations and stops" in capsys.readouterr().err.strip().splitlines()[-1]
    assert not out.exists()
