#!/usr/bin/env bash
# The GPU tests of vlarl on the lent GPU machine (device tool `run`), from the repository root.
#
#   bash scripts/gpu/run_gpu_tests.sh install   # stash this call's gpu_wheels/b*, install the wheels now whole
#   bash scripts/gpu/run_gpu_tests.sh test      # pytest -m gpu + the CUDA-machine runs of the sim/placement/sync tests
#   bash scripts/gpu/run_gpu_tests.sh all       # install, then test if nothing is missing
#   bash scripts/gpu/run_gpu_tests.sh --dry-run all   # on any machine: the stash/join/verify work for real (in a
#                                                     # temp stash), the pip and pytest commands printed, no CUDA
#
# The wheels come from scripts/gpu/prepare_wheels.sh, one batch (gpu_wheels/bN, <= 60 MiB) per device call:
# each call copies its batch into a stash that outlives the call while the machine stays warm, joins the
# parts of a wheel cut across batches once all are there (sha256 checked against MANIFEST), and installs
# every whole wheel with --no-deps into a target folder (the image's own torch/CUDA stay untouched).
# Then vlarl itself (--no-deps). The tests run with PYTHONPATH=<repo>:<target>; output goes to $OUT
# (the device tool brings back at most 8 files): gpu_probe.txt, gpu_tests.log (every run), summary.txt
# (one line per run), junit.tar.gz.
#
# Which tests (tests/ read on 2026-11-23; `-m gpu` picks up any gpu test added later):
#   1. every `gpu`-marked test, each node in its own pytest process (ManiSkill's GPU PhysX holds one
#      simulator per process): today tests/simulators/test_maniskill_gpu.py::
#      test_physx_cuda_batch_stays_on_gpu_with_partial_resets_and_groups and ::test_contract_on_physx_cuda[*];
#   2. the rest of tests/simulators/test_maniskill_gpu.py and the ManiSkill cases of
#      tests/simulators/test_contract.py (CPU backend, here rendered by the GPU's Vulkan driver);
#   3. tests/scheduler/test_placement.py (GPU placement resolved for device_type=gpu) and
#      tests/workers/test_weight_sync.py (Ray + the collective weight group; it has no NCCL variant yet).
set -uo pipefail
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
WHAT="${1:-all}"
case "$WHAT" in install|test|all) ;; *)
  echo "run_gpu_tests.sh: unknown step '$WHAT'; use install, test or all (optionally after --dry-run)" >&2; exit 2;;
esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY="${VLARL_PYTHON:-python3}"
WHEELS="${VLARL_WHEEL_DIR:-$ROOT/gpu_wheels}"
if [ "$DRY" = 1 ]; then
  STASH="${VLARL_STASH:-$(mktemp -d)/stash}"; SITE="${VLARL_SITE:-$(mktemp -d)/site}"
  OUT="${OUT:-$(mktemp -d)}"
else
  STASH="${VLARL_STASH:-/tmp/vlarl_wheels}"; SITE="${VLARL_SITE:-/tmp/vlarl_site}"; OUT="${OUT:-$ROOT/gpu_out}"
fi
mkdir -p "$STASH" "$SITE" "$OUT"
run() {  # a command, or its line with --dry-run
  if [ "$DRY" = 1 ]; then echo "[dry-run] $*"; else "$@"; fi
}

