#!/usr/bin/env bash
# Set up vlarl on a fresh machine: a virtual environment in .venv with everything installed,
# plus the system rendering support the simulators need (scripts/setup_system.sh).
#
#   bash scripts/setup.sh            # everything (extras "all")
#   VLARL_EXTRAS=maniskill,test bash scripts/setup.sh
#
# On CPU machines torch is pinned to 2.13.0 in the same pip command as everything else: an
# unpinned torch would pull several GB of CUDA packages. Set VLARL_TORCH to change the pin
# (e.g. VLARL_TORCH="torch" on a CUDA machine).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${VLARL_VENV:-$ROOT/.venv}"
EXTRAS="${VLARL_EXTRAS:-all}"
TORCH_SPEC="${VLARL_TORCH:-torch==2.13.0}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --timeout 180 --upgrade pip

# A connection that stalls or drops in the middle of a large wheel should not end a fresh install: pip waits up to
# 3 minutes on a stalled download (--timeout; its default is 15 s), resumes a dropped one (--resume-retries), and a
# command that still fails is run again. (A full disk also shows as an incomplete download: check `df` first.)
pip_install() {
  local attempt
  for attempt in 1 2 3; do
    "$VENV/bin/python" -m pip install -q --timeout 180 --retries 10 --resume-retries 20 "$@" && return 0
    echo "[setup] pip install $* failed (attempt $attempt of 3)" >&2
  done
  return 1
}

echo "[setup] installing vlarl[$EXTRAS] with $TORCH_SPEC"
pip_install "$TORCH_SPEC" -e ".[$EXTRAS]"
# openpi's client (for the policy-server compatibility tests) pins numpy<2 but works with numpy 2:
# install it without its dependencies so it cannot downgrade numpy.
if [[ "$EXTRAS" == *all* || "$EXTRAS" == *robot* ]]; then
  pip_install --no-deps openpi-client
fi
VLARL_PYTHON="$VENV/bin/python" bash "$ROOT/scripts/setup_system.sh"
# ManiSkill's motion planner (vlarl-demos) needs numpy<2: a small environment of its own beside .venv
if [[ "$EXTRAS" == *all* || "$EXTRAS" == *maniskill* ]]; then
  VLARL_PYTHON="$VENV/bin/python" bash "$ROOT/scripts/setup_planner.sh"
fi
echo "[setup] done: activate with 'source $VENV/bin/activate'"
