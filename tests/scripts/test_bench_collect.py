"""``scripts/bench_collect.py`` on a saved tiny CNN policy of PushCube-RGB (16 px, 2 envs, 2 attempts, every attempt
kept): both recordings run on the same seeds, the table has both rows with their counts, and the episodes both
kept are the same (deterministic acting, fresh scenes); ``--max-length 3`` adds the row giving up attempts past
3 steps (the 6-step episodes: none kept); a directory without env.json is one line, exit 2. No timing is asserted."""

from __future__ import annotations

import json

import pytest
import torch

from scripts import bench_collect

pytest.importorskip("mani_skill")
torch.set_num_threads(1)


@pytest.mark.heavy
def test_both_recordings_are_timed_and_agree(tmp_path, capsys):
    from tests.helpers.recipes import PPO
    from vlarl import system_env
    from vlarl.data.sft import save_policy_dir
    from vlarl.experiments import training_policy

    system_env.apply()
    cfg, _spec, policy = training_policy([PPO, "policy=cnn", "env=maniskill_pushcube_rgb", "env.image_size=16",
                                          "env.max_episode_steps=6"], seed=0)
    save_policy_dir(policy, cfg.env, tmp_path / "ck")
    assert bench_collect.main(["--checkpoint", str(tmp_path / "ck"), "--attempts", "2", "--num-envs", "2",
                               "--keep-all", "--max-length", "3"]) == 0
    out = capsys.readouterr().out
    assert "| every step observed (replay=false) | 2 | 2 | - |" in out
    assert "| chunked + replay of kept (default) | 2 | 2 | 0 |" in out
    assert "| chunked + replay, given up after 3 steps | 2 | 0 | 0 |" in out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["compared"]["common"] == 2 and result["compared"]["same_actions"] == 2
    assert result["compared"]["max_state_diff"] == 0.0 and result["compared"]["max_pixels"] == 0.0
    assert min(result["per_attempt_s"].values()) > 0 and result["kept"] == {"rollout": 2, "replay": 2, "given_up": 0}


def test_a_directory_without_env_json_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bench_collect.main(["--checkpoint", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "not a policy directory with an env.json" in err[-1]
