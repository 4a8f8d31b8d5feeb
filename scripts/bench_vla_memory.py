"""Real-size VLAs with random weights: parameters, build time, time per action chunk, memory of one PPO update.

    .venv/bin/python scripts/bench_vla_memory.py                         # parameter counts (meta device, no memory)
    .venv/bin/python scripts/bench_vla_memory.py --time                  # + bf16 build and one chunk, models that fit
    .venv/bin/python scripts/bench_vla_memory.py --device cuda --time --update [--grad-ckpt] [--batch 32]
    .venv/bin/python scripts/bench_vla_memory.py --tiny --time --update  # CPU smoke: each module's tiny config

One row per model, looked up by import path + variant: the module's ``published_config(variant)`` (or
``tiny_config()`` with ``--tiny``) and the ``nn.Module`` in that module built from it (``build_model(cfg)``
where the module has one). A module that does not exist yet is skipped with the reason printed. The
look-alike RL policies (``flow_vla`` / ``ar_vla`` from the policy registry) have no published size and
run with ``--tiny`` only.

Parameters are counted on the meta device (shapes only, nothing allocated), so any size counts on a
laptop. ``--time`` builds the model in bf16 with random weights on ``--device`` and times one action
chunk (B=1; a flow model's whole Euler integration). ``--update`` times one PPO update at ``--batch``
(default 32), once with LoRA adapters (rank ``--lora-rank`` on the attention and MLP projections) and
once with full fine-tuning, AdamW, and on CUDA reports the peak GPU memory of that update. What one
update is: flow models re-score one Flow-SDE step (prefix pass + one velocity call, Gaussian log-prob of
the stored next point), the look-alike policies run their own ``evaluate``; both then take the
clipped PPO surrogate with random advantages, ``backward`` and ``optimizer.step``.
``--grad-ckpt`` turns on gradient checkpointing: through the model config's ``gradient_checkpointing`` field
where it has one (SmolVLA: trunk and expert layers), else in every Hugging Face sub-model that supports it
(the count is printed; layers a model runs in its own loop are then not checkpointed).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import inspect
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Row:
    """One model of the table: where it lives and how to drive it (``family``: flow | ar | policy)."""

    name: str
    module: str
    variant: str
    family: str
    tiny_only: bool = False


ROWS = (
    Row("pi0", "policies.flow_vla.pi0", "pi0", "flow"),
    Row("pi05", "policies.flow_vla.pi0", "pi05", "flow"),
    Row("smolvla", "policies.flow_vla.smolvla", "smolvla", "flow"),
    Row("openvla", "policies.ar_vla.openvla", "openvla", "ar"),
    Row("openvla_oft", "policies.ar_vla.openvla_oft", "openvla_oft", "ar"),
    Row("flow_vla (look-alike)", "policies.flow_vla.modeling", "flow_vla", "policy", tiny_only=True),
    Row("ar_vla (look-alike)", "policies.ar_vla.modeling", "ar_vla", "policy", tiny_only=True),
)


class Skip(Exception):
    """This row (or this column of it) cannot run here; the message says why."""


# ---- building ------------------------------------------------------------------------------------------
def _first_param_annotation(cls: type) -> str:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    if not params:
        return ""
    a = params[0].annotation
    return a if isinstance(a, str) else getattr(a, "__name__", "")


def model_builder(row: Row, tiny: bool, dtype: str = "bfloat16", grad_ckpt: bool = False) -> Callable[[], nn.Module]:
    """A zero-argument function that builds the row's model (call it under a device / dtype context; a
    look-alike policy takes ``dtype`` through its own config, which casts the backbone and keeps its heads).
    ``grad_ckpt``: a config with a ``gradient_checkpointing`` field gets it on (the builder's
    ``ckpt_by_config`` says so); otherwise ``enable_checkpointing`` is applied after the build."""
    build = _model_builder(row, tiny, dtype, grad_ckpt)
    if not hasattr(build, "ckpt_by_config"):
        build.ckpt_by_config = False
    return build


def _model_builder(row: Row, tiny: bool, dtype: str, grad_ckpt: bool) -> Callable[[], nn.Module]:
    try:
        mod = importlib.import_module(row.module)
    except ModuleNotFoundError as e:
        if e.name and row.module.startswith(e.name):
            raise Skip(f"module {row.module} does not exist yet") from None
        raise Skip(f"{row.module} needs {e.name}: {e}") from None
    if row.family == "policy":
        if not tiny:
            raise Skip("look-alike policy: no published size (run with --tiny)")
        from policies import PolicySpec, make_policy
        from policies.registry import policy_config_class

        spec = PolicySpec(state_dim=9, action_dim=7, action_low=[-1.0] * 7, action_high=[1.0] * 7,
                          image_keys=("base",), max_episode_steps=50)
        return lambda: make_policy(policy_config_class(row.variant)(dtype=dtype), spec)
    if tiny:
        if not hasattr(mod, "tiny_config"):
            raise Skip(f"{row.module} has no tiny_config()")
        fn = mod.tiny_config
        takes_variant = any(p.kind is p.POSITIONAL_OR_KEYWORD for p in inspect.signature(fn).parameters.values())
        cfg = fn(row.variant) if takes_variant else fn()
    else:
        if not hasattr(mod, "published_config"):
            raise Skip(f"{row.module} has no published_config(variant)")
        cfg = mod.published_config(row.variant)
    by_config = grad_ckpt and dataclasses.is_dataclass(cfg) and hasattr(cfg, "gradient_checkpointing")
    if by_config:
        cfg = dataclasses.replace(cfg, gradient_checkpointing=True)
    if hasattr(mod, "build_model"):
        build = lambda: mod.build_model(cfg)  # noqa: E731
        build.ckpt_by_config = by_config
        return build
    name = type(cfg).__name__
    classes = [c for c in vars(mod).values() if isinstance(c, type) and issubclass(c, nn.Module)
               and c.__module__ == mod.__name__ and _first_param_annotation(c) == name]
    if len(classes) != 1:
        raise Skip(f"{row.module}: no single nn.Module built from {name} (found {[c.__name__ for c in classes]})")
    build = lambda: classes[0](cfg)  # noqa: E731
    build.ckpt_by_config = by_config
    return build


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(all parameters, those with requires_grad); tied tensors counted once."""
    seen: dict[int, nn.Parameter] = {}
    for p in model.parameters():
        seen.setdefault(id(p), p)
    return sum(p.numel() for p in seen.values()), sum(p.numel() for p in seen.values() if p.requires_grad)


