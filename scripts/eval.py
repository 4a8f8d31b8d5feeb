"""Evaluate a policy checkpoint: same as the `vlarl-eval` console script."""

import sys

from vlarl.cli import eval_main

if __name__ == "__main__":
    sys.exit(eval_main())