install_wheels() {
  local b f name parts sha missing=() whole=()
  for b in "$WHEELS"/b*; do
    [ -d "$b" ] || continue
    echo "[install] stashing $(basename "$b")"
    cp -f "$b"/* "$STASH"/
  done
  if [ ! -f "$STASH/MANIFEST" ]; then
    echo "[install] no MANIFEST in $STASH: carry a batch of gpu_wheels/ (bash scripts/gpu/prepare_wheels.sh)" >&2
    return 2
  fi
  while read -r name parts sha; do
    [ -n "$name" ] || continue
    if [ ! -f "$STASH/$name" ] && [ "$parts" -gt 1 ]; then
      local have=0 i
      for ((i = 0; i < parts; i++)); do [ -f "$STASH/$name.part$(printf %02d "$i")" ] && have=$((have + 1)); done
      if [ "$have" = "$parts" ]; then
        for ((i = 0; i < parts; i++)); do cat "$STASH/$name.part$(printf %02d "$i")"; done >"$STASH/$name.tmp"
        mv "$STASH/$name.tmp" "$STASH/$name" && rm -f "$STASH/$name".part*
        echo "[install] joined $name from $parts parts"
      else
        missing+=("$name ($have of $parts parts)"); continue
      fi
    fi
    if [ ! -f "$STASH/$name" ]; then missing+=("$name"); continue; fi
    if [ "$(sha256sum "$STASH/$name" | cut -d' ' -f1)" != "$sha" ]; then
      echo "[install] $name: sha256 differs from MANIFEST (a broken copy): carry its batch again" >&2
      rm -f "$STASH/$name"; missing+=("$name (bad copy)"); continue
    fi
    [ -f "$STASH/$name.installed" ] || whole+=("$STASH/$name")
  done <"$STASH/MANIFEST"
  if [ "${#whole[@]}" -gt 0 ]; then
    run "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${whole[@]}" \
      && for f in "${whole[@]}"; do touch "$f.installed"; done
  fi
  echo "[install] whole wheels installed this call: ${#whole[@]}; missing: ${#missing[@]}"
  if [ "${#missing[@]}" -gt 0 ]; then
    printf '[install] still missing: %s\n' "${missing[@]}"
    echo "[install] carry the next gpu_wheels/bN in the next call"
    return 3
  fi
  if [ "${VLARL_SKIP_SELF:-0}" = 1 ]; then  # runs that put the checkout on PYTHONPATH need no install of it
    echo "[install] vlarl itself not installed (VLARL_SKIP_SELF=1: the checkout is on PYTHONPATH)"; return 0
  fi
  run "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$SITE" "$ROOT" \
    || return 1
  echo "[install] vlarl installed (--no-deps) into $SITE"
}

gpu_env() {  # PYTHONPATH, offline HF, Vulkan loaders: scripts/gpu/env.sh
  VLARL_SITE="$SITE" VLARL_DRY_RUN="$DRY" source "$ROOT/scripts/gpu/env.sh"
}

PYTEST=(-m pytest -p no:cacheprovider -rA -q)
run_pytest() {  # <label> <pytest args...>: output appended to $OUT/gpu_tests.log, junit xml kept for the tarball
  local label="$1"; shift
  if [ "$DRY" = 1 ]; then echo "[dry-run] $PY ${PYTEST[*]} $* >> $OUT/gpu_tests.log"; return 0; fi
  echo "[test] $label: pytest $*"
  mkdir -p "$OUT/.junit"
  { echo "===== $label: pytest $*"; "$PY" "${PYTEST[@]}" --junitxml="$OUT/.junit/$label.xml" "$@" 2>&1; } \
    >"$OUT/.junit/$label.log"
  local rc=$?
  cat "$OUT/.junit/$label.log" >>"$OUT/gpu_tests.log"
  echo "$label rc=$rc $(tail -1 "$OUT/.junit/$label.log")" | tee -a "$OUT/summary.txt"
  [ "$rc" = 0 ]
}

run_tests() {
  gpu_env
  local fails=0 node i=0
  if [ "$DRY" = 0 ]; then
    { nvidia-smi -L; "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
torch.cuda.get_device_name() if torch.cuda.is_available() else '')"; "$PY" -c "import mani_skill, sapien, ray, hydra
print('mani_skill', mani_skill.__version__, 'sapien', sapien.__version__, 'ray', ray.__version__)"; } \
      >"$OUT/gpu_probe.txt" 2>&1
    cat "$OUT/gpu_probe.txt"
    : >"$OUT/summary.txt"
    mapfile -t GPU_NODES < <("$PY" -m pytest -p no:cacheprovider -q --collect-only -m gpu tests/ 2>/dev/null \
      | grep '::')
  else
    GPU_NODES=("<each node of: pytest --collect-only -q -m gpu tests/>")
  fi
  echo "[test] ${#GPU_NODES[@]} gpu-marked tests"
  for node in "${GPU_NODES[@]}"; do
    i=$((i + 1))
    VLARL_REQUIRE_ALL=1 run_pytest "gpu_$(printf %02d "$i")" -m gpu "$node" || fails=$((fails + 1))
  done
  VLARL_REQUIRE_ALL=1 run_pytest maniskill_gpu tests/simulators/test_maniskill_gpu.py || fails=$((fails + 1))
  run_pytest contract_maniskill tests/simulators/test_contract.py -k maniskill || fails=$((fails + 1))
  VLARL_REQUIRE_ALL=1 run_pytest placement_sync tests/scheduler/test_placement.py tests/workers/test_weight_sync.py \
    || fails=$((fails + 1))
  if [ "$DRY" = 0 ]; then  # the device brings back at most 8 files: one tarball of the junit xml files
    tar -czf "$OUT/junit.tar.gz" -C "$OUT/.junit" . && rm -rf "$OUT/.junit"
  fi
  echo "[test] pytest runs failed: $fails (gpu_probe.txt, gpu_tests.log, summary.txt, junit.tar.gz in $OUT)"
  return $((fails > 0))
}

rc=0
if [ "$WHAT" = install ] || [ "$WHAT" = all ]; then
  install_wheels; rc=$?
  if [ "$rc" != 0 ] && [ "$WHAT" = all ]; then echo "[all] not testing yet (install rc=$rc)"; exit "$rc"; fi
fi
if [ "$WHAT" = test ] || [ "$WHAT" = all ]; then
  run_tests; rc=$?
fi
exit "$rc"
