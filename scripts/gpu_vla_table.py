"""Call 1 of the GPU plan: the real-size VLA table, measured and predicted, in one command.

    PYTHONPATH=$PWD python3 scripts/gpu_vla_table.py --out $OUT               # on the GPU (device tool `run`)
    PYTHONPATH=$PWD python3 scripts/gpu_vla_table.py --dry-run --out /tmp/t   # here: tiny configs on the CPU

For pi0, pi0.5, SmolVLA and OpenVLA-OFT at published size (random weights, bf16; ``scripts/bench_vla_memory.py``
builds and drives them): the time of one action chunk at B=1 and B=8, then one PPO update at ``--batch``
(default 32) with LoRA and with full fine-tuning, each without and with gradient checkpointing: seconds and
peak GPU memory (``torch.cuda.max_memory_allocated``). Beside every update row, the predicted peak of
``--predictor`` (default ``gpu_memory_estimate:predict_update_peak``, an analytic estimate; issue 38's memory
planner plugs in here with the same signature) and predicted / measured.

Each model runs in a child process with its own time limit (``--limits``, seconds), so a slow or hung model
cannot eat the window; the child writes a JSON line after every measurement, so what it finished before the
limit is kept. Writes ``vla_table.json`` and ``vla_table.md`` under ``--out`` and prints the markdown.

``--dry-run``: the same children, on the CPU with each module's tiny config and batch 2, with the packages
the GPU image lacks made unimportable in the children (so a dependency the device does not have fails here
first); it prints the device command and writes the same two files.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "scripts")) if p not in sys.path]

MODELS = ("pi0", "smolvla", "pi05", "openvla_oft")  # most valuable first: the issue's two memory goals
LIMITS_S = {"pi0": 90, "smolvla": 55, "pi05": 70, "openvla_oft": 85}  # 300 s in all: call 1 runs under 330 s
IMAGE_LACKS = ("ray", "hydra", "omegaconf", "mani_skill", "sapien", "gymnasium", "diffusers")
DEVICE_COMMAND = ("PYTHONPATH=$PWD python3 scripts/gpu_vla_table.py --out $OUT 2>&1 | tee $OUT/vla_table.log")


class _Lacking(importlib.abc.MetaPathFinder):
    """Makes the packages the GPU image lacks unimportable (dry runs only)."""

    def __init__(self, names: list[str]):
        self.names = set(names)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named '{fullname}' (the GPU image lacks it)", name=fullname)
        return None


def _predictor(spec: str):
    mod, _, fn = spec.partition(":")
    return getattr(importlib.import_module(mod), fn)


# ---- one model, in a child process ----------------------------------------------------------------------
def measure_model(name: str, args: argparse.Namespace, emit) -> None:
    """Every measurement of model ``name``, each handed to ``emit(dict)`` as soon as it is taken."""
    import bench_vla_memory as bench
    import gpu_memory_estimate as est

    dtype = getattr(torch, args.dtype)
    row = next(r for r in bench.ROWS if r.name == name)
    predict = _predictor(args.predictor)
    builds = {ck: bench.model_builder(row, args.tiny, args.dtype, grad_ckpt=ck) for ck in (False, True)}
    meta, _ = bench.build_on_meta(builds[False])
    params, ref_trainable = bench.count_parameters(meta)
    lora = est.lora_parameters(meta, args.lora_rank)
    shapes, trace = est.trace_layer_shapes(meta, lambda m=meta: bench.ppo_step_loss(row, m, 1, "meta", dtype))
    del meta
    emit({"model": name, "what": "size", "params": params, "trainable_as_reference": ref_trainable,
          "lora_params": lora, "trace": trace})
    model = None
    for ck in (False, True):
        for mode in ("lora", "full"):
            line: dict[str, Any] = {"model": name, "what": "update", "mode": mode, "grad_ckpt": ck,
                                    "batch": args.batch}
            try:
                pred = predict(params=params, trainable=params, lora=lora, mode=mode, batch=args.batch,
                               grad_ckpt=ck, layer_shapes=shapes)
                line.update(predicted_gib=pred["predicted_gib"], prediction_complete=pred["complete"])
                if model is None:
                    model, line["build_s"] = bench.build_real(row, builds[ck], args.device, dtype)
                if not ck and mode == "lora":  # chunk times on the first build, before adapters go in
                    for b in args.chunk_batches:
                        emit({"model": name, "what": "chunk", "batch": b,
                              "chunk_s": bench.time_chunk(row, model, args.device, dtype, batch=b)})
                model = bench.set_trainable(model, mode, args.lora_rank)
                if ck and not builds[ck].ckpt_by_config:
                    line["ckpt_note"] = f"{bench.enable_checkpointing(model)} HF sub-models"
                line["trainable"] = bench.count_parameters(model)[1]
                line["update_s"], line["peak_gib"] = bench.time_update(row, model, args.batch, args.device, dtype)
            except torch.OutOfMemoryError:
                line["note"] = f"out of GPU memory at batch {args.batch}"
            except Exception as e:  # one configuration's failure is a finding of the table
                line["note"] = f"error {type(e).__name__}: {str(e).splitlines()[0][:120]}"
            model = None  # the next configuration starts from a fresh build (adapters / checkpointing differ)
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
            emit(line)


def _child(args: argparse.Namespace) -> int:
    if args.image_lacks:
        sys.meta_path.insert(0, _Lacking(args.image_lacks))
    torch.set_num_threads(args.threads)
    with open(args.jsonl, "a") as f:
        def emit(d: dict[str, Any]) -> None:
            f.write(json.dumps(d) + "\n")
            f.flush()
            if args.stall_after_first:  # tests: a child that never finishes, whatever the machine's speed
                threading.Event().wait()

        measure_model(args.one, args, emit)
    return 0


# ---- the parent: children under time limits, then the table ------------------------------------------
def run_models(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    deadline = time.monotonic() + args.budget_s
    for name in args.models:
        left = deadline - time.monotonic()
        limit = min(args.limits.get(name, 100), left)
        if limit < 10:
            lines.append({"model": name, "what": "skipped", "note": f"no time left in --budget-s {args.budget_s}"})
            continue
        jsonl = out / f".{name}.jsonl"
        jsonl.unlink(missing_ok=True)
        cmd = [sys.executable, __file__, "--one", name, "--jsonl", str(jsonl), "--device", args.device,
               "--dtype", args.dtype, "--batch", str(args.batch), "--lora-rank", str(args.lora_rank),
               "--predictor", args.predictor, "--threads", str(args.threads),
               "--chunk-batches", *map(str, args.chunk_batches)]
        if args.tiny:
            cmd.append("--tiny")
        if args.stall_after_first:
            cmd.append("--stall-after-first")
        if args.image_lacks:
            cmd += ["--image-lacks", *args.image_lacks]
        t = time.monotonic()
        print(f"[vla-table] {name}: limit {limit:.0f} s", flush=True)
        try:
            proc = subprocess.run(cmd, timeout=limit, capture_output=True, text=True)
            status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
        except subprocess.TimeoutExpired:
            status = f"stopped at its limit of {limit:.0f} s"
        got = [json.loads(x) for x in jsonl.read_text().splitlines()] if jsonl.exists() else []
        jsonl.unlink(missing_ok=True)
        lines += got
        lines.append({"model": name, "what": "status", "status": status, "wall_s": time.monotonic() - t})
        print(f"[vla-table] {name}: {status} ({len(got)} measurements, {time.monotonic() - t:.0f} s)", flush=True)
    return lines


def _f(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def markdown(lines: list[dict[str, Any]], head: dict[str, Any]) -> str:
    """One row per (model, mode, grad-ckpt), with the model's size and chunk times on its rows."""
    b1, b2 = (list(head["chunk_batches"]) + ["-", "-"])[:2]
    out = [f"device: {head['device']}; date: {head['date']}; dtype: {head['dtype']}; sizes: {head['sizes']}; "
           f"update batch: {head['batch']}; predictor: `{head['predictor']}`", "",
           f"| model | parameters | chunk s B={b1} | chunk s B={b2} | update | trainable | grad-ckpt | update s | peak GiB | "
           "predicted GiB | predicted / peak | note |", "|" + " --- |" * 12]
    for name in dict.fromkeys(x["model"] for x in lines):
        mine = [x for x in lines if x["model"] == name]
        size = next((x for x in mine if x["what"] == "size"), {})
        chunk = {x["batch"]: x["chunk_s"] for x in mine if x["what"] == "chunk"}
        status = next((x.get("status") or x.get("note") for x in mine if x["what"] in ("status", "skipped")), "")
        ups = [x for x in mine if x["what"] == "update"] or [{}]
        bs = list(head["chunk_batches"])
        for i, u in enumerate(ups):
            first = i == 0
            ratio = (u["predicted_gib"] / u["peak_gib"]) if u.get("peak_gib") and u.get("predicted_gib") else None
            pred = _f(u.get("predicted_gib"), ".3g") + ("" if u.get("prediction_complete", True) else " (no act.)")
            note = "; ".join(x for x in (u.get("note", ""), u.get("ckpt_note", ""),
                                        status if first and status != "ok" else "",
                                        size.get("trace", "") if first else "") if x)
            out.append(f"| {name if first else ''} | {_f(size.get('params'), ',d') if first else ''} | "
                       f"{_f(chunk.get(bs[0]) if first and bs else None, '.4f')} | "
                       f"{_f(chunk.get(bs[1]) if first and len(bs) > 1 else None, '.4f')} | {u.get('mode', '-')} | "
                       f"{_f(u.get('trainable'), ',d')} | "
                       f"{'on' if u.get('grad_ckpt') else 'off'} | {_f(u.get('update_s'), '.3f')} | "
                       f"{_f(u.get('peak_gib'), '.3g')} | {pred} | {_f(ratio, '.2f')} | {note} |")
    return "\n".join(out) + "\n"


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return "CPU (dry run)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", ""), help="folder for vla_table.json/.md (default $OUT)")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--dry-run", action="store_true", help="tiny configs on the CPU, the image's gaps enforced")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--chunk-batches", type=int, nargs="*", default=[1, 8])
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--budget-s", type=float, default=sum(LIMITS_S.values()))
    ap.add_argument("--limit-s", type=float, default=None, help="one time limit for every model")
    ap.add_argument("--predictor", default="gpu_memory_estimate:predict_update_peak")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    # tests only: each child blocks after its first measurement, so a limit is reached on any machine
    ap.add_argument("--stall-after-first", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child: one model
    ap.add_argument("--jsonl", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--image-lacks", nargs="*", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        return _child(args)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        print(f"gpu_vla_table: unknown --models {unknown}; choose from {list(MODELS)}", file=sys.stderr)
        return 2
    if not args.out:
        print("gpu_vla_table: no --out folder (and $OUT is unset); pass --out DIR", file=sys.stderr)
        return 2
    if args.batch < 1 or args.lora_rank < 1 or not args.chunk_batches or min(args.chunk_batches) < 1:
        print("gpu_vla_table: --batch, --lora-rank and --chunk-batches must be >= 1", file=sys.stderr)
        return 2
    try:
        _predictor(args.predictor)
    except (ImportError, AttributeError, ValueError) as e:
        print(f"gpu_vla_table: --predictor {args.predictor} cannot be loaded ({e}); use module:function",
              file=sys.stderr)
        return 2
    if args.dry_run:
        args.device, args.tiny, args.batch, args.image_lacks = "cpu", True, min(args.batch, 2), list(IMAGE_LACKS)
        args.chunk_batches = [min(b, 2) for b in args.chunk_batches]
        print(f"[dry-run] on the device: {DEVICE_COMMAND}")
    elif args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_vla_table: no CUDA device is visible; use --dry-run on a CPU machine", file=sys.stderr)
        return 2
    args.limits = {m: args.limit_s for m in MODELS} if args.limit_s else dict(LIMITS_S)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    head = {"device": device_name(args.device), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "dtype": args.dtype, "sizes": "tiny" if args.tiny else "published", "batch": args.batch,
            "predictor": args.predictor, "chunk_batches": args.chunk_batches, "torch": torch.__version__, "command": " ".join(sys.argv)}
    lines = run_models(args, out)
    (out / "vla_table.json").write_text(json.dumps({"head": head, "lines": lines}, indent=1))
    md = markdown(lines, head)
    (out / "vla_table.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