def build_on_meta(build: Callable[[], nn.Module]) -> tuple[nn.Module, float]:
    t = time.perf_counter()
    with torch.device("meta"):
        model = build()
    return model, time.perf_counter() - t


def build_real(row: Row, build: Callable[[], nn.Module], device: str, dtype: torch.dtype) -> tuple[nn.Module, float]:
    """Random weights, built straight in ``dtype`` on ``device`` (no fp32 copy first); look-alike policies
    cast themselves (their config's ``dtype``)."""
    torch.manual_seed(0)
    t = time.perf_counter()
    with torch.device(device), default_dtype(torch.float32 if row.family == "policy" else dtype):
        model = build()
    if row.family != "policy":
        model = model.to(device=device, dtype=dtype)
    _sync(device)
    return model, time.perf_counter() - t


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _hook(row: Row, name: str) -> Callable[..., Any] | None:
    """A module may drive its own model in the bench: ``bench_chunk(model, batch, device, dtype)`` (one chunk)
    and ``bench_logprob(model, batch, device, dtype) -> [batch]`` (the log-prob a PPO update differentiates);
    an autoregressive VLA needs them (its prompt and decoding are its own)."""
    if row.family == "policy":
        return None
    return getattr(importlib.import_module(row.module), name, None)


# ---- inputs --------------------------------------------------------------------------------------------
def flow_inputs(model: nn.Module, batch: int, device: str, dtype: torch.dtype, cameras: int = 1):
    """Random ``FlowInputs`` in the architecture's own sizes (image_size, tokenizer length, padded dims)."""
    from policies.flow_vla.interface import FlowInputs

    cfg = getattr(model, "cfg", None) or getattr(model, "config", None)
    size = int(getattr(cfg, "image_size", 224))
    length = int(getattr(cfg, "tokenizer_max_length", 48))
    g = torch.Generator().manual_seed(0)
    images = [(torch.rand(batch, 3, size, size, generator=g) * 2 - 1).to(device, dtype) for _ in range(cameras)]
    return FlowInputs(
        images=images,
        image_masks=[torch.ones(batch, dtype=torch.bool, device=device) for _ in range(cameras)],
        tokens=torch.randint(0, 100, (batch, length), generator=g).to(device),
        token_masks=torch.ones(batch, length, dtype=torch.bool, device=device),
        state=torch.randn(batch, model.max_state_dim, generator=g).to(device, dtype),
    )


def policy_obs(batch: int, device: str) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {"images": {"base": torch.randint(0, 256, (batch, 128, 128, 3), dtype=torch.uint8, generator=g).to(device)},
            "state": torch.randn(batch, 9, generator=g).to(device), "instruction": ["push the cube"] * batch}


