"""Improve a saved policy by imitating its own successful episodes, round after round, evaluated per task:

    python scripts/self_imitation.py --base outputs/multitask/sft --demos outputs/multitask/demos/trajectories.h5 \
        --out outputs/self_imitation [--rounds 2] [--attempts 300] [--sft-epochs 20] [--sft-lr 3e-4] [--seed 0]
        [--eval-episodes 50] [--eval-envs 8] [--eval-base] [--final-episodes 100] [--validation-seed 100000]
        [--max-length 25] [--tries-per-seed 1]

Round r (``vlarl.self_imitation.run_round``) starts from the base (r = 0) or the previous round's policy, samples
``--attempts`` episodes on training seeds (200,000 + 100,000 x seed + r x attempts on; episodes end at the first
success, and with ``--max-length N`` an episode not solved within N env steps is given up there; with
``--tries-per-seed K`` each seed is sampled K times and at most one success per seed is kept), keeps the
successful ones (``<out>/round<r>/successes``, LeRobot v3.0), fine-tunes on the demonstrations
(if given) plus every round's kept episodes (``<out>/round<r>/policy``), and ``vlarl-eval`` runs it on held-out seeds
(1,000,000+), each task on its own (``<out>/round<r>/eval``). ``<out>/result.json`` holds every round's record and
the per-task success, and a table is printed. ``--final-episodes N`` evaluates the newest round's policy (and the
base with ``--eval-base``) once more on N episodes per task into ``<out>/final``: the number a learning claim quotes,
while the rounds' own evaluations follow the progress more cheaply. With ``--validation-seed S`` the rounds (and the
base) are evaluated on validation seeds S+ instead (``<out>/round<r>/eval_validation``), and the final evaluation
goes to the one that did best there (``<out>/final/best``; ``result.json``'s ``final.chosen``): a later round can
undo an earlier one's gain, and choosing by the held-out seeds themselves would flatter the number. A round whose
``round.json`` and evaluation exist is read, not redone, so an interrupted command continues where it stopped; a
round whose collection finished (``<out>/round<r>/collect.json``, from the same policy with the same sampling
settings) imitates from it without sampling again, with whatever ``--sft-epochs``, ``--sft-lr`` or ``--balance``
are given. Bad arguments: one line, exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from vlarl.experiments import (
    Stages,
    add_held_out_arguments,
    add_sft_arguments,
    check_held_out_seed,
    per_task,
    prepare,
)

STAGES = Stages("self-imitation")
log = STAGES.log
#: [first, last + 1) of the seeds --validation-seed may use: above every demonstration seed, below the collection
#: seeds (vlarl.self_imitation.COLLECT_SEED_BASE) and the held-out ones (1,000,000+)
VALIDATION_SEEDS = (100_000, 200_000)


def choose(scores: list[tuple[str, float]]) -> str:
    """The name with the highest validation success; a tie goes to the later one (the round that imitated more)."""
    best = max(score for _, score in scores)
    return [name for name, score in scores if score == best][-1]


def table(rows: list[tuple[str, dict]]) -> str:
    """A markdown table of per-task success, one row per policy."""
    tasks = list(dict.fromkeys(t for _, r in rows for t in r["tasks"]))
    lines = ["| policy | " + " | ".join(tasks) + " | all |", "|---" * (len(tasks) + 2) + "|"]
    for name, r in rows:
        lo, hi = r["success_once_ci95"]
        lines.append(f"| {name} | " + " | ".join(f"{r['tasks'][t]['success_once']:.2f}" if t in r["tasks"] else "-"
                                                  for t in tasks)
                     + f" | {r['success_once']:.2f} [{lo:.2f}, {hi:.2f}] |")
    return "\n".join(lines)


def same_evaluation(where: Path, policy: Path, seed: int) -> bool:
    """Whether ``where/eval.json`` evaluated ``policy`` from ``seed``."""
    f = where / "eval.json"
    if not f.is_file():
        return False
    ev = json.loads(f.read_text())
    return Path(ev.get("checkpoint", "")).resolve() == Path(policy).resolve() and ev.get("seed_start") == seed


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the policy directory to improve (SFT output or a checkpoint)")
    ap.add_argument("--demos", default="", help="the demonstrations it was fine-tuned on (.h5 or LeRobot folder), "
                    "imitated again beside its own episodes; none: its own episodes only")
    ap.add_argument("--out", default="outputs/self_imitation")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--attempts", type=int, default=300, help="sampled episodes per round")
    ap.add_argument("--num-envs", type=int, default=6, help="envs sampled side by side while collecting")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-base", action="store_true", help="also evaluate the base policy")
    ap.add_argument("--max-length", type=int, default=0, help="give up a sampled episode not solved within this many "
                    "env steps (a failure otherwise runs to the time limit; e.g. twice the demonstrations' length); "
                    "0: the time limit")
    ap.add_argument("--tries-per-seed", type=int, default=1, help="sample each collection seed this many times "
                    "and keep at most one success per seed (the starts solved within that many tries, each once)")
    ap.add_argument("--balance", action="store_true", help="imitate every instruction's kept episodes as often as "
                    "the most frequent instruction's (repeats)")
    add_sft_arguments(ap, epochs=20)
    ap.set_defaults(sft_lr=3e-4)
    add_held_out_arguments(ap, episodes=50)
    ap.add_argument("--final-episodes", type=int, default=0, help="after the last round, evaluate its policy (and the "
                    "base, with --eval-base) again on this many held-out episodes per task into <out>/final "
                    "(scripts/seed_table.py reads them); 0: no final evaluation")
    ap.add_argument("--validation-seed", type=int, default=0, help="evaluate the rounds (and the base) on validation "
                    f"seeds from this one ({VALIDATION_SEEDS[0]:,}+: neither collected from nor held out) and give "
                    "the final evaluation the round that did best there; 0: the rounds on held-out seeds, the last "
                    "round final")
    args = ap.parse_args(argv)
    check_held_out_seed(ap, args.eval_seed)
    if min(args.rounds, args.attempts, args.num_envs, args.sft_epochs, args.batch_size, args.tries_per_seed) < 1:
        ap.error("--rounds, --attempts, --num-envs, --sft-epochs, --batch-size and --tries-per-seed must be >= 1")
    if args.max_length < 0:
        ap.error(f"--max-length={args.max_length}: use 0 (the env's time limit) or a number of env steps, e.g. 25")
    if args.final_episodes < 0:
        ap.error(f"--final-episodes={args.final_episodes}: use 0 (none) or a number of episodes per task, e.g. 100")
    lo, hi = VALIDATION_SEEDS
    if args.validation_seed and not lo <= args.validation_seed <= hi - args.eval_episodes:
        ap.error(f"--validation-seed={args.validation_seed} with {args.eval_episodes} episodes leaves the validation "
                 f"seeds [{lo:,}, {hi:,}); use e.g. --validation-seed {lo}")
    from vlarl.self_imitation import collection_seeds

    try:
        collection_seeds(args.seed, args.rounds - 1, args.attempts)
    except ValueError as e:
        ap.error(str(e))
    from policies.base import CheckpointError
    from vlarl.checkpoint import load_env_config
    from vlarl.checkpoint_files import check_checkpoint

    try:
        check_checkpoint(args.base)
    except CheckpointError as e:
        ap.error(str(e).strip().splitlines()[0])
    if load_env_config(args.base) is None:
        ap.error(f"--base {args.base} has no env.json; pass a directory that vlarl-train or an SFT script saved")
    if args.demos and not Path(args.demos).exists():
        ap.error(f"--demos {args.demos} does not exist; pass the .h5 file or LeRobot folder the base was trained on")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(list(sys.argv[1:] if argv is None else argv))
    out = prepare(args.out)
    t0 = time.time()

    from tqdm import tqdm

    from policies.base import Policy
    from vlarl.data.demonstrations import read_demonstrations
    from vlarl.self_imitation import RoundSettings, run_round

    settings = RoundSettings(attempts=args.attempts, num_envs=args.num_envs, epochs=args.sft_epochs, lr=args.sft_lr,
                             batch_size=args.batch_size, seed=args.seed, balance=args.balance,
                             max_length=args.max_length, tries_per_seed=args.tries_per_seed)
    cameras = list(Policy.saved_spec(args.base).image_keys)
    demos = read_demonstrations(args.demos, cameras=cameras) if args.demos else []
    log(f"{len(demos)} demonstrations ({args.demos or 'none given'}); {args.rounds} rounds of {args.attempts} "
        f"sampled episodes")
    evals: list[tuple[str, dict]] = []  # the rounds' evaluations, on --eval-episodes per task
    finals: list[tuple[str, dict]] = []  # the final ones, on --final-episodes per task

    validating = args.validation_seed > 0
    round_seed, round_eval = (args.validation_seed, "eval_validation") if validating else (args.eval_seed, "eval")
    candidates: dict[str, Path] = {}  # what a validation-chosen final evaluation may pick, by name

    def evaluate(policy: Path, name: str, where: Path, into: list, episodes: int = args.eval_episodes,
                 seed: int = round_seed) -> dict:
        """Per-task success of ``policy`` from ``where`` (evaluated there first unless an earlier run evaluated this
        very policy there from the same seed: a run given more rounds may choose another policy for ``final``)."""
        if not same_evaluation(where, policy, seed):
            STAGES.evaluate(policy, where, episodes, seed, args.eval_envs, f"evaluate {name}")
        into.append((name, per_task(where)))
        candidates[name] = policy
        return into[-1][1]

    if args.eval_base:
        evaluate(Path(args.base), "base", out / ("eval_base_validation" if validating else "eval_base"), evals)
    policy, rounds = Path(args.base), []
    for r in range(args.rounds):
        rdir = out / f"round{r}"
        if (rdir / "round.json").is_file():
            record = json.loads((rdir / "round.json").read_text())
            log(f"round {r}: finished earlier, read {rdir / 'round.json'}")
        else:
            bars: list = []  # opened at the first epoch, so its clock starts after the collection

            def progress(epoch: int, loss: float, bars=bars, r=r) -> None:
                if not bars:
                    bars.append(tqdm(total=args.sft_epochs, desc=f"round {r} imitate", unit="epoch"))
                bars[0].update(1)
                bars[0].set_postfix(loss=f"{loss:.4f}")

            record = run_round(policy, demos, rdir, settings, r, [out / f"round{k}" / "successes" for k in range(r)],
                               log, progress)
            for bar in bars:
                bar.close()
        c = record["collect"]
        log(f"round {r}: kept {c['kept']} of {c['attempts']} sampled episodes ({c['success_rate']:.2f}); by "
            f"instruction {c['kept_by_instruction']} of {c['attempts_by_instruction']}"
            + (f"; {c['seeds_solved']} of {c['seeds_tried']} seeds solved" if "seeds_tried" in c else ""))
        rounds.append(record)
        if record["policy"] is None:
            break
        policy = Path(record["policy"])
        evaluate(policy, f"round {r}", rdir / round_eval, evals)
    final: dict = {}
    chosen = choose([(n, e["success_once"]) for n, e in evals]) if validating and evals else None
    if chosen is not None:
        policy = candidates[chosen]
        final.update(chosen=chosen, validation={n: e["success_once"] for n, e in evals},
                     validation_seed=args.validation_seed)
        log(f"chosen on {args.eval_episodes} validation episodes per task from seed {args.validation_seed}: "
            f"{chosen} ({dict(evals)[chosen]['success_once']:.2f})")
    if args.final_episodes and (policy != Path(args.base) or chosen == "base"):
        name, folder = ("chosen", "best") if validating else ("last round", "last")
        final.update(episodes=args.final_episodes, policy=str(policy),
                     last=evaluate(policy, f"{name}, final", out / "final" / folder, finals, args.final_episodes,
                                   args.eval_seed))
        if args.eval_base:
            final["base"] = evaluate(Path(args.base), "base, final", out / "final" / "base", finals,
                                     args.final_episodes, args.eval_seed)
        print(table(finals))
        print(f"({args.final_episodes} held-out episodes per task from seed {args.eval_seed})")
    result = {"rounds": rounds, "evals": dict(evals), "final": final, "wall_s": time.time() - t0,
              "command": "python scripts/self_imitation.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    (out / "result.json").write_text(json.dumps(result, indent=2))
    if evals:
        print(table(evals))
        print(f"({args.eval_episodes} {'validation' if validating else 'held-out'} episodes per task from seed "
              f"{round_seed})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
