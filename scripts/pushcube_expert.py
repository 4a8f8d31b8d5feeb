"""Record scripted ManiSkill3 experts' demonstrations (PushCube-v1, PickCube-v1) as ManiSkill trajectory HDF5 or
as a LeRobot v3.0 dataset: the command line of ``vlarl.data.expert_demos.record_demos`` (the file layouts and
the failed-episode variant are described there; the experts are ``simulators.maniskill_experts``).

    python scripts/pushcube_expert.py --out data/demos/pushcube.h5 --episodes 20 --seed 0
    python scripts/pushcube_expert.py --out data/demos/pushcube_lerobot --format lerobot --episodes 20
    python scripts/pushcube_expert.py --task pickcube --out outputs/demos/pickcube_20.h5 --episodes 20 --seed 0
    python scripts/pushcube_expert.py --out outputs/demos/pushcube_mixed.h5 --episodes 15 --failures 15

Seeds must stay below the evaluation seeds (1,000,000+).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from simulators.maniskill_experts import EXPERTS
from vlarl.data.expert_demos import FORMATS, failures_problem, record_demos
from vlarl.experiments import prepare


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--task", default="pushcube", choices=sorted(EXPERTS), help="which scripted expert")
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--failures", type=int, default=0,
                   help="also record this many failed episodes (PushCube, .h5), interleaved with the successes")
    p.add_argument("--format", default="h5", choices=FORMATS, help="ManiSkill .h5 or a LeRobot v3.0 dataset folder")
    p.add_argument("--overwrite", action="store_true", help="replace an existing LeRobot dataset at --out")
    args = p.parse_args(argv)
    problem = failures_problem(args.task, args.failures, args.format)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    prepare(Path(args.out).parent)
    print(json.dumps(record_demos(args.out, args.episodes, args.seed, fmt=args.format, overwrite=args.overwrite,
                                  task=args.task, failures=args.failures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