# ---- measurements --------------------------------------------------------------------------------------
@torch.no_grad()
def time_chunk(row: Row, model: nn.Module, device: str, dtype: torch.dtype, batch: int = 1) -> float:
    """Seconds for one action chunk of ``batch`` samples (after one warm-up), under autocast (see ``precision``)."""
    hook = _hook(row, "bench_chunk")
    if hook is not None:  # the module's own: one action chunk
        run = lambda: hook(model, batch, device, dtype)  # noqa: E731
    elif row.family == "flow":
        inputs = flow_inputs(model, batch, device, dtype)
        noise = torch.randn(batch, model.chunk_size, model.max_action_dim, device=device, dtype=dtype)
        run = lambda: model.sample_actions(inputs, noise)  # noqa: E731
    elif row.family == "policy":
        obs = policy_obs(batch, device)
        run = lambda: model.act(obs)  # noqa: E731
    else:
        raise Skip(f"no chunk protocol for family '{row.family}': add bench_chunk() to {row.module}")
    model.eval()
    with precision(device, dtype):
        run()
        _sync(device)
        t = time.perf_counter()
        run()
        _sync(device)
    return time.perf_counter() - t


def precision(device: str, dtype: torch.dtype):
    """Autocast to ``dtype``: weights are already in it; autocast settles the places where a model keeps a
    float32 tensor on purpose (LeRobot's heads read ``.float()`` features), as mixed-precision training does."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def set_trainable(model: nn.Module, mode: str, lora_rank: int) -> nn.Module:
    """``full``: every parameter trains; ``lora``: adapters on LORA_TARGETS train, nothing else."""
    if mode == "full":
        model.requires_grad_(True)
        return model
    from peft import LoraConfig, inject_adapter_in_model

    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    targets = sorted(names & set(LORA_TARGETS))
    if not targets:
        raise Skip(f"no linear layer named {LORA_TARGETS} for LoRA")
    dtype = next(model.parameters()).dtype
    model = inject_adapter_in_model(LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, target_modules=targets), model)
    for n, p in model.named_parameters():
        p.requires_grad_("lora_" in n)
        if "lora_" in n:
            p.data = p.data.to(dtype)
    return model


def enable_checkpointing(model: nn.Module) -> int:
    """Gradient checkpointing in every HF sub-model that supports it; returns how many."""
    from transformers import PreTrainedModel

    n = 0
    for m in model.modules():
        if isinstance(m, PreTrainedModel) and m.supports_gradient_checkpointing:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            n += 1
    return n


def ppo_step_loss(row: Row, model: nn.Module, batch: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    """The clipped PPO surrogate of one minibatch, random advantages (see the module doc)."""
    from vlarl.algorithms.losses import ppo_policy_loss

    g = torch.Generator().manual_seed(1)
    adv = torch.randn(batch, generator=g).to(device)
    hook = _hook(row, "bench_logprob")
    if hook is not None:  # the module's own: log-prob [batch] of a stored action chunk, with grads
        logprob = hook(model, batch, device, dtype).float()
    elif row.family == "flow":
        inputs = flow_inputs(model, batch, device, dtype)
        shape = (batch, model.chunk_size, model.max_action_dim)
        x = torch.randn(shape, generator=g).to(device, dtype)
        x_next = torch.randn(shape, generator=g).to(device, dtype)
        t = (0.1 + 0.8 * torch.rand(batch, generator=g)).to(device, dtype)
        prefix = model.encode_prefix(inputs)
        v = model.velocity(prefix, inputs, x, t).float()
        mean = x.float() - v / model.num_steps
        # validate_args=False: no data-dependent check, so the same loss also runs on the meta device
        # (gpu_memory_estimate traces the update's layer shapes there)
        logprob = torch.distributions.Normal(mean, 0.1, validate_args=False).log_prob(x_next.float()).sum((1, 2))
    elif row.family == "policy":
        obs = policy_obs(batch, device)
        with torch.no_grad():
            s = model.sample(obs)
        logprob = model.evaluate(obs, s.replay)[0].float().flatten(1).sum(1)
    else:
        raise Skip(f"no update protocol for family '{row.family}': add bench_logprob() to {row.module}")
    loss, _ = ppo_policy_loss(logprob, logprob.detach() - 0.01, adv[:, None].squeeze(1), 0.2, 0.2)
    return loss


def time_update(row: Row, model: nn.Module, batch: int, device: str, dtype: torch.dtype) -> tuple[float, float | None]:
    """(seconds of one update: forward, backward, AdamW step; peak GiB on CUDA or None)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise Skip("nothing trainable")
    opt = torch.optim.AdamW(params, lr=1e-5)
    model.train()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    _sync(device)
    t = time.perf_counter()
    with precision(device, dtype):
        loss = ppo_step_loss(row, model, batch, device, dtype)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    _sync(device)
    seconds = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None
    del opt
    return seconds, peak


# ---- the table -----------------------------------------------------------------------------------------
def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"


