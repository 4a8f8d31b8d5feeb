"""``scripts/self_imitation.py`` / ``vlarl.self_imitation``: a round samples the policy on training seeds, keeps only
its successful episodes (a LeRobot dataset), fine-tunes on them with the policy's state statistics kept and its env
unchanged, and evaluates per task on held-out seeds; a finished round is read, not redone; bad arguments are one
line, exit 2, nothing written. The base is the tiny exact SmolVLA fixture SFT'd on the language task (state input)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from scripts import self_imitation as script
from tests.helpers.checkpoints import pushcube_checkpoint
from vlarl.self_imitation import (
    COLLECT_SEED_BASE,
    COLLECTED,
    RoundSettings,
    balanced,
    collection_seeds,
    collection_settings,
    finished_collection,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "language" / "smolvla"
torch.set_num_threads(1)


def test_collection_seeds_are_disjoint_over_rounds_and_seeds_and_below_the_held_out_ones():
    spans = [collection_seeds(seed, r, 300) for seed in range(3) for r in range(4)]
    assert spans[0] == (COLLECT_SEED_BASE, COLLECT_SEED_BASE + 300)
    taken = [s for a, b in spans for s in range(a, b)]
    assert len(taken) == len(set(taken)) and max(taken) < 1_000_000 and min(taken) >= COLLECT_SEED_BASE
    with pytest.raises(ValueError, match="rounds x attempts <= 100000"):
        collection_seeds(0, 400, 300)
    with pytest.raises(ValueError, match="use seeds 0-7"):
        collection_seeds(8, 0, 300)


def test_balance_repeats_each_instructions_episodes_toward_the_most_frequent_count():
    import numpy as np

    from vlarl.data.lerobot_v3 import LeRobotEpisode

    eps = [LeRobotEpisode(np.zeros((2, 3)), np.zeros((2, 1)), instruction=w, episode_index=i)
           for i, w in enumerate(["pull"] * 6 + ["red"] * 2 + ["blue"] * 4)]
    out = balanced(eps)
    counts = {w: sum(e.instruction == w for e in out) for w in ("pull", "red", "blue")}
    assert counts == {"pull": 6, "red": 6, "blue": 8}  # x1, x3, x round(1.5) = 2
    assert [e.episode_index for e in out[:8]] == [0, 1, 2, 3, 4, 5, 6, 6] and balanced([]) == []


def test_a_finished_collection_is_read_only_for_the_same_policy_and_sampling_settings(tmp_path):
    """A round killed while imitating (or redone with other epochs) reads its collection rather than sampling the
    same seeds again; another base, other attempts or tries, or a missing dataset mean sampling again."""
    rnd, base = tmp_path / "round0", tmp_path / "sft"
    settings = RoundSettings(attempts=12, num_envs=3, seed=1, max_length=25, tries_per_seed=2)
    assert finished_collection(rnd, base, settings) is None  # nothing yet
    rnd.mkdir()
    record = {"from": str(base), "settings": collection_settings(settings), "collect": {"kept": 3}, "collect_s": 9.0}
    (rnd / COLLECTED).write_text(json.dumps(record))
    assert finished_collection(rnd, base, settings) is None  # a record without its dataset
    (rnd / "successes").mkdir()
    assert finished_collection(rnd, base, settings) == record
    assert finished_collection(rnd, base, RoundSettings(**{**settings.__dict__, "epochs": 80, "lr": 1e-4,
                                                           "balance": True})) == record  # imitation only
    for changed in ({"attempts": 24}, {"tries_per_seed": 1}, {"seed": 2}, {"max_length": 0}, {"num_envs": 6}):
        assert finished_collection(rnd, base, RoundSettings(**{**settings.__dict__, **changed})) is None, changed
    assert finished_collection(rnd, tmp_path / "other", settings) is None
    assert set(collection_settings(settings)) == {"attempts", "num_envs", "seed", "max_length", "tries_per_seed"}


def test_the_validation_choice_takes_the_best_and_a_tie_goes_to_the_later_round():
    assert script.choose([("base", 0.3), ("round 0", 0.5), ("round 1", 0.4)]) == "round 0"
    assert script.choose([("base", 0.3), ("round 0", 0.5), ("round 1", 0.5)]) == "round 1"
    assert script.choose([("base", 0.6), ("round 0", 0.5)]) == "base"
    lo, hi = script.VALIDATION_SEEDS
    assert lo > 0 and hi <= COLLECT_SEED_BASE  # neither a demonstration, a collection nor a held-out seed


def test_an_evaluation_is_reused_only_for_the_same_policy_and_seed(tmp_path):
    where = tmp_path / "final" / "best"
    assert not script.same_evaluation(where, tmp_path / "round0" / "policy", 1_000_000)  # none yet
    where.mkdir(parents=True)
    (where / "eval.json").write_text(json.dumps({"checkpoint": str(tmp_path / "round0" / "policy"),
                                                 "seed_start": 1_000_000}))
    assert script.same_evaluation(where, tmp_path / "round0" / ".." / "round0" / "policy", 1_000_000)
    # a rerun with more rounds chose round 1: the old final is not its evaluation
    assert not script.same_evaluation(where, tmp_path / "round1" / "policy", 1_000_000)
    assert not script.same_evaluation(where, tmp_path / "round0" / "policy", 100_000)


@pytest.mark.parametrize("bad, match", [
    (["--base", "nope"], "does not exist"),
    (["--base", "{ck}", "--demos", "missing.h5"], "--demos missing.h5 does not exist"),
    (["--base", "{noenv}"], "has no env.json"),
    (["--base", "{ck}", "--rounds", "0"], "must be >= 1"),
    (["--base", "{ck}", "--seed", "9"], "use seeds 0-7"),
    (["--base", "{ck}", "--final-episodes", "-1"], "use 0 (none) or a number of episodes per task"),
    (["--base", "{ck}", "--max-length", "-1"], "use 0 (the env's time limit) or a number of env steps"),
    (["--base", "{ck}", "--tries-per-seed", "0"], "--tries-per-seed must be >= 1"),
    (["--base", "{ck}", "--validation-seed", "5"], "leaves the validation seeds [100,000, 200,000)"),
    (["--base", "{ck}", "--validation-seed", "199990"], "with 50 episodes leaves the validation seeds"),
])
def test_bad_arguments_exit_2_and_write_nothing(tmp_path, monkeypatch, capsys, bad, match):
    monkeypatch.chdir(tmp_path)
    pushcube_checkpoint(tmp_path / "ck")
    shutil.copytree(tmp_path / "ck", tmp_path / "noenv")
    (tmp_path / "noenv" / "env.json").unlink()
    before = sorted(tmp_path.rglob("*"))
    args = [a.format(ck=tmp_path / "ck", noenv=tmp_path / "noenv") for a in bad]
    with pytest.raises(SystemExit) as exit_info:
        script.main([*args, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert match in err[-1]
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.heavy
@pytest.mark.sim
@pytest.mark.skipif(not FIXTURE.is_dir(), reason="make it with scripts/make_language_fixture.py")
def test_a_round_imitates_only_its_own_successes_then_a_rerun_reads_it(tmp_path, capsys):
    from policies.base import Policy
    from vlarl.data.lerobot_v3 import read_episode_table

    out = tmp_path / "si"
    args = ["--base", str(FIXTURE), "--out", str(out), "--rounds", "1", "--attempts", "6", "--num-envs", "3",
            "--sft-epochs", "1", "--eval-episodes", "2", "--eval-envs", "2", "--final-episodes", "3",
            "--max-length", "40"]
    assert script.main(args) == 0
    record = json.loads((out / "round0" / "round.json").read_text())
    c = record["collect"]
    first, end = collection_seeds(0, 0, 6)
    assert c["attempts"] == 6 and c["seeds"] == [first, end] and c["kept"] >= 1
    assert record["settings"]["max_length"] == 40 and record["settings"]["tries_per_seed"] == 1
    assert c["seeds_tried"] == 6 and c["seeds_solved"] >= c["kept"]  # one try per seed: each solved one kept
    assert sum(c["kept_by_instruction"].values()) == c["kept"] and sum(c["attempts_by_instruction"].values()) == 6
    rows = read_episode_table(out / "round0" / "successes")
    assert len(rows) == c["kept"] and all(r["success"] is True for r in rows)  # failures are never imitated
    assert all(first <= r["seed"] < end for r in rows)
    assert record["own_episodes"] == c["kept"] and record["demo_episodes"] == 0
    assert record["imitate"]["episodes"] == c["kept"] and record["imitate"]["epochs"] == 1

    tuned = Path(record["policy"])
    saved, base_env = (json.loads((d / "env.json").read_text()) for d in (tuned, FIXTURE))
    assert saved.items() >= base_env.items() and saved["ignore_terminations"] is True  # evaluated as the base was
    assert (tuned / "normalization.json").read_text() == (FIXTURE / "normalization.json").read_text()
    base, new = Policy.from_pretrained(FIXTURE).state_dict(), Policy.from_pretrained(tuned).state_dict()
    assert any(not torch.equal(base[k], new[k]) for k in base)  # the fine-tuning changed the weights

    result = json.loads((out / "result.json").read_text())
    ev = result["evals"]["round 0"]
    assert ev["episodes"] == 2 and list(ev["tasks"]) == ["PushCubeToColor-v1"]
    final = result["final"]  # the newest policy once more, on more held-out episodes
    assert final["policy"] == record["policy"] and final["episodes"] == 3 and "base" not in final
    assert final["last"]["tasks"]["PushCubeToColor-v1"]["episodes"] == 3
    assert json.loads((out / "final" / "last" / "eval.json").read_text())["seeds"][0] == 1_000_000
    printed = capsys.readouterr().out
    assert "| round 0 |" in printed and "| last round, final |" in printed

    stamp = (out / "round0" / "round.json").stat().st_mtime_ns
    assert script.main(args) == 0  # finished earlier: read, neither collected nor trained again
    assert "round 0: finished earlier" in capsys.readouterr().out
    assert (out / "round0" / "round.json").stat().st_mtime_ns == stamp

    # a round killed after its collection (no round.json) is imitated from what it collected, not sampled again
    (out / "round0" / "round.json").unlink()
    shutil.rmtree(out / "round0" / "eval")
    data_stamp = max(p.stat().st_mtime_ns for p in (out / "round0" / "successes").rglob("*"))
    assert script.main(args) == 0
    assert "round 0: collection finished earlier" in capsys.readouterr().out
    again = json.loads((out / "round0" / "round.json").read_text())
    assert again["collect"] == c and again["imitate"]["episodes"] == c["kept"]
    assert max(p.stat().st_mtime_ns for p in (out / "round0" / "successes").rglob("*")) == data_stamp

    # killed while collecting (no collect.json): sampled again over what it left, from the same seeds
    for name in ("round.json", COLLECTED):
        (out / "round0" / name).unlink()
    shutil.rmtree(out / "round0" / "eval")
    assert script.main(args) == 0
    again = json.loads((out / "round0" / "round.json").read_text())
    assert again["collect"]["kept"] == c["kept"] and again["collect"]["seeds"] == c["seeds"]  # the same seeds
    assert len(read_episode_table(out / "round0" / "successes")) == c["kept"]

    # chosen on validation seeds: the rounds and the base evaluated there, the best one once more on held-out seeds
    assert script.main([*args, "--eval-base", "--validation-seed", "100000"]) == 0
    result = json.loads((out / "result.json").read_text())
    final = result["final"]
    scores = {n: e["success_once"] for n, e in result["evals"].items()}
    assert final["validation"] == scores and set(scores) == {"base", "round 0"}
    assert final["chosen"] == script.choose(list(scores.items()))
    assert final["policy"] == str({"base": FIXTURE, "round 0": Path(again["policy"])}[final["chosen"]])
    for where, first in [(out / "round0" / "eval_validation", 100_000), (out / "eval_base_validation", 100_000),
                         (out / "final" / "best", 1_000_000)]:
        assert json.loads((where / "eval.json").read_text())["seeds"][0] == first
    assert "| chosen, final |" in capsys.readouterr().out
