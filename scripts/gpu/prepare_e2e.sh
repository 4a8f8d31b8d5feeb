#!/usr/bin/env bash
# The carry for an end-to-end vlarl run on the lent GPU machine (Ray, Hydra, ManiSkill on CPU workers, the
# learner on CUDA: scripts/gpu/e2e_call.sh), cut to as few device calls as possible. Here, with the package
# registry, after
#
#   VLARL_WHEEL_DIR=gpu_wheels/full VLARL_BATCH_MIB=46 bash scripts/gpu/prepare_wheels.sh   # everything CI installs
#   python scripts/gpu_maniskill_carry.py --download --out gpu_wheels/ms --batch-mib 46    # -> gpu_wheels/ms_full
#   bash scripts/gpu/prepare_e2e.sh                                                        # -> gpu_wheels/e2e/b1..
#
# The wheels of gpu_wheels/full are joined again (sha256 checked against its MANIFEST), mani-skill and SAPIEN
# are replaced by the downloads of gpu_wheels/ms_full (with MuJoCo, which pytorch_kinematics imports), the
# linters' wheels are left out (lint runs on the CPU), and scripts/gpu_maniskill_carry.py cuts what these runs
# never open (ManiSkill's other robots and scene data, SAPIEN's headers, Ray's Java jar and dashboard UI) and
# packs batches of VLARL_BATCH_MIB (default 46: 64 MiB a call less the ~16 MiB working tree and the Vulkan
# loaders). 241 MiB in 6 calls become ~125 MiB in 3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY="${VLARL_PYTHON:-$ROOT/.venv/bin/python}"
FULL="${VLARL_FULL_DIR:-gpu_wheels/full}"
MS="${VLARL_MS_DIR:-gpu_wheels/ms_full}"
OUTDIR="${VLARL_E2E_DIR:-gpu_wheels/e2e}"
BATCH_MIB="${VLARL_BATCH_MIB:-46}"
DROP="${VLARL_E2E_DROP:-import-linter grimp}"
for d in "$FULL" "$MS"; do
  if [ ! -d "$d" ]; then
    echo "prepare_e2e.sh: $d is missing: run the two commands at the top of this script first" >&2; exit 2
  fi
done
SRC="$(mktemp -d)"
trap 'rm -rf "$SRC"' EXIT
"$PY" - "$FULL" "$MS" "$SRC" "$DROP" <<'PYEOF'
import hashlib, re, shutil, sys
from pathlib import Path
full, ms, src, drop = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), set(sys.argv[4].split())
norm = lambda wheel: re.sub(r"[-_.]+", "-", wheel.split("-")[0]).lower()  # distribution name of a wheel file
replaced = {norm(w.name) for w in ms.glob("*.whl")}
manifest = next(full.glob("b*/MANIFEST"), None)
if manifest is None:
    sys.exit(f"prepare_e2e.sh: no MANIFEST under {full}: run scripts/gpu/prepare_wheels.sh into it")
for line in manifest.read_text().splitlines():
    name, parts, sha = line.split()
    if norm(name) in replaced or norm(name) in drop:
        continue
    pieces = [next(full.glob(f"b*/{name}"))] if int(parts) == 1 else \
        [next(full.glob(f"b*/{name}.part{i:02d}")) for i in range(int(parts))]
    data = b"".join(p.read_bytes() for p in pieces)
    if hashlib.sha256(data).hexdigest() != sha:
        sys.exit(f"prepare_e2e.sh: {name} does not match its MANIFEST: run scripts/gpu/prepare_wheels.sh again")
    (src / name).write_bytes(data)
for w in ms.glob("*.whl"):
    shutil.copy2(w, src / w.name)
print(f"[e2e] {len(list(src.glob('*.whl')))} wheels ({len(replaced)} from {ms}; left out: {' '.join(sorted(drop))})")
PYEOF
"$PY" scripts/gpu_maniskill_carry.py --wheels "$SRC" --out "$OUTDIR" --batch-mib "$BATCH_MIB"
echo "[e2e] carry gpu_wheels/e2e/b1, b2, ... one per device call, back to back: bash scripts/gpu/e2e_call.sh"
