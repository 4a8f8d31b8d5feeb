#!/usr/bin/env bash
# The motion planner's own environment (.venv-planner) for vlarl-demos.
#
# ManiSkill 3.0.1's motion-planning solutions need mplib 0.1.1, and mplib (0.1.1 and 0.2.1 alike) crashes with a
# segmentation fault under numpy 2, which vlarl's environment has. The planner therefore runs in an environment of
# its own, started as a subprocess by simulators/maniskill_demos.py; the conversion to the training control and
# observation mode (ManiSkill's replay_trajectory) runs in vlarl's environment.
#
# The planner environment holds only numpy<2, mplib and mplib's own needs; everything else (ManiSkill, SAPIEN,
# torch, gymnasium) it reads from vlarl's environment through a .pth file that comes after its own packages, so
# its numpy 1.x wins there and nothing is installed twice.
#
#   bash scripts/setup_planner.sh            # -> .venv-planner (needs .venv, made by scripts/setup.sh)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLARL_PLANNER_VENV:-$ROOT/.venv-planner}"
MAIN_PYTHON="${VLARL_PYTHON:-$ROOT/.venv/bin/python}"
check='import numpy, mplib, mani_skill, torch; assert numpy.__version__.startswith("1.")'
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$check" 2>/dev/null; then
  echo "[setup_planner] $VENV is ready"
  exit 0
fi
echo "[setup_planner] creating $VENV (numpy<2, mplib 0.1.1; the rest from $MAIN_PYTHON's environment)"
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "numpy<2" "mplib==0.1.1"
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$MAIN_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$SITE/zz_vlarl_main_env.pth"
"$VENV/bin/python" -c "$check"
echo "[setup_planner] done: $VENV/bin/python"
