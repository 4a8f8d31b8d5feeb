"""``scripts/rl_datasets_pipeline.py``: the aggregation of per-source records into result.json and one table, its
refusal to overwrite an earlier run without ``--reuse``, and (slow) the whole pipeline at a toy budget: PPO for the
Gaussian and the diffusion policy, vlarl-collect, the scripted expert, SFT of the flow VLA, vlarl-eval, then a
``--reuse`` run that redoes no stage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scripts import rl_datasets_pipeline as pipe
from tests.helpers.checkpoints import tree_hash

ROOT = Path(__file__).parents[2]
torch.set_num_threads(1)


def _record(source: str, seed: int, episodes: int, jerk: float = 0.0, sft: float | None = None,
            rl: float | None = None) -> dict:
    """A record shaped as ``run_source`` writes it (numbers chosen here, not results)."""
    rec: dict = {"source": source, "seed": seed,
                 "collect": {"kept": episodes, "attempts": 10, "dataset": "d", "episodes": episodes,
                             "frames": 20 * episodes}}
    if episodes:
        rec["collect"].update(mean_length=20.0, mean_return=1.0, mean_squared_jerk=jerk)
    if rl is not None:
        rec["rl"] = {"success_once": rl, "success_once_ci95": [0.0, 1.0], "episodes": 10}
    if sft is not None:
        rec["eval"] = {"success_once": sft, "success_once_ci95": [sft - 0.1, sft + 0.1], "episodes": 100}
    return rec


def test_report_aggregates_seeds_into_result_json_and_one_table(tmp_path, capsys):
    recs = [_record("gaussian_rl", 0, 5, jerk=0.2, sft=0.4, rl=0.8), _record("gaussian_rl", 1, 3, jerk=0.4, sft=0.6,
                                                                           rl=0.6),
            _record("diffusion_rl", 0, 0, rl=0.0), _record("expert", 0, 10, jerk=0.1, sft=0.5)]
    for r in recs:
        (tmp_path / f"seed{r['seed']}").mkdir(exist_ok=True)
        pipe.write_json(tmp_path / f"seed{r['seed']}" / f"{r['source']}.json", r)
    assert pipe.main(["--out", str(tmp_path), "--report", "--eval-episodes", "100"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("| data source |") == 1
    res = json.loads((tmp_path / "result.json").read_text())
    rows = {r["source"]: r for r in res["rows"]}
    assert list(rows) == ["gaussian_rl", "diffusion_rl", "expert"]  # the table's order, whatever the files' order
    g = rows["gaussian_rl"]
    assert g["seeds"] == [0, 1] and g["sft_values"] == [0.4, 0.6]
    assert g["sft_success_once"] == "0.50 +- 0.10" and g["rl_success_once"] == "0.70 +- 0.10"
    assert g["episodes"] == "4 +- 1" and g["mean_squared_jerk"] == "0.3000 +- 0.1000"
    assert g["collect_success"] == "0.40 +- 0.10"
    d = rows["diffusion_rl"]
    assert d["no_data_seeds"] == [0] and "no data to train on" in d["sft_success_once"] and d["episodes"] == "0"
    e = rows["expert"]
    assert e["rl_success_once"] == "(scripted)" and e["sft_success_once"] == "0.50 [0.40, 0.60]"  # one seed: its CI
    assert len(res["records"]["gaussian_rl"]) == 2 and res["command"].endswith("--eval-episodes 100")
    line = next(ln for ln in printed.splitlines() if ln.startswith("| diffusion_rl"))
    assert "no data to train on for seed [0]" in line


def test_an_earlier_run_needs_reuse_and_is_left_as_it_was(tmp_path, capsys):
    (tmp_path / "seed0" / "rl_gaussian_rl").mkdir(parents=True)
    (tmp_path / "seed0" / "rl_gaussian_rl" / "config.yaml").write_text("x")
    before = tree_hash(tmp_path)
    assert pipe.main(["--out", str(tmp_path), "--sources", "gaussian_rl"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pass --reuse" in err[0]
    assert tree_hash(tmp_path) == before


@pytest.mark.parametrize("bad", [["--seeds", "9"], ["--episodes", "0"], ["--sources", "human"]])
def test_bad_arguments_exit_2(tmp_path, bad):
    with pytest.raises(SystemExit) as e:
        pipe.main(["--out", str(tmp_path / "o"), *bad])
    assert e.value.code == 2 and not (tmp_path / "o").exists()


@pytest.mark.slow
@pytest.mark.sim
def test_pipeline_end_to_end_at_a_toy_budget_then_reuse(tmp_path):
    out = tmp_path / "o"
    cmd = [sys.executable, str(ROOT / "scripts" / "rl_datasets_pipeline.py"), "--out", str(out), "--rl-env-steps",
           "64", "--rl-eval-episodes", "2", "--episodes", "2", "--max-attempts", "4", "--sft-samples", "200",
           "--eval-episodes", "2", "--", "env.num_envs=2", "env.num_workers=1", "algorithm.num_steps=4",
           "algorithm.num_minibatches=1"]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert first.returncode == 0, first.stderr[-3000:]
    res = json.loads((out / "result.json").read_text())
    rows = {r["source"]: r for r in res["rows"]}
    assert set(rows) == set(pipe.SOURCES)
    for source in pipe.RL_SOURCES:
        rec = res["records"][source][0]
        assert rec["rl"]["env_steps"] >= 64 and (out / "seed0" / f"rl_{source}" / "checkpoints" / "latest").exists()
        assert rec["collect"]["attempts"] == 4  # an untrained policy rarely succeeds; whatever it found is counted
        assert rec["collect"]["episodes"] == rec["collect"]["kept"] <= 2
    expert = res["records"]["expert"][0]
    assert expert["collect"]["episodes"] == 2 and expert["collect"]["frames"] > 0
    assert expert["sft"]["samples"] >= 200 - expert["collect"]["frames"] and expert["eval"]["episodes"] == 2
    assert (out / "seed0" / "sft_expert" / "env.json").is_file()
    assert first.stdout.count("| data source |") == 1
    stages = sorted(p for p in (out / "seed0").iterdir() if p.is_dir())  # rl_*, data_*, sft_*, eval_sft_*
    before = [tree_hash(p) for p in stages]
    again = subprocess.run([*cmd[:3], *cmd[3:cmd.index("--")], "--reuse"], cwd=ROOT, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "vlarl-train" not in again.stdout and "vlarl-eval" not in again.stdout and "[demos]" not in again.stdout
    assert [tree_hash(p) for p in stages] == before  # every stage reused: no file of any stage changed


def _run_with_checkpoint(root: Path) -> Path:
    """A finished run's layout as vlarl-train and vlarl-eval leave it: checkpoints/<iter> with a ``latest`` link, the
    run's final eval on other seeds, and a held-out eval of that checkpoint (numbers chosen here, not results)."""
    ckpt = root / "run" / "checkpoints" / "iter_000003"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    (root / "run" / "checkpoints" / "latest").symlink_to("iter_000003")
    for name, seed, succ, extra in [("eval", 2_000_000, 0.9, {"env_steps": 4321, "train_wall_s": 12.0}),
                                    ("eval_heldout", pipe.EVAL_SEED, 0.4, {"checkpoint": str(ckpt)})]:
        (root / "run" / name).mkdir()
        pipe.write_json(root / "run" / name / "eval.json", {
            "seed_start": seed, "deterministic": True, "success_once": succ, "success_once_ci95": [0.1, 0.7],
            "episodes": 10, "policy": "diffusion_policy", **extra})
    return root / "run" / "checkpoints" / "latest"


