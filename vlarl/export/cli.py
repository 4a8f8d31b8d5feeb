"""``vlarl-export``: a policy checkpoint to ONNX / torch.export / a Hugging Face-layout directory, or an exact
model back to the layout it came from (LeRobot, openpi, OpenVLA-OFT).

    vlarl-export checkpoint=<dir> [output=<dir>] [formats=[onnx,torch_export,hf,lerobot,openpi,oft]] [opset=0]
                 [atol=1e-4] [instruction="..."] [vlm_path=<VLM / tokenizer folder to ship>]

Every user error is one line on stderr (exit code 2) naming the problem and the fix.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

USAGE = """usage: vlarl-export checkpoint=<policy dir> [output=<dir>] [formats=[onnx,torch_export,hf]]
                    [opset=0 (auto)] [atol=1e-4] [instruction=<text baked into the graph>]
                    [vlm_path=<VLM / tokenizer folder the lerobot, openpi or oft layout ships>]

  writes <output>/policy.onnx, policy.pt2, hf/, normalization.json and export.json (inputs, outputs,
  opset and the max |export - eager| measured at batch 1 and 8); default output: <checkpoint>/export
  formats lerobot (pi0, pi05, smolvla), openpi (pi0, pi05) and oft (openvla_oft) write <output>/<format>/:
  the model in the layout of the code it came from, loaded back and checked the same way
"""
KEYS = ("checkpoint", "output", "formats", "opset", "atol", "instruction", "vlm_path")


def _fail(msg: str) -> int:
    print(f"vlarl-export: error: {msg}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return 0 if args else 2
    import torch

    from vlarl import system_env

    system_env.apply()
    torch.set_num_threads(int(os.environ.get("VLARL_TORCH_THREADS", "1")))
    opts: dict[str, str] = {}
    for a in args:
        key, eq, value = a.partition("=")
        if not eq or key not in KEYS:
            return _fail(f"unknown argument '{a}'; use key=value with keys {list(KEYS)}")
        opts[key] = value
    if not opts.get("checkpoint"):
        return _fail("missing checkpoint=<policy directory> (e.g. <run_dir>/checkpoints/latest)")
    formats = [f.strip() for f in opts.get("formats", "onnx,torch_export,hf").strip("[]").split(",") if f.strip()]
    try:
        opset, atol = int(opts.get("opset", "0")), float(opts.get("atol", "1e-4"))
    except ValueError as e:
        return _fail(f"opset must be an integer and atol a number ({e})")
    from policies.base import CheckpointError
    from vlarl.export import ExportError, export_checkpoint

    out = Path(opts.get("output") or Path(opts["checkpoint"]) / "export")
    try:
        manifest = export_checkpoint(opts["checkpoint"], out, formats, opts.get("instruction"), atol, opset,
                                     vlm_path=opts.get("vlm_path", ""))
    except (CheckpointError, ExportError) as e:
        return _fail(str(e))
    for fmt, rep in manifest["formats"].items():
        errs = ", ".join(f"batch {b}: {e:.2e}" for b, e in rep["max_abs_err"].items())
        print(f"[vlarl-export] {fmt:12s} -> {out / rep.get('file', rep.get('dir', ''))}  max|export - eager| {errs}"
              + (f"  opset {rep['opset']}" if "opset" in rep else ""))
    print(json.dumps({"output": str(out), "formats": list(manifest["formats"])}))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
