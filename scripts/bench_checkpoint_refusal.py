"""How fast, and in how much memory, is a published-size pi0 checkpoint with one wrong tensor shape refused?

    python scripts/bench_checkpoint_refusal.py [--kind pi0|pi05] [--json]

Writes a LeRobot pi0 directory at the published size (PaliGemma 3B + the Gemma 300M expert, ~3.5 B
parameters) whose ``model.safetensors`` is a real safetensors file with a *sparse* data region: the JSON
header names every tensor with its published shape, and the file is extended to its full length
(bf16: ~7 GB) with ``truncate``, which allocates no disk blocks. One tensor (layer 7's VLM
``mlp.down_proj``) is given half its columns. Then it times ``load_pi0`` on that directory and reports the
process's peak resident memory (``VmHWM``; ``psutil`` for the RSS before the call); the
checkpoint is written by a child process, so the peak is what importing vlarl and loading cost.

Before the size check ran on the meta device, this built the whole network in fp32 first (14.5 GiB, 82 s)
and only then named the mismatch.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BYTES = {"BF16": 2, "F32": 4}
WRONG = "paligemma_with_expert.paligemma.model.language_model.layers.7.mlp.down_proj.weight"


def write_sparse_safetensors(file: Path, shapes: dict[str, tuple[int, ...]], dtype: str = "BF16") -> int:
    """A valid safetensors file with these tensors whose data region is a hole (zeros, no disk blocks).

    Returns the file's apparent size in bytes (what ``ls -l`` shows; ``du`` shows a few kB)."""
    header, offset = {}, 0
    for name, shape in sorted(shapes.items()):
        n = BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data region starts 8-byte aligned
    with file.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        f.truncate(8 + len(raw) + offset)
    return 8 + len(raw) + offset


def published_shapes(kind: str) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of the published pi0 / pi0.5, from the network built on the meta device."""
    from policies.flow_vla.pi0 import PI0, published_config
    from policies.flow_vla.sizes import meta_shapes

    return meta_shapes(lambda: PI0(published_config(kind)))


def write_published_checkpoint(folder: Path, kind: str = "pi0", wrong: str | None = WRONG) -> int:
    """A LeRobot ``save_pretrained`` directory of the published size (sparse weights); ``wrong``: the tensor
    given half its last dimension. Returns the weights' apparent size in bytes."""
    from policies.flow_vla.pi0 import published_config

    folder.mkdir(parents=True, exist_ok=True)
    cfg = published_config(kind).to_dict()
    cfg.pop("dims")
    cfg["input_features"] = {"observation.state": {"type": "STATE", "shape": [8]},
                             "observation.images.base": {"type": "VISUAL", "shape": [3, 224, 224]}}
    cfg["output_features"] = {"action": {"type": "ACTION", "shape": [7]}}
    (folder / "config.json").write_text(json.dumps(cfg))
    pre = {"name": "policy_preprocessor", "steps": [
        {"registry_name": "tokenizer_processor", "config": {"tokenizer_name": "paligemma_tokenizer"}},
        {"registry_name": "normalizer_processor", "config": {"eps": 1e-8}}]}
    post = {"name": "policy_postprocessor", "steps": [{"registry_name": "unnormalizer_processor", "config": {}}]}
    (folder / "policy_preprocessor.json").write_text(json.dumps(pre))
    (folder / "policy_postprocessor.json").write_text(json.dumps(post))
    shapes = {"model." + k: v for k, v in published_shapes(kind).items()}
    if wrong is not None:
        *lead, last = shapes["model." + wrong]
        shapes["model." + wrong] = (*lead, last // 2)
    return write_sparse_safetensors(folder / "model.safetensors", shapes)


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB: ``VmHWM`` of ``/proc/self/status`` on Linux, the high-water
    mark of this program's own memory. ``getrusage``'s ``ru_maxrss`` is not that: Linux carries it over ``exec``
    from the parent, so a child of a large process (pytest late in a run: 1.95 GB) reports the parent's peak."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(kind: str) -> dict:
    import psutil
    import torch

    torch.set_num_threads(1)
    from policies.base import CheckpointError
    from policies.flow_vla.pi0_checkpoint import load_pi0

    with tempfile.TemporaryDirectory(prefix="pi0-refusal-") as tmp:
        folder = Path(tmp) / kind
        # written by a child process: the shapes come from a network built there, and what building it costs is
        # not what loading a checkpoint costs (measured below in this process only)
        subprocess.run([sys.executable, __file__, "--write", str(folder), "--kind", kind], check=True)
        size = (folder / "model.safetensors").stat().st_size
        on_disk = (folder / "model.safetensors").stat().st_blocks * 512
        rss_before = psutil.Process().memory_info().rss / 2**20
        peak_before = peak_rss_mb()
        start = time.perf_counter()
        try:
            load_pi0(folder)
            message = None
        except CheckpointError as e:
            message = str(e)
        seconds = time.perf_counter() - start
    return {"kind": kind, "weights_apparent_gb": size / 1e9, "weights_on_disk_kb": on_disk / 1024,
            "refused": message is not None, "one_line": message is not None and "\n" not in message,
            "names_the_tensor": message is not None and WRONG in message, "message": message,
            "seconds": seconds, "rss_before_mb": rss_before, "peak_rss_before_mb": peak_before,
            "peak_rss_mb": peak_rss_mb()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", default="pi0", choices=["pi0", "pi05"])
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--write", metavar="DIR", help=argparse.SUPPRESS)  # the child that writes the checkpoint
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.write:
        write_published_checkpoint(Path(args.write), args.kind)
        return 0
    t0 = time.perf_counter()
    import policies.flow_vla.pi0_checkpoint  # noqa: F401  (import time reported apart from the call)

    imports = time.perf_counter() - t0
    r = {**run(args.kind), "import_seconds": imports}
    if args.json:
        print(json.dumps(r))
    else:
        print(f"{r['kind']} published size, weights {r['weights_apparent_gb']:.2f} GB apparent / "
              f"{r['weights_on_disk_kb']:.0f} kB on disk, tensor {WRONG} at half width")
        print(f"  refused: {r['refused']} (one line: {r['one_line']}, names the tensor: {r['names_the_tensor']})")
        print(f"  message: {r['message']}")
        print(f"  load_pi0 -> refusal: {r['seconds']:.2f} s   (imports before it: {r['import_seconds']:.1f} s)")
        print(f"  peak RSS of the whole process: {r['peak_rss_mb']:.0f} MB (RSS before the call "
              f"{r['rss_before_mb']:.0f} MB)")
    return 0 if r["refused"] and r["one_line"] and r["names_the_tensor"] else 1


if __name__ == "__main__":
    sys.exit(main())
