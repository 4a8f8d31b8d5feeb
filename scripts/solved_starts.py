"""Which starts a policy solves, before and after a round: set arithmetic on the reset seeds of episode datasets.

    python scripts/solved_starts.py --start outputs/s19/det_seeds_s0 \
        --kept outputs/s19/si_try_s0/round0/successes --after outputs/s20/det_r0_s0 outputs/s20/det_ep80_s0

Every folder is a LeRobot v3.0 dataset whose episode table has a ``seed`` column (``vlarl-collect`` writes one per
kept episode): ``--start`` the successes of the policy a round started from (e.g. acting deterministically on the
round's collection seeds, ``vlarl-collect ... deterministic=true success_only=true``), ``--kept`` the round's kept
successes (``<round>/successes``), each ``--after`` the successes of a tuned policy on the same seeds. Prints one
markdown row per ``--after``: starts solved, how many of the kept starts new to the start it solves, how many of
the start's it lost, and how many it solves that the round never kept. Why: a round's held-out gain says little
about whether the tuned policy reproduces what it imitated; these counts do (docs/vla_pixels.md, session 20).
Bad input (a missing folder, a dataset without seeds): one line, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def solved_seeds(root: str | Path) -> set[int]:
    """The reset seeds of a dataset's episodes. ValueError (one line) when it is not a dataset with seeds."""
    from vlarl.data.lerobot_v3 import read_episode_table

    try:
        rows = read_episode_table(root)
    except FileNotFoundError as e:
        raise ValueError(f"{root}: {e}") from None
    if rows and any(r.get("seed") is None for r in rows):
        raise ValueError(f"{root}: its episode table has no 'seed' for every episode; record it with vlarl-collect, "
                         f"which writes each episode's reset seed")
    return {int(r["seed"]) for r in rows}


def table(start: set[int], kept: set[int], after: dict[str, set[int]]) -> str:
    """The markdown table: one row for the start, one for the kept starts, one per tuned policy."""
    new = kept - start
    lines = ["| dataset | starts solved | of the kept starts new to the start | of the start's lost | solved, not kept |",
             "|---|---:|---:|---:|---:|",
             f"| start | {len(start)} | | | |",
             f"| kept by the round | {len(kept)} | {len(new)} | | |"]
    lines += [f"| {name} | {len(s)} | {len(s & new)} | {len(start - s)} | {len(s - kept)} |" for name, s in after.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--start", required=True, help="successes of the policy the round started from")
    ap.add_argument("--kept", required=True, help="the round's kept successes (<round>/successes)")
    ap.add_argument("--after", nargs="+", required=True, help="successes of tuned policies on the same seeds")
    args = ap.parse_args(argv)
    try:
        start, kept = solved_seeds(args.start), solved_seeds(args.kept)
        after = {str(a): solved_seeds(a) for a in args.after}
    except ValueError as e:
        ap.error(str(e).splitlines()[0])
    print(table(start, kept, after))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
