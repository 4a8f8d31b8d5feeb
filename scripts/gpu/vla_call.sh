#!/usr/bin/env bash
# Call 1 of the GPU plan (docs/gpu.md), from the repository root on the lent GPU machine:
#
#   bash scripts/gpu/vla_call.sh                      # the real-size VLA table into $OUT
#   bash scripts/gpu/vla_call.sh --dry-run [ARGS...]  # any machine: the install printed, the table's CPU dry
#                                                     # run (tiny configs); ARGS go to gpu_vla_table.py
#
# The image's transformers (5.17 when last read) is older than the 5.24 CI runs; the carried wheel
# gpu_wheels/tf/transformers-*.whl (12.9 MiB; its needs huggingface-hub >= 1.31, tokenizers 0.23, safetensors
# 0.8 are in the image) goes into its own target folder ahead on PYTHONPATH, so the policy modules run on the
# transformers they are tested with. Without the wheel, the image's own is used (and the probe says which).
set -uo pipefail
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY="${VLARL_PYTHON:-python3}"
TF_SITE="${VLARL_TF_SITE:-/tmp/vlarl_tf}"
OUT="${OUT:-$(mktemp -d)}"
export OUT
shopt -s nullglob
wheels=("${VLARL_TF_WHEELS:-gpu_wheels/tf}"/transformers-*.whl)
if [ "${#wheels[@]}" -gt 0 ]; then
  if [ "$DRY" = 1 ]; then
    echo "[dry-run] $PY -m pip install -q --no-index --no-deps --no-compile --target $TF_SITE ${wheels[*]}"
  else
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$TF_SITE" \
      "${wheels[@]}" || exit 1
    export PYTHONPATH="$TF_SITE${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
VLARL_DRY_RUN="$DRY" source scripts/gpu/env.sh
if [ "$DRY" = 1 ]; then
  exec "$PY" scripts/gpu_vla_table.py --dry-run --out "$OUT" "$@"
fi
{ nvidia-smi -L; "$PY" -c "import torch, transformers, peft
print('torch', torch.__version__, 'transformers', transformers.__version__, 'from', transformers.__file__,
      'peft', peft.__version__)"; } 2>&1 | tee "$OUT/gpu_probe.txt"
"$PY" scripts/gpu_vla_table.py --out "$OUT" "$@" 2>&1 | tee "$OUT/vla_table.log"
