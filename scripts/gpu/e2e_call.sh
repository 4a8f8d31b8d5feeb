#!/usr/bin/env bash
# vlarl end to end on the lent GPU machine (device tool `run`), from the repository root: Ray, Hydra, ManiSkill
# (CPU PhysX: the GPU PhysX library cannot be carried, docs/gpu.md) rendered by the GPU's Vulkan, the learner
# on CUDA. One call per batch of scripts/gpu/prepare_e2e.sh, back to back (the stash lives while the machine
# is warm):
#
#   bash scripts/gpu/e2e_call.sh            # carry gpu_wheels/e2e/b1 (+ .gl): stashed, exit 3; then b2; then b3
#                                           # with outputs/demos/<the default's demonstrations>: install, then run
#   bash scripts/gpu/e2e_call.sh --dry-run  # any machine: the install for real into temp folders, runs printed
#
# With every wheel installed it runs, each under `timeout`, output under $OUT:
#   1. tests (limit VLARL_TESTS_S, 150 s): the placement and weight-sync tests over Ray (VLARL_REQUIRE_ALL=1),
#      the ManiSkill CPU-backend contract and adapter tests rendered on the GPU, the GPU env worker's bound-device
#      test, and one physx_cuda test (expected to stop at the missing GPU PhysX library, in one line);
#   2. the embedded default on CUDA (limit VLARL_TRAIN_S, 330 s): `vlarl-train device=cuda` (RLPD PushCube from
#      the carried 20 planner demonstrations, 14,336 env steps, capped at 3.5 minutes of training), ending with its
#      100-episode held-out evaluation (seeds 1,000,000+; no video: the image lacks an MP4 writer); the run
#      directory comes back as one tarball.
set -uo pipefail
DRY=()
if [ "${1:-}" = "--dry-run" ]; then DRY=(--dry-run); shift; fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY="${VLARL_PYTHON:-python3}"
TESTS_S="${VLARL_TESTS_S:-150}"
TRAIN_S="${VLARL_TRAIN_S:-330}"
DEMOS="${VLARL_E2E_DEMOS:-outputs/demos/PushCube-v1_pd_ee_delta_pos_state_n20_retimed}"
source scripts/gpu/carried_install.sh
gpu_carried_install e2e-call vlarl_e2e_wheels "$ROOT/gpu_wheels/e2e" "the next gpu_wheels/e2e batch"
if [ ! -d "$DEMOS" ]; then
  echo "[e2e-call] $DEMOS is missing: carry it (vlarl-train makes it on a CPU machine with the planner)" >&2
  exit 2
fi
VLARL_DRY_RUN="${#DRY[@]}" source scripts/gpu/env.sh
export PYTHONPATH="$ROOT:$VLARL_SITE${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
run() {  # <seconds> <log> <command...>: under timeout, output kept in $OUT/<log>
  local limit="$1" log="$2"; shift 2
  if [ "${#DRY[@]}" = 1 ]; then echo "[dry-run] timeout $limit $* > \$OUT/$log"; return 0; fi
  echo "[e2e-call] $* (limit ${limit} s)"
  timeout "$limit" "$@" >"$OUT/$log" 2>&1
  local rc=$?
  tail -4 "$OUT/$log"
  echo "[e2e-call] rc=$rc ($log)"
}
if [ "${#DRY[@]}" = 0 ]; then
  { nvidia-smi -L; nproc; "$PY" -c "import torch, ray, hydra, mani_skill, sapien
print('torch', torch.__version__, torch.cuda.get_device_name(), 'ray', ray.__version__, 'mani_skill',
      mani_skill.__version__, 'sapien', sapien.__version__)"; } >"$OUT/gpu_probe.txt" 2>&1
  cat "$OUT/gpu_probe.txt"
fi
run "$TESTS_S" tests.log env VLARL_REQUIRE_ALL=1 "$PY" -m pytest -p no:cacheprovider -o addopts= -q -rA \
  --timeout 120 --junitxml="$OUT/tests.xml" tests/scheduler/test_placement.py tests/workers/test_weight_sync.py \
  tests/simulators/test_maniskill_gpu.py -k "not physx_cuda or test_physx_cuda_batch_stays_on_gpu"
run 50 contract.log env VLARL_REQUIRE_ALL=1 "$PY" -m pytest -p no:cacheprovider -o addopts= -q -rA \
  tests/simulators/test_contract.py -k maniskill
run "$TRAIN_S" train.log "$PY" -c "from vlarl.cli import train_main; train_main()" device=cuda \
  run_dir="$OUT/run" time_limit_minutes=3.5 eval.video_episodes=0
if [ "${#DRY[@]}" = 0 ] && [ -d "$OUT/run" ]; then
  grep -h '"success' "$OUT/run/eval/eval.json" | head -3
  tar -czf "$OUT/run.tar.gz" -C "$OUT" --exclude='run/checkpoints' run && rm -rf "$OUT/run"
fi
echo "[e2e-call] done: gpu_probe.txt, tests.log, tests.xml, contract.log, train.log, run.tar.gz in \$OUT"
