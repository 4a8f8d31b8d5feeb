#!/usr/bin/env bash
# The second GPU call of 2026-11-28 (docs/gpu.md "Planner and CUDA tests"), from the repository root on the lent
# GPU machine:
#
#   bash scripts/gpu/planner_call.sh             # CUDA tests + the planner's predictions against the allocator
#   bash scripts/gpu/planner_call.sh --dry-run   # any machine: the steps printed, the carried files checked
#   bash scripts/gpu/planner_call.sh --models OpenVLA-OFT   # ARGS after the options go to bench_planner.py gpu
#
# Carry: gpu_wheels/tf (transformers 5.24, as call 1), gpu_wheels/planner (pred.json from
# `python scripts/bench_planner.py predict --out gpu_wheels/planner/pred.json`; the diffusers and
# importlib_metadata wheels, which the policy registry imports and the image lacks; site/ with pure-Python copies
# of omegaconf, hydra and antlr4, which the config loader needs). Ray is not needed: the config loader and these
# tests import no Ray. Steps, each under `timeout`:
#   1. pytest -m gpu on the tests that need no simulator: the collective on one real GPU, the reply check's
#      one flag, a trajectory from CUDA replies, the planner's CUDA measurement (-> $OUT/gpu_tests.log), 150 s;
#   2. scripts/bench_planner.py gpu: every predicted row built for real, 4 at once (-> $OUT/planner_gpu.md/.json), 330 s.
set -uo pipefail
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY="${VLARL_PYTHON:-python3}"
OUT="${OUT:-$(mktemp -d)}"
SITE="${VLARL_PLANNER_SITE:-/tmp/vlarl_planner}"
for f in gpu_wheels/planner/pred.json gpu_wheels/planner/site/omegaconf gpu_wheels/planner/site/hydra; do
  [ -e "$f" ] || { echo "planner_call.sh: $f is missing: see the header of this script for how to make it" >&2; exit 2; }
done
shopt -s nullglob
wheels=(gpu_wheels/planner/*.whl gpu_wheels/tf/transformers-*.whl)
if [ "$DRY" = 1 ]; then
  echo "[dry-run] $PY -m pip install --no-index --no-deps --target $SITE ${wheels[*]}"
  echo "[dry-run] timeout 120 $PY -m pytest -m gpu tests/scheduler/test_collective.py tests/simulators/test_validation.py tests/workers/test_gpu_device_paths.py tests/planning/test_gpu_measure.py"
  echo "[dry-run] timeout 330 $PY scripts/bench_planner.py gpu --predicted gpu_wheels/planner/pred.json --out \$OUT --parallel 4 --deadline-s 290 $*"
  exit 0
fi
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}" || exit 1
export PYTHONPATH="$ROOT:$SITE:$ROOT/gpu_wheels/planner/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
{ nvidia-smi -L; "$PY" -c "import torch, transformers, diffusers, omegaconf, hydra
print('torch', torch.__version__, 'transformers', transformers.__version__, 'diffusers', diffusers.__version__)"; } \
  2>&1 | tee "$OUT/gpu_probe.txt"
timeout 120 "$PY" -m pytest -p no:cacheprovider -o addopts= -m gpu -v -rs \
  tests/scheduler/test_collective.py tests/simulators/test_validation.py tests/workers/test_gpu_device_paths.py \
  tests/planning/test_gpu_measure.py 2>&1 | tee "$OUT/gpu_tests.log"
timeout 330 "$PY" scripts/bench_planner.py gpu --predicted gpu_wheels/planner/pred.json --out "$OUT" --parallel 4 --deadline-s 290 \
  --limit-s 150 "$@" 2>&1 | tee "$OUT/planner_gpu.log"
