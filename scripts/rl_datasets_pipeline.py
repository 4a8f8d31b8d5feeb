"""Train VLAs on data that RL made ("Beyond Human Demonstrations" on ManiSkill PushCube-v1), in one command:

    python scripts/rl_datasets_pipeline.py --out outputs/rl_datasets --seeds 0 1 2 --rl-env-steps 100000 \
        --episodes 50 --sft-samples 200000 --eval-episodes 100

For each seed and each data source (``--sources``: ``gaussian_rl``, ``diffusion_rl``, ``expert``):

1. RL: train a Gaussian MLP policy or a diffusion policy from scratch with chunked PPO (``vlarl-train
   experiment=pushcube_mlp_ppo policy=mlp|diffusion``, end-effector delta control, the same env-step budget;
   the diffusion policy gets a state-MLP critic, ``RL_OVERRIDES``); its own held-out success is kept;
2. collect ``--episodes`` successful episodes (``vlarl-collect ... success_only=true``; episodes end at the first
   success, like the expert's) from the RL policy (its deterministic ``act()``; ``--sample-actions``: its sampled
   actions, as in RL rollouts), or record them with the scripted expert
   (``scripts/pushcube_expert.py``): LeRobot v3.0 datasets with per-episode quality statistics, seeds far
   below the evaluation seeds;
3. SFT the same tiny flow-matching VLA (the policy of ``configs/experiment/pushcube_flow_sft_rl.yaml``, state
   input) on the dataset with the same budget (``--sft-samples`` training samples: epochs = samples / frames);
4. evaluate the SFT'd VLA with ``vlarl-eval`` on the held-out seeds 1,000,000+.

``--source-checkpoint diffusion_rl=<run>/checkpoints/latest`` skips step 1 for that source and collects from a
finished RL checkpoint (e.g. a DPPO-tuned Diffusion Policy); its held-out success is read from its run's
evaluation on the held-out seeds or measured.

Every stage writes its outputs under ``<out>/seed<k>/`` and a record ``<out>/seed<k>/<source>.json``;
``--reuse`` keeps the stages already finished there (an interrupted RL run is resumed from its last checkpoint).
``<out>/result.json`` and the printed table aggregate every record under ``<out>``, so two invocations with
disjoint ``--sources`` can run side by side on one ``--out`` (``--report`` only aggregates). A source whose
policy succeeds in no collection attempt is reported as such (dataset 0 episodes), not skipped silently.
Arguments after ``--`` go to both RL trainings (``vlarl-train`` overrides).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from vlarl.experiments import Stages, command, prepare, split_overrides, training_policy

RL_SOURCES = {"gaussian_rl": "mlp", "diffusion_rl": "diffusion"}  # source name -> vlarl policy= choice
SOURCES = (*RL_SOURCES, "expert")
# The tiny diffusion VLA's value head on its 32-wide hidden state barely learns (docs/sft_then_rl.md: explained
# variance ~0 for the flow VLA); a state-MLP critic with its own lr is what made PPO work for the chain VLAs.
RL_OVERRIDES = {"gaussian_rl": [],
                "diffusion_rl": ["policy.value_from=state", "algorithm.critic_lr=1e-3",
                                 "policy.backbone.max_text_tokens=8"]}
EVAL_SEED = 1_000_000
SFT_EXPERIMENT = "pushcube_flow_sft_rl"
QUALITY = ("quality/length", "quality/return", "quality/mean_squared_jerk")


class PipelineError(Exception):
    """A stage failed or the input is wrong: one line for the user."""


def write_json(path: Path, obj) -> None:
    """Atomically (a reader beside us never sees half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


STAGES = Stages("rl_datasets")
log = STAGES.log


def rl_train(source: str, seed: int, args, d: Path) -> dict:
    """PPO from scratch; reused when its final evaluation exists, resumed when a checkpoint does (--reuse)."""
    run_dir = d / f"rl_{source}"
    final = run_dir / "eval" / "eval.json"
    if not (args.reuse and final.is_file()):
        base = [command("vlarl-train")]
        if args.reuse and (run_dir / "checkpoints" / "latest").exists():
            cmd = [*base, f"resume={run_dir}"]
        else:
            shutil.rmtree(run_dir, ignore_errors=True)  # an unfinished run of ours without a checkpoint
            cmd = [*base, "experiment=pushcube_mlp_ppo", f"policy={RL_SOURCES[source]}", f"run_dir={run_dir}",
                   f"seed={seed}", f"total_env_steps={args.rl_env_steps}", "time_limit_minutes=0",
                   f"eval.episodes={args.rl_eval_episodes}", "eval.video_episodes=0", "logger.progress_bar=false",
                   *RL_OVERRIDES[source], *args.train_overrides]
        rc = STAGES.run(cmd, f"RL {source}", check=False).returncode
        if rc != 0 or not final.is_file():
            raise PipelineError(f"RL training of {source} failed (exit {rc}); see its output above and {run_dir}")
    ev = json.loads(final.read_text())
    return {"checkpoint": str(run_dir / "checkpoints" / "latest"), "env_steps": ev.get("env_steps"),
            "train_wall_s": ev.get("train_wall_s"), "success_once": ev["success_once"],
            "success_once_ci95": ev["success_once_ci95"], "episodes": ev["episodes"]}


def _heldout_eval(run_dir: Path, ckpt: Path) -> Path | None:
    """An ``eval.json`` of ``run_dir`` measured on the held-out seeds with ``act()`` on this very checkpoint."""
    for f in sorted(run_dir.glob("*/eval.json")):
        ev = json.loads(f.read_text())
        same = "checkpoint" not in ev or Path(ev["checkpoint"]).resolve() == ckpt.resolve()
        if ev.get("seed_start") == EVAL_SEED and ev.get("deterministic", True) and same:
            return f
    return None


def given_checkpoint(source: str, args, d: Path) -> dict:
    """A finished RL checkpoint as the source (``--source-checkpoint``): no training; its held-out success is read
    from an evaluation of its run on the held-out seeds (``<run>/*/eval.json``) or measured with ``vlarl-eval``."""
    ckpt = Path(args.source_checkpoints[source])
    run_dir = ckpt.resolve().parent.parent  # <run>/checkpoints/<name>
    found = _heldout_eval(run_dir, ckpt)
    if found is None:
        out = d / f"heldout_{source}"
        evaluate(ckpt, out, args, episodes=args.rl_eval_episodes)
        found = out / "eval.json"
    ev = json.loads(found.read_text())
    train = run_dir / "eval" / "eval.json"  # the run's own final eval carries its training budget
    tr = json.loads(train.read_text()) if train.is_file() else {}
    return {"checkpoint": str(ckpt), "checkpoint_resolved": str(ckpt.resolve()), "given": True,
            "heldout_eval": str(found), "env_steps": tr.get("env_steps"), "train_wall_s": tr.get("train_wall_s"),
            "policy": ev.get("policy"), "success_once": ev["success_once"],
            "success_once_ci95": ev["success_once_ci95"], "episodes": ev["episodes"]}


def collect(source: str, seed: int, args, d: Path, ckpt: str | None) -> dict:
    """A dataset of ``args.episodes`` successful episodes (fewer, or none, when the source cannot find them)."""
    out, record = d / f"data_{source}", d / f"collect_{source}.json"
    if args.reuse and record.is_file():
        return json.loads(record.read_text())
    first = 100_000 * (seed + 1)  # far below the evaluation seeds, different per pipeline seed
    if source == "expert":
        from vlarl.data.expert_demos import record_demos

        s = record_demos(out, args.episodes, first, fmt="lerobot", overwrite=True, log=log)
        res = {"kept": s["episodes"], "attempts": s["episodes"] + len(s["failed_seeds"])}
    else:
        max_attempts = args.max_attempts or 4 * args.episodes
        p = STAGES.run([command("vlarl-collect"), f"checkpoint={ckpt}", f"output={out}", f"episodes={args.episodes}",
                  f"seed={first}", "success_only=true", f"max_attempts={max_attempts}", "num_envs=8",
                  "env.ignore_terminations=false", f"max_length={args.max_length}", "overwrite=true",
                  f"deterministic={str(not args.sample_actions).lower()}"],
                       f"collect {source}", capture=True, check=False)
        summary = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        if p.returncode == 1 and not summary:  # no episode passed the filters: nothing written
            res = {"kept": 0, "attempts": max_attempts}
        elif p.returncode in (0, 1) and summary:  # 1 = fewer episodes than asked for (those are written)
            res = {"kept": summary[-1]["kept"], "attempts": summary[-1]["attempts"]}
        else:
            raise PipelineError(f"collecting from {source} failed (exit {p.returncode}); see its output above")
    res = {**res, "dataset": str(out), **dataset_stats(out if res["kept"] else None)}
    write_json(record, res)
    return res


def dataset_stats(root: Path | None) -> dict:
    """Episodes, frames and the mean (and sd) per-episode quality statistics of a written dataset."""
    from vlarl.data.lerobot_v3 import read_episode_table

    if root is None or not (root / "meta" / "info.json").is_file():
        return {"episodes": 0, "frames": 0}
    rows = read_episode_table(root)
    col = {k: np.array([r[k] for r in rows], np.float64) for k in QUALITY}
    return {"episodes": len(rows), "frames": int(col["quality/length"].sum()),
            "mean_length": float(col["quality/length"].mean()), "mean_return": float(col["quality/return"].mean()),
            "mean_squared_jerk": float(col["quality/mean_squared_jerk"].mean()),
            "mean_squared_jerk_sd": float(col["quality/mean_squared_jerk"].std())}


def sft(dataset: Path, seed: int, args, out: Path) -> dict:
    """The same tiny flow VLA, the same sample budget, on one dataset; saved with its env.json for vlarl-eval."""
    from vlarl.data.demonstrations import read_demonstrations
    from vlarl.data.sft import sft_and_save

    record = out / "sft.json"
    if args.reuse and record.is_file():
        return json.loads(record.read_text())
    cfg, spec, policy = training_policy([f"experiment={SFT_EXPERIMENT}", f"seed={seed}"], seed)
    episodes = read_demonstrations(dataset, cameras=[])
    frames = sum(len(e.actions) for e in episodes)
    epochs = max(1, round(args.sft_samples / frames))
    done = sft_and_save(policy, episodes, cfg.env, out, epochs, args.batch_size, args.sft_lr, spec.instruction, seed)
    res = {"frames": frames, "epochs": epochs, "samples": frames * epochs, "loss_first": done["loss_first"],
           "loss_last": done["loss_last"], "wall_s": done["wall_s"]}
    write_json(record, res)
    log(f"SFT on {dataset.name}: {len(episodes)} episodes, {frames} frames x {epochs} epochs, loss "
        f"{res['loss_first']:.4f} -> {res['loss_last']:.4f} ({res['wall_s']:.0f}s)")
    return res


def evaluate(ckpt: Path, out: Path, args, episodes: int | None = None) -> dict:
    """``vlarl-eval`` on the held-out seeds (deterministic ``act()``), ``episodes`` (default ``--eval-episodes``)."""
    if not (args.reuse and (out / "eval.json").is_file()):
        n = args.eval_episodes if episodes is None else episodes
        rc = STAGES.run([command("vlarl-eval"), f"checkpoint={ckpt}", f"episodes={n}",
                         f"seed={EVAL_SEED}", "num_envs=8", "video_episodes=0", f"output={out}"],
                        f"vlarl-eval {ckpt.name}", check=False).returncode
        if rc != 0:
            raise PipelineError(f"evaluating {ckpt} failed (exit {rc}); see its output above")
    ev = json.loads((out / "eval.json").read_text())
    return {k: ev[k] for k in ("success_once", "success_once_ci95", "success_at_end", "episodes", "seeds")}


def run_source(source: str, seed: int, args, d: Path) -> dict:
    """All stages of one source and seed -> its record (also written to ``<d>/<source>.json``)."""
    t0 = time.time()
    res: dict = {"source": source, "seed": seed}
    if source in args.source_checkpoints:
        res["rl"] = given_checkpoint(source, args, d)
    elif source in RL_SOURCES:
        res["rl"] = rl_train(source, seed, args, d)
    res["collect"] = collect(source, seed, args, d, res.get("rl", {}).get("checkpoint"))
    if res["collect"]["episodes"]:
        res["sft"] = sft(Path(res["collect"]["dataset"]), seed, args, d / f"sft_{source}")
        res["eval"] = evaluate(d / f"sft_{source}", d / f"eval_sft_{source}", args)
    res["wall_s"] = time.time() - t0
    write_json(d / f"{source}.json", res)
    log(f"seed {seed} {source}: {json.dumps(res)}")
    return res


def gather(out: Path) -> dict[str, list[dict]]:
    """Every finished source record under ``out``: source -> records in seed order."""
    recs: dict[str, list[dict]] = {}
    for d in sorted(out.glob("seed*"), key=lambda p: int(p.name[4:]) if p.name[4:].isdigit() else -1):
        for source in SOURCES:
            if (d / f"{source}.json").is_file():
                recs.setdefault(source, []).append(json.loads((d / f"{source}.json").read_text()))
    return recs


def _mean_sd(xs: list[float], fmt: str) -> str:
    if not xs:
        return "-"
    return format(float(np.mean(xs)), fmt) + (f" +- {format(float(np.std(xs)), fmt)}" if len(xs) > 1 else "")


def summarize(recs: dict[str, list[dict]]) -> list[dict]:
    """One row per source: means over seeds (sd over seeds when several; one seed: the 95% Wilson interval)."""
    rows = []
    for source in SOURCES:
        runs = recs.get(source, [])
        if not runs:
            continue
        rl = [r["rl"]["success_once"] for r in runs if "rl" in r]
        data = [r["collect"] for r in runs]
        filled = [c for c in data if c["episodes"]]
        sft_ok = [r["eval"]["success_once"] for r in runs if "eval" in r]
        row = {"source": source, "seeds": [r["seed"] for r in runs],
               "rl_success_once": _mean_sd(rl, ".2f") if rl else "(scripted)",
               "collect_success": _mean_sd([c["kept"] / c["attempts"] for c in data if c["attempts"]], ".2f"),
               "episodes": _mean_sd([c["episodes"] for c in data], ".0f"),
               "frames": _mean_sd([c["frames"] for c in data], ".0f"),
               "mean_length": _mean_sd([c["mean_length"] for c in filled], ".1f"),
               "mean_return": _mean_sd([c["mean_return"] for c in filled], ".3f"),
               "mean_squared_jerk": _mean_sd([c["mean_squared_jerk"] for c in filled], ".4f"),
               "sft_success_once": _mean_sd(sft_ok, ".2f"), "sft_values": sft_ok,
               "no_data_seeds": [r["seed"] for r in runs if not r["collect"]["episodes"]]}
        if len(sft_ok) == 1:
            lo, hi = next(r["eval"]["success_once_ci95"] for r in runs if "eval" in r)
            row["sft_success_once"] += f" [{lo:.2f}, {hi:.2f}]"
        if row["no_data_seeds"]:
            row["sft_success_once"] += f" (no data to train on for seed {row['no_data_seeds']})"
        rows.append(row)
    return rows


def table(rows: list[dict], eval_episodes: int | None = None) -> str:
    n = f", {eval_episodes} ep" if eval_episodes else ""
    head = ["data source", "seeds", "RL policy success (held-out)", "collection success", "dataset episodes",
            "frames", "mean length", "mean return", "mean squared jerk", f"SFT'd VLA success_once (held-out{n})"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["source"], " ".join(map(str, r["seeds"])), r["rl_success_once"], r["collect_success"],
                 r["episodes"], r["frames"], r["mean_length"], r["mean_return"], r["mean_squared_jerk"],
                 r["sft_success_once"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(out: Path, args, t_all: float) -> str:
    recs = gather(out)
    rows = summarize(recs)
    write_json(out / "result.json", {
        "command": " ".join(["python", "scripts/rl_datasets_pipeline.py", *args.argv]),
        "args": {k: v for k, v in vars(args).items() if k != "argv"}, "rows": rows, "records": recs,
        "wall_s": time.time() - t_all})
    return table(rows, args.eval_episodes)


def parse_args(argv: list[str]) -> argparse.Namespace:
    own, train_overrides = split_overrides(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--rl-env-steps", type=int, default=100_000)
    p.add_argument("--rl-eval-episodes", type=int, default=50, help="held-out episodes of each RL policy's own eval")
    p.add_argument("--episodes", type=int, default=50, help="successful episodes per data source")
    p.add_argument("--max-attempts", type=int, default=0, help="vlarl-collect max_attempts (0 = 4 x episodes)")
    p.add_argument("--max-length", type=int, default=0, help="vlarl-collect max_length (0 = any)")
    p.add_argument("--sample-actions", action="store_true",
                   help="collect from the RL policies' sampled actions (sample(), as in RL rollouts), not act()")
    p.add_argument("--sft-samples", type=int, default=200_000, help="SFT training samples per dataset")
    p.add_argument("--sft-lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--eval-episodes", type=int, default=100)
    p.add_argument("--sources", nargs="+", default=list(SOURCES), choices=SOURCES)
    p.add_argument("--source-checkpoint", action="append", default=[], metavar="SOURCE=DIR",
                   help="use a finished RL checkpoint (a run's checkpoints/<name> folder) as SOURCE's policy "
                        "instead of training one, e.g. diffusion_rl=outputs/dp40/rl_s2/checkpoints/latest")
    p.add_argument("--reuse", action="store_true", help="keep the stages already finished under --out")
    p.add_argument("--report", action="store_true", help="only aggregate the records under --out")
    args = p.parse_args(own)
    args.train_overrides, args.argv = train_overrides, argv
    for name in ("rl_env_steps", "episodes", "sft_samples", "batch_size", "eval_episodes", "rl_eval_episodes"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    args.source_checkpoints = {}
    for item in args.source_checkpoint:
        source, _, path = item.partition("=")
        if source not in RL_SOURCES or not path:
            p.error(f"--source-checkpoint {item!r}: give SOURCE=DIR with SOURCE one of {', '.join(RL_SOURCES)}")
        if not (Path(path) / "config.json").is_file():
            p.error(f"--source-checkpoint {source}: '{path}' is not a checkpoint folder (no config.json); give a "
                    f"run's checkpoints/<name> folder")
        if source not in args.sources:
            p.error(f"--source-checkpoint {source}: {source} is not in --sources; add it or drop the checkpoint")
        args.source_checkpoints[source] = str(Path(path).absolute())
    if min(args.seeds) < 0 or 100_000 * (max(args.seeds) + 1) + 4 * args.episodes >= EVAL_SEED:
        p.error(f"--seeds must be in 0..8 so that collection seeds (100000 x (seed + 1) and up) stay below the "
                f"evaluation seeds ({EVAL_SEED}+)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    out = Path(args.out).resolve()
    t_all = time.time()
    if args.report:
        print(report(out, args, t_all))
        return 0
    if not args.reuse:
        old = [d / f"rl_{s}" if s in RL_SOURCES and s not in args.source_checkpoints else d / f"data_{s}"
               for s in args.sources
               for d in (out / f"seed{k}" for k in args.seeds)]
        old = [p for p in old if p.exists()] + [out / f"seed{k}" / f"{s}.json" for k in args.seeds
                                                for s in args.sources if (out / f"seed{k}" / f"{s}.json").exists()]
        if old:
            print(f"rl_datasets_pipeline: error: '{out}' already holds stages of this run ({old[0]}); pass --reuse "
                  f"to keep them or choose a new --out", file=sys.stderr)
            return 2
    out = prepare(out)
    try:
        for seed in args.seeds:
            d = out / f"seed{seed}"
            d.mkdir(exist_ok=True)
            for source in args.sources:
                run_source(source, seed, args, d)
            report(out, args, t_all)  # result.json after every seed; the table is printed once, at the end
            log(f"seed {seed} done")
    except PipelineError as e:
        print(f"rl_datasets_pipeline: error: {e}", file=sys.stderr)
        report(out, args, t_all)
        return 1
    print(report(out, args, t_all))
    log(f"wrote {out / 'result.json'} ({time.time() - t_all:.0f}s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
