"""A long learning run on franky-sim that checks the arm stays inside the real controller's limits:
``vlarl.hil.soak`` (its docstring says what is measured).

    python scripts/robot_soak.py --episodes 250 --output outputs/robot_soak [train_hil key=value ...]
"""

from __future__ import annotations

import sys

from vlarl.hil.soak import main

if __name__ == "__main__":
    sys.exit(main())
