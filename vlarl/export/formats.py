"""Export formats, registered by name: ``onnx``, ``torch_export``, ``hf`` (Hugging Face layout) and the layouts
exact models came from: ``lerobot`` (pi0, pi0.5, SmolVLA, Diffusion Policy), ``openpi`` (pi0, pi0.5) and ``oft`` (OpenVLA-OFT).

Each exporter writes into a temporary path, checks the result numerically against eager
``policy.act`` on random inputs at batch 1 and 8 (max |difference| <= ``atol``), and only then moves
it into place; it returns a report dict that goes into ``export.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from policies.capabilities import LoRAAdapted
from vlarl.export.graph import (
    ActGraph,
    ExportError,
    export_mode,
    input_specs,
    obs_from_inputs,
    output_specs,
    random_inputs,
)

VERIFY_BATCHES = (1, 8)
Exporter = Callable[..., dict[str, Any]]
FORMATS: dict[str, Exporter] = {}


def register_format(name: str) -> Callable[[Exporter], Exporter]:
    def deco(fn: Exporter) -> Exporter:
        FORMATS[name] = fn
        return fn

    return deco


def _short(e: BaseException) -> str:
    """The first line of the innermost cause (exporters wrap the real error in generic ones)."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def _fail(fmt: str, policy: Any, e: BaseException) -> ExportError:
    return ExportError(
        f"{fmt} export of policy '{policy.name}' failed ({_short(e)}); its act() must be tensor code that "
        f"can be traced: no .item()/.tolist()/numpy on tensors and no Python branches on tensor values"
    )


def verify(run: Callable[[tuple[torch.Tensor, ...]], np.ndarray | torch.Tensor], policy: Any, instruction: str,
           atol: float, fmt: str, seed: int = 0) -> dict[str, float]:
    """max |run(x) - policy.act(x)| per verification batch size; raises ExportError above ``atol``."""
    gen = torch.Generator().manual_seed(seed)
    errs = {}
    for b in VERIFY_BATCHES:
        inputs = random_inputs(policy, b, gen)
        with torch.no_grad():
            ref = policy.act(obs_from_inputs(policy, inputs, instruction)).float()
        got = torch.as_tensor(np.asarray(run(inputs)), dtype=torch.float32)
        if tuple(got.shape) != tuple(ref.shape):
            raise ExportError(f"{fmt} export of '{policy.name}' returns shape {tuple(got.shape)} at batch {b}, "
                              f"eager act() returns {tuple(ref.shape)}")
        errs[str(b)] = float((got - ref).abs().max())
        if not errs[str(b)] <= atol:
            raise ExportError(f"{fmt} export of '{policy.name}' differs from eager act() by {errs[str(b)]:.3g} "
                              f"(> atol={atol}) at batch {b}; the exported graph is not written")
    return errs


def _dynamic_shapes(policy: Any) -> tuple[Any, ...]:
    """Dimension 0 of every input is the shared dynamic batch; structure matches ``forward(state, *images)``."""
    batch = torch.export.Dim("batch", min=1, max=65536)
    images = tuple({0: batch} for _ in policy.spec.image_keys)
    return ({0: batch}, images) if images else ({0: batch},)


def _publish(tmp: Path, final: Path) -> None:
    if final.is_dir():
        shutil.rmtree(final)
    elif final.exists():
        final.unlink()
    os.replace(tmp, final)


@register_format("torch_export")
def export_torch(policy: Any, out_dir: Path, instruction: str, atol: float, **_: Any) -> dict[str, Any]:
    """``policy.pt2``: a ``torch.export`` program with a dynamic batch dimension (load with torch.export.load)."""
    graph = ActGraph(policy, instruction).eval()
    example = random_inputs(policy, 2, torch.Generator().manual_seed(1))
    t0 = time.time()
    try:
        with export_mode():
            program = torch.export.export(graph, example, dynamic_shapes=_dynamic_shapes(policy))
    except Exception as e:
        raise _fail("torch.export", policy, e) from e
    final, tmp = out_dir / "policy.pt2", out_dir / ".tmp-policy.pt2"
    torch.export.save(program, str(tmp))
    loaded = torch.export.load(str(tmp)).module()
    errs = verify(lambda x: loaded(*x).detach(), policy, instruction, atol, "torch.export")
    _publish(tmp, final)
    return {"file": final.name, "max_abs_err": errs, "export_s": time.time() - t0}


def _ort_session(path: str | bytes, threads: int = 1) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def ort_runner(session: Any) -> Callable[[tuple[torch.Tensor, ...]], np.ndarray]:
    names = [i.name for i in session.get_inputs()]
    return lambda x: session.run(None, {n: t.numpy() for n, t in zip(names, x, strict=True)})[0]


