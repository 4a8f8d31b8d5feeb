#!/usr/bin/env bash
# Calls 2 and 3 of the GPU plan (docs/gpu.md), from the repository root on the lent GPU machine:
#
#   bash scripts/gpu/maniskill_call.sh            # install the carried batch; once every wheel is in, run
#   bash scripts/gpu/maniskill_call.sh --dry-run  # any machine: the install for real into temp folders, the
#                                                 # runs printed (each with its time limit), nothing on a GPU
#
# Call 2 carries gpu_wheels/ms/b1 (SAPIEN, the cut mani-skill, MuJoCo: scripts/gpu_maniskill_carry.py); it is
# stashed and installed, and the script stops with exit 3 ("carry the next batch"). Call 3, right after (the
# stash lives while the machine is warm), carries gpu_wheels/ms/b2 and gpu_wheels/ppo (ManiSkill's ppo.py);
# with every wheel installed it runs, each under `timeout`:
#   1. scripts/bench_maniskill_gpu.py: vlarl's env vs ManiSkillVectorEnv, state PushCube at 1024 and 4096 envs
#      and RGB PushCube at 256 envs, 100 steps after 20 of warm-up (-> $OUT/maniskill_gpu.txt), limit 120 s;
#   2. scripts/gpu_ppo_race.py: PushCube wall time to 90% held-out, ManiSkill's ppo.py (and vlarl-train where
#      Ray and Hydra are importable; in this window they are not) (-> $OUT/ppo_race.md/.json, race logs),
#      limit 110 s per trainer (the race's own), 140 s in all.
set -uo pipefail
DRY=()
if [ "${1:-}" = "--dry-run" ]; then DRY=(--dry-run); shift; fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY="${VLARL_PYTHON:-python3}"
BENCH_S="${VLARL_BENCH_S:-120}"
RACE_S="${VLARL_RACE_S:-110}"
source scripts/gpu/carried_install.sh
gpu_carried_install maniskill-call vlarl_ms_wheels "$ROOT/gpu_wheels/ms" "the other gpu_wheels/ms batch"
VLARL_DRY_RUN="${#DRY[@]}" source scripts/gpu/env.sh
export PYTHONPATH="$ROOT:$VLARL_SITE${PYTHONPATH:+:$PYTHONPATH}"
run() {  # <seconds> <log> <command...>: under timeout, output kept in $OUT/<log>
  local limit="$1" log="$2"; shift 2
  if [ "${#DRY[@]}" = 1 ]; then echo "[dry-run] timeout $limit $* > \$OUT/$log"; return 0; fi
  echo "[maniskill-call] $* (limit ${limit} s)"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$log"
}
[ "${#DRY[@]}" = 1 ] || nvidia-smi -L | tee "$OUT/gpu_probe.txt"
run "$BENCH_S" maniskill_gpu.txt "$PY" scripts/bench_maniskill_gpu.py --steps 100 --rounds 1 \
  --configs pushcube_state_1024 pushcube_state_4096 pushcube_rgb128_256
run "$((RACE_S + 30))" ppo_race.txt "$PY" scripts/gpu_ppo_race.py --out "$OUT" --limit-s "$RACE_S" \
  --maniskill-ppo gpu_wheels/ppo/ppo.py "${DRY[@]}"
