"""A first-order, analytic estimate of the peak GPU memory of one PPO update, computed on the CPU.

This is the prediction column of ``scripts/gpu_vla_table.py`` until the memory planner of issue 38 ("One GPU,
planned on the CPU") exists; the table takes any ``module:function`` with this signature (``--predictor``), so
the planner replaces it without touching the table. The GPU run then says how far off either is.

    peak = weights + gradients + optimizer state + activations

* weights: every parameter in the model's dtype (bf16: 2 bytes), plus the LoRA adapters in LoRA mode
  (rank r on every ``nn.Linear`` named in ``LORA_TARGETS``: r x (in + out) parameters each);
* gradients: one per trainable parameter, in its dtype;
* AdamW: ``exp_avg`` and ``exp_avg_sq`` per trainable parameter, in its dtype (torch keeps them in the
  parameter's dtype: bf16 here);
* activations: the update's forward is run once on the meta device (shapes only, no memory) with batch 1,
  and every attention layer's input shape [1, s, h] is recorded (a hook on each ``q_proj``). Per layer and
  sample, 34 x s x h bytes are kept for the backward in 16-bit training (Korthikanti et al. 2022, "Reducing
  Activation Recomputation in Large Transformer Models", without the s^2 attention-score term, which fused
  attention does not store); with gradient checkpointing only each layer's input (2 x s x h bytes) is kept,
  plus one layer's 34 x s x h recomputed during the backward. Scaled linearly by the batch.

What it leaves out: allocator fragmentation and caching, the CUDA context (not counted by
``torch.cuda.max_memory_allocated`` either), temporary buffers of the optimizer step, and layers the model
runs without a ``q_proj`` (vision convolutions, MLP heads). A forward with a data-dependent check (a
``bool(tensor)``) cannot run on the meta device: its activations are then not traced and the estimate says so.
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GIB = 2**30


def lora_parameters(model: nn.Module, rank: int) -> int:
    """Parameters LoRA adapters of rank ``rank`` add on every linear layer named in ``LORA_TARGETS``."""
    return sum(rank * (m.in_features + m.out_features) for n, m in model.named_modules()
               if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in LORA_TARGETS)


def trace_layer_shapes(model: nn.Module, run: Any) -> tuple[list[tuple[int, int]] | None, str]:
    """([(s, h)] of every attention layer the update's forward runs, or None; a note). ``model`` is on the meta
    device; ``run()`` runs the update's forward at batch 1 (the table's ``ppo_step_loss``)."""
    shapes: list[tuple[int, int]] = []

    def record(_m: nn.Module, args: tuple, _out: Any) -> None:
        x = args[0]
        shapes.append((math.prod(x.shape[1:-1]) if x.dim() > 2 else 1, int(x.shape[-1])))

    hooks = [m.register_forward_hook(record) for n, m in model.named_modules() if n.endswith("q_proj")]
    try:
        run()
    except Exception as e:  # a data-dependent branch: no shapes on the meta device
        return None, f"activations not traced on the meta device ({type(e).__name__}: {str(e).splitlines()[0][:60]})"
    finally:
        for h in hooks:
            h.remove()
    if not shapes:
        return None, "activations not traced: no layer named q_proj ran"
    return shapes, f"{len(shapes)} attention layers traced"


def predict_update_peak(params: int, trainable: int, lora: int, mode: str, batch: int, grad_ckpt: bool,
                        layer_shapes: list[tuple[int, int]] | None, bytes_per_param: int = 2) -> dict[str, Any]:
    """The estimate (see the module doc) in GiB, by part. ``params``: all parameters; ``trainable``: those the
    full mode trains; ``lora``: adapter parameters (``lora_parameters``); ``mode``: ``lora`` | ``full``;
    ``layer_shapes``: ``trace_layer_shapes``' list at batch 1 (None: activations left out)."""
    if mode not in ("lora", "full"):
        raise ValueError(f"mode must be lora or full, got {mode!r}")
    train = lora if mode == "lora" else trainable
    weights = (params + (lora if mode == "lora" else 0)) * bytes_per_param
    grads = train * bytes_per_param
    adam = 2 * train * bytes_per_param
    act = None
    if layer_shapes is not None:
        per_layer = [34 * s * h * batch for s, h in layer_shapes]
        act = (sum(2 * s * h * batch for s, h in layer_shapes) + max(per_layer)) if grad_ckpt else sum(per_layer)
    parts = {"weights": weights, "grads": grads, "adamw": adam, "activations": act}
    total = sum(v for v in parts.values() if v is not None)
    return {"predicted_gib": total / GIB, "complete": act is not None,
            **{f"{k}_gib": (v / GIB if v is not None else None) for k, v in parts.items()}}


__all__ = ["LORA_TARGETS", "lora_parameters", "predict_update_peak", "trace_layer_shapes"]