@register_format("onnx")
def export_onnx(policy: Any, out_dir: Path, instruction: str, atol: float, opset: int = 0, **_: Any) -> dict[str, Any]:
    """``policy.onnx`` with a dynamic batch, checked in ONNX Runtime. ``opset=0`` picks the exporter's
    default and steps down until ONNX Runtime accepts the model."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as e:
        raise ExportError(f"ONNX export needs onnx, onnxscript and onnxruntime ({e}); pip install -e .[export]") from e
    graph = ActGraph(policy, instruction).eval()
    example = random_inputs(policy, 2, torch.Generator().manual_seed(1))
    names = [s.name for s in input_specs(policy)]
    t0 = time.time()
    try:
        with export_mode():
            program = torch.onnx.export(
                graph, example, dynamo=True, input_names=names, output_names=["actions"],
                dynamic_shapes=_dynamic_shapes(policy), opset_version=opset or None, verbose=False,
            )
    except Exception as e:
        raise _fail("ONNX", policy, e) from e
    final, tmp = out_dir / "policy.onnx", out_dir / ".tmp-policy.onnx"
    candidates = [opset] if opset else [None, 20, 18, 17]
    last: BaseException | None = None
    for target in candidates:
        try:
            model = program.model_proto if target is None else _convert_opset(program, target)
            tmp.write_bytes(model.SerializeToString())
            session = _ort_session(str(tmp))
            break
        except Exception as e:  # ONNX Runtime too old for this opset: try an older one
            last = e
    else:
        raise ExportError(f"ONNX Runtime cannot load the exported model at opsets {candidates} ({_short(last)}); "
                          f"upgrade onnxruntime or pass opset=<n>")
    errs = verify(ort_runner(session), policy, instruction, atol, "ONNX")
    used = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    _publish(tmp, final)
    return {"file": final.name, "opset": int(used), "max_abs_err": errs, "export_s": time.time() - t0,
            "runtime": f"onnxruntime {importlib.metadata.version('onnxruntime')}"}


def _convert_opset(program: Any, target: int) -> Any:
    from onnx import version_converter

    return version_converter.convert_version(program.model_proto, target)


@runtime_checkable
class MergeableLoRALayer(Protocol):
    """peft's LoRA layer as export sees it (an external library's class, matched by shape): the wrapped
    ``base_layer``, the adapter ``lora_A`` and ``merge()``, which folds the adapter into the base weights."""

    base_layer: Any
    lora_A: Any

    def merge(self) -> None: ...


def merge_lora(policy: Any) -> int:
    """Fold every peft LoRA adapter into its base layer (W + B A * alpha / r) and drop the adapter
    modules; sets ``config.lora.rank = 0`` so the merged checkpoint rebuilds without LoRA. Returns
    how many layers were merged."""
    merged = 0
    for name, module in list(policy.named_modules()):
        if isinstance(module, MergeableLoRALayer):
            module.merge()
            parent = policy.get_submodule(name.rsplit(".", 1)[0]) if "." in name else policy
            setattr(parent, name.rsplit(".", 1)[-1], module.base_layer)
            merged += 1
    lora = policy.config.lora if isinstance(policy.config, LoRAAdapted) else None
    if merged and lora is not None and dataclasses.is_dataclass(lora):
        policy.config = dataclasses.replace(policy.config, lora=dataclasses.replace(lora, rank=0))
    return merged


@register_format("hf")
def export_hf(policy: Any, out_dir: Path, instruction: str, atol: float, checkpoint: str = "", **_: Any) -> dict:
    """``hf/``: a clean Hugging Face-layout directory (config.json with ``architectures``/``model_type``,
    model.safetensors with LoRA merged, normalization, processor/tokenizer files, README.md), reloaded
    with ``Policy.from_pretrained`` and checked against the eager policy."""
    import copy

    from policies.base import CONFIG_NAME, Policy

    t0 = time.time()
    final, tmp = out_dir / "hf", out_dir / ".hf.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    clean = copy.deepcopy(policy)
    merged = merge_lora(clean)
    clean.save_pretrained(tmp)
    meta = json.loads((tmp / CONFIG_NAME).read_text())
    meta.update(architectures=[type(policy).__name__], model_type=f"vlarl_{policy.name}",
                torch_dtype=str(next(policy.parameters()).dtype).replace("torch.", ""))
    (tmp / CONFIG_NAME).write_text(json.dumps(meta, indent=2))
    files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
    (tmp / "README.md").write_text(
        f"# vlarl {policy.name} policy\n\nExported from `{checkpoint}` by `vlarl-export`.\n\n"
        f"Load: `from policies.base import Policy; policy = Policy.from_pretrained(<this dir>)`, then "
        f"`policy.act(obs)` with obs = {{'state': float32 [B, {policy.spec.state_dim}], 'images': "
        f"{{{', '.join(repr(k) for k in policy.spec.image_keys)}}}, 'instruction': list[str]}} -> actions "
        f"[B, {policy.chunk_size}, {policy.spec.action_dim}].\n\nLoRA layers merged: {merged}. Files: "
        f"{', '.join(files)}.\n")
    reloaded = Policy.from_pretrained(tmp).eval()
    errs = verify(lambda x: reloaded.act(obs_from_inputs(reloaded, x, instruction)), policy, instruction, atol, "hf")
    _publish(tmp, final)
    return {"dir": final.name, "lora_layers_merged": merged, "max_abs_err": errs, "export_s": time.time() - t0}


# The reference layouts: each writer lives beside its family's loader (the inverse of the loader's name mapping)
# and provides ``write(policy, out_dir, vlm_path=None) -> report`` and ``reload(policy, out_dir) -> policy``
# (the export loaded back through the family's own loader, for the numerical check).
def _lerobot_writer() -> Any:
    from policies.flow_vla import lerobot_export

    return lerobot_export


def _openpi_writer() -> Any:
    from policies.flow_vla import openpi_export

    return openpi_export


def _oft_writer() -> Any:
    from policies.ar_vla import oft_export

    return oft_export


#: layout -> the module that writes it (``write(policy, dir, vlm_path)``, ``reload(policy, dir)``), imported on use
#: by plain imports the import contracts see
LAYOUT_WRITERS: dict[str, Callable[[], Any]] = {"lerobot": _lerobot_writer, "openpi": _openpi_writer,
                                                "oft": _oft_writer}


def _diffusion_policy_lerobot_writer() -> Any:
    from policies.diffusion_policy import lerobot_layout

    return lerobot_layout


#: a family whose layout writer lives in its own package: (layout, policy family) -> the writer module, on use
FAMILY_LAYOUT_WRITERS: dict[tuple[str, str], Callable[[], Any]] = {
    ("lerobot", "diffusion_policy"): _diffusion_policy_lerobot_writer}


def export_layout(layout: str, policy: Any, out_dir: Path, instruction: str, atol: float, vlm_path: str = "",
                  **_: Any) -> dict[str, Any]:
    """``<layout>/``: the policy in its reference layout (LoRA merged first), loaded back through vlarl's loader
    of that layout and checked against the eager policy at batch 1 and 8 before it is moved into place."""
    import copy

    from policies.base import CheckpointError

    writer = FAMILY_LAYOUT_WRITERS.get((layout, policy.name), LAYOUT_WRITERS[layout])()
    t0 = time.time()
    final, tmp = out_dir / layout, out_dir / f".{layout}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    clean = copy.deepcopy(policy)
    merged = merge_lora(clean)
    try:
        report = writer.write(clean, tmp, vlm_path or None)
        reloaded = writer.reload(clean, tmp).eval()
    except (CheckpointError, ValueError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ExportError(f"{layout} export of '{policy.name}': {e}") from e
    exact = report.pop("exact", True)  # False: the layout cannot hold one of the policy's transforms (said why)
    errs = verify(lambda x: reloaded.act(obs_from_inputs(reloaded, x, instruction)), policy, instruction,
                  atol if exact else float("inf"), layout)
    _publish(tmp, final)
    return {**report, "dir": final.name, "lora_layers_merged": merged, "max_abs_err": errs,
            "export_s": time.time() - t0}


for _layout in LAYOUT_WRITERS:
    register_format(_layout)(functools.partial(export_layout, _layout))


def export_policy(policy: Any, out_dir: str | Path, formats: list[str] | tuple[str, ...] = ("onnx", "torch_export", "hf"),
                  instruction: str | None = None, atol: float = 1e-4, opset: int = 0,
                  checkpoint: str = "", vlm_path: str = "") -> dict[str, Any]:
    """Export ``policy`` in ``formats`` into ``out_dir``; writes and returns the ``export.json`` manifest."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ExportError(f"unknown export format(s) {unknown}; choose from {sorted(FORMATS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    policy.eval()
    instr = policy.spec.instruction if instruction is None else instruction
    manifest: dict[str, Any] = {
        "checkpoint": checkpoint, "policy": policy.name, "instruction": instr, "atol": atol,
        "inputs": [dataclasses.asdict(s) for s in input_specs(policy)],
        "outputs": [dataclasses.asdict(s) for s in output_specs(policy)],
        "normalization": "inside the graph (state normalization, action scaling/clipping); stats in "
                         "normalization.json",
        "formats": {},
    }
    for fmt in formats:
        manifest["formats"][fmt] = FORMATS[fmt](policy, out, instr, atol, opset=opset, checkpoint=checkpoint,
                                                vlm_path=vlm_path)
    norm = policy.normalization_stats()
    (out / "normalization.json").write_text(json.dumps(norm, indent=2))
    if checkpoint:
        for extra in ("processor_config.json",):
            if (Path(checkpoint) / extra).is_file():
                shutil.copy(Path(checkpoint) / extra, out / extra)
    (out / "export.json").write_text(json.dumps(manifest, indent=2))
    return manifest