def test_a_given_checkpoint_is_the_source_with_its_held_out_eval(tmp_path):
    latest = _run_with_checkpoint(tmp_path)
    args = pipe.parse_args(["--out", str(tmp_path / "o"), "--sources", "diffusion_rl", "expert",
                            "--source-checkpoint", f"diffusion_rl={latest}"])
    assert args.source_checkpoints == {"diffusion_rl": str(latest.absolute())}
    rl = pipe.given_checkpoint("diffusion_rl", args, tmp_path / "o")
    # the held-out eval (seeds 1,000,000+) of this checkpoint, not the run's final eval on its own seeds
    assert rl["success_once"] == 0.4 and rl["heldout_eval"].endswith("eval_heldout/eval.json")
    assert rl["given"] and rl["checkpoint_resolved"].endswith("iter_000003") and rl["env_steps"] == 4321
    assert not (tmp_path / "o").exists()  # read, not measured: nothing written


@pytest.mark.parametrize("bad", [["--source-checkpoint", "diffusion_rl={missing}"],
                                 ["--source-checkpoint", "expert={ckpt}"],
                                 ["--sources", "expert", "--source-checkpoint", "diffusion_rl={ckpt}"]])
def test_a_bad_source_checkpoint_is_refused_in_one_line(tmp_path, capsys, bad):
    latest = _run_with_checkpoint(tmp_path)
    bad = [b.format(missing=tmp_path / "nope", ckpt=latest) for b in bad]
    with pytest.raises(SystemExit) as e:
        pipe.main(["--out", str(tmp_path / "o"), *bad])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and not (tmp_path / "o").exists()
    assert err[-1].count("--source-checkpoint") == 1 and "error:" in err[-1]