def measure(row: Row, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One dict per reported line of this row (one per update mode with ``--update``)."""
    dtype = getattr(torch, args.dtype)
    out: dict[str, Any] = {"model": row.name, "variant": row.variant}
    try:
        build = model_builder(row, args.tiny, args.dtype, args.grad_ckpt)
        meta, meta_s = build_on_meta(build)
        out["params"], out["trainable"] = count_parameters(meta)
        out["meta_s"] = meta_s
        del meta
    except Skip as e:
        return [{**out, "note": f"skipped: {e}"}]
    if not (args.time or args.update):
        return [out]
    need = out["params"] * torch.finfo(dtype).bits / 8 / 2**30
    if need > args.max_gib:
        return [{**out, "note": f"not built: {need:.1f} GiB in {args.dtype} > --max-gib {args.max_gib}"}]
    lines = []
    modes = ("lora", "full") if args.update else ("",)
    for mode in modes:
        line = dict(out)
        model = None
        try:
            model, line["build_s"] = build_real(row, build, args.device, dtype)
            if args.time and not args.skip_chunk and mode in ("", "lora"):
                line["chunk_s"] = time_chunk(row, model, args.device, dtype)
            if mode:
                line["mode"] = mode
                model = set_trainable(model, mode, args.lora_rank)
                if args.grad_ckpt:
                    line["ckpt"] = ("by its config" if build.ckpt_by_config
                                    else f"{enable_checkpointing(model)} HF sub-models")
                line["update_trainable"] = count_parameters(model)[1]
                line["update_s"], line["peak_gib"] = time_update(row, model, args.batch, args.device, dtype)
        except Skip as e:
            line["note"] = f"{mode or 'time'}: {e}"
        except torch.OutOfMemoryError:
            line["note"] = f"{mode}: out of GPU memory at batch {args.batch}"
        except Exception as e:  # one model's failure is a finding of the table, not the end of it
            line["note"] = f"{mode or 'time'}: error {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        lines.append(line)
    return lines


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(lines: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"device: {device_name(args.device)}  dtype: {args.dtype}  sizes: {'tiny' if args.tiny else 'published'}"
          f"  batch (update): {args.batch}  grad-ckpt: {args.grad_ckpt}")
    head = (f"{'model':24s} {'variant':12s} {'params':>14s} {'trainable':>14s} {'meta build s':>12s} "
            f"{'bf16 build s':>12s} {'chunk s':>9s} {'update':>6s} {'upd. trainable':>14s} {'update s':>9s} "
            f"{'peak GiB':>9s}  note")
    print(head)
    print("-" * len(head))
    for d in lines:
        print(f"{d['model']:24s} {d['variant']:12s} {_fmt(d.get('params'), ',d'):>14s} "
              f"{_fmt(d.get('trainable'), ',d'):>14s} {_fmt(d.get('meta_s'), '.2f'):>12s} "
              f"{_fmt(d.get('build_s'), '.2f'):>12s} {_fmt(d.get('chunk_s'), '.4f'):>9s} "
              f"{d.get('mode', '-'):>6s} {_fmt(d.get('update_trainable'), ',d'):>14s} "
              f"{_fmt(d.get('update_s'), '.4f'):>9s} {_fmt(d.get('peak_gib'), '.2f'):>9s}  "
              + "; ".join(x for x in (d.get("note", ""), f"grad-ckpt: {d['ckpt']}" if "ckpt" in d else "") if x))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="*", default=None, help=f"subset of {[r.name.split()[0] for r in ROWS]}")
    ap.add_argument("--tiny", action="store_true", help="each module's tiny_config() (CPU smoke)")
    ap.add_argument("--time", action="store_true", help="build in bf16 and time one chunk (B=1)")
    ap.add_argument("--skip-chunk", action="store_true", help="with --time: build only (a chunk too slow for this CPU)")
    ap.add_argument("--update", action="store_true", help="time one PPO update, LoRA and full")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--grad-ckpt", action="store_true")
    ap.add_argument("--max-gib", type=float, default=None,
                    help="build only models whose weights fit (default 2.5 on CPU, 1e9 on CUDA)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    names = {r.name.split()[0]: r for r in ROWS}
    unknown = [m for m in (args.models or []) if m not in names]
    if unknown:
        print(f"bench_vla_memory: unknown --models {unknown}; choose from {sorted(names)}", file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench_vla_memory: --device cuda but no CUDA device is visible; use --device cpu", file=sys.stderr)
        return 2
    if args.batch < 1 or args.lora_rank < 1:
        print("bench_vla_memory: --batch and --lora-rank must be >= 1", file=sys.stderr)
        return 2
    if args.max_gib is None:
        args.max_gib = 1e9 if args.device.startswith("cuda") else 2.5
    torch.set_num_threads(args.threads)
    rows = [names[m] for m in args.models] if args.models else list(ROWS)
    lines = [line for row in rows for line in measure(row, args)]
    print_table(lines, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
