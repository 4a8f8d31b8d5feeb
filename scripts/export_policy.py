"""Export a policy checkpoint: same as the `vlarl-export` console script."""

import sys

from vlarl.export.cli import main

if __name__ == "__main__":
    sys.exit(main())
