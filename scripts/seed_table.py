"""Mean and spread over RL seeds of held-out success per task, against the policy they all started from:

    python scripts/seed_table.py --base <vlarl-eval folder of the start> <vlarl-eval folder of seed 0> ... \
        [--json <file>]

Every folder is a ``vlarl-eval`` output (its ``eval.json``, per task as a multi-task env writes it), all on the
same held-out seeds and episode counts. Prints a markdown table: per task the base, each seed, the mean and sample
standard deviation, min-max, and the mean gain in points; ``--json`` also writes those numbers. Self-imitation's
``--final-episodes`` writes ``<out>/final/last`` (and ``<out>/final/base`` with ``--eval-base``), PPO runs are
evaluated with ``vlarl-eval checkpoint=<run>/checkpoints/latest output=<folder>``. Bad arguments: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vlarl.experiments import per_task, seed_spread


def table(summary: dict, names: list[str]) -> str:
    """The summary of ``seed_spread`` as a markdown table, one row per task and one pooled."""
    head = "| task | base | " + " | ".join(names) + " | mean +- std | min-max | gain (points) |"
    lines = [head, "|---" * (len(names) + 5) + "|"]
    rows = [*summary["tasks"].items(), ("all tasks", summary["all"])]
    for task, s in rows:
        lines.append(f"| {task} | {s['base']:.2f} | " + " | ".join(f"{x:.2f}" for x in s["seeds"])
                     + f" | {s['mean']:.2f} +- {s['std']:.2f} | {s['min']:.2f}-{s['max']:.2f} | {100 * s['gain']:+.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the vlarl-eval folder of the policy every seed started from")
    ap.add_argument("runs", nargs="+", help="one vlarl-eval folder per RL seed")
    ap.add_argument("--json", default="", help="also write the numbers here")
    args = ap.parse_args(argv)
    for d in [args.base, *args.runs]:
        if not (Path(d) / "eval.json").is_file():
            ap.error(f"{d} holds no eval.json; pass the output folder of a vlarl-eval run")
    try:
        summary = seed_spread(per_task(args.base), [per_task(d) for d in args.runs])
    except ValueError as e:
        ap.error(str(e))
    names = [f"seed {i}" for i in range(len(args.runs))]
    print(table(summary, names))
    print(f"(held-out episodes per task: {summary['episodes']}; base {args.base}; runs {', '.join(args.runs)})")
    if args.json:
        Path(args.json).write_text(json.dumps({**summary, "base_eval": args.base, "run_evals": args.runs}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
