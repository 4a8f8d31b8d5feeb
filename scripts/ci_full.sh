#!/usr/bin/env bash
# The slow tier: every test marked slow (system claims at full size, more simulator tasks), after the default
# and heavy tiers (what CI runs). Usage: bash scripts/ci_full.sh [extra pytest args]. Prints the wall time of each tier at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
export VLARL_REQUIRE_ALL=1
t0=$(date +%s)
.venv/bin/python -m pytest -q -p no:cacheprovider -m "not slow and not gpu" "$@"
t1=$(date +%s)
.venv/bin/python -m pytest -q -p no:cacheprovider -m "slow and not gpu" "$@"
t2=$(date +%s)
echo "[ci_full] default and heavy tiers $((t1 - t0)) s, slow tier $((t2 - t1)) s"
