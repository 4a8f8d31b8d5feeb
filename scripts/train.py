"""Train a policy: same as the `vlarl-train` console script (Hydra-style overrides)."""

import sys

from vlarl.cli import train_main

if __name__ == "__main__":
    sys.exit(train_main())
