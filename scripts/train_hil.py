"""Learn on the Franka with a human in the loop: ``vlarl.hil.cli`` (its docstring lists the keys).

    python scripts/train_hil.py output=outputs/hil_reach hil.episodes=200 hil.interventions.device=scripted
    python scripts/train_hil.py output=outputs/hil_reach resume=true
"""

from __future__ import annotations

import sys

from vlarl.hil.cli import main

if __name__ == "__main__":
    sys.exit(main())
