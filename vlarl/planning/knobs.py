"""The memory knobs a run can turn without changing its algorithm: what is trained, dtype, recomputation.

A ``Recipe`` is one setting of the knobs that a policy family's config declares (found by field name in the
config dataclass, never probed on a live object): ``trainable`` ("full": every weight; "lora": LoRA adapters on
the VLM, the rest of the policy trained; "expert": the VLM frozen, only the action expert / heads trained),
``dtype`` of the weights and ``gradient_checkpointing``. Micro-batch (the rows of one optimizer step) is the
fourth knob and lives in the algorithm config (``algorithm.num_minibatches``), see ``fit.py``.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

TRAINABLE = ("full", "lora", "expert")  # from most to fewest trained weights
LORA_RANK = 32  # OpenVLA-OFT's published LoRA rank (and SimpleVLA-RL's)


@dataclass(frozen=True)
class Recipe:
    """One knob setting: ``trainable`` in TRAINABLE, ``dtype`` "float32" | "bfloat16", recomputation on/off."""

    trainable: str
    dtype: str
    gradient_checkpointing: bool

    def label(self) -> str:
        ckpt = "ckpt" if self.gradient_checkpointing else "no-ckpt"
        return f"{self.trainable}/{'bf16' if self.dtype == 'bfloat16' else 'fp32'}/{ckpt}"


def _fields(obj: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()


def _ckpt_owner(policy_cfg: Any) -> Any | None:
    """The config object holding ``gradient_checkpointing`` (the flow family's own, or its backbone's)."""
    if "gradient_checkpointing" in _fields(policy_cfg):
        return policy_cfg
    backbone = policy_cfg.backbone if "backbone" in _fields(policy_cfg) else None
    return backbone if "gradient_checkpointing" in _fields(backbone) else None


def configured_recipe(policy_cfg: Any) -> Recipe:
    """The recipe the policy config asks for as written."""
    names = _fields(policy_cfg)
    lora = "lora" in names and policy_cfg.lora.rank > 0
    trainable = "lora" if lora else ("expert" if "freeze_vlm" in names and policy_cfg.freeze_vlm else "full")
    owner = _ckpt_owner(policy_cfg)
    return Recipe(trainable, str(getattr(policy_cfg, "dtype", "float32")) if "dtype" in names else "float32",
                  bool(owner.gradient_checkpointing) if owner is not None else False)


def recipes_from(policy_cfg: Any) -> list[Recipe]:
    """Recipes no larger than the configured one, least intrusive first.

    Order: recomputation varies fastest (costs time only), then bf16 weights (changes numerics), then fewer
    trained weights (changes what RL can move); a knob the family does not declare keeps its configured value,
    and no recipe trains more weights than the configured one.
    """
    base, names = configured_recipe(policy_cfg), _fields(policy_cfg)
    trainables = [t for t in TRAINABLE[TRAINABLE.index(base.trainable):]
                  if t == base.trainable or (t == "lora" and "lora" in names) or (t == "expert" and "freeze_vlm" in names)]
    dtypes = [base.dtype] + (["bfloat16"] if base.dtype == "float32" and "dtype" in names else [])
    ckpts = [base.gradient_checkpointing] + ([True] if not base.gradient_checkpointing and _ckpt_owner(policy_cfg)
                                             is not None else [])
    return [Recipe(t, d, c) for t in trainables for d in dtypes for c in ckpts]


def apply_recipe(policy_cfg: Any, recipe: Recipe) -> Any:
    """A copy of ``policy_cfg`` set to ``recipe`` (``lora``: rank LORA_RANK unless one is configured)."""
    cfg, names = copy.deepcopy(policy_cfg), _fields(policy_cfg)
    if "dtype" in names:
        cfg.dtype = recipe.dtype
    owner = _ckpt_owner(cfg)
    if owner is not None:
        owner.gradient_checkpointing = recipe.gradient_checkpointing
    if "freeze_vlm" in names:
        cfg.freeze_vlm = recipe.trainable == "expert"
    if "lora" in names:
        cfg.lora.rank = (cfg.lora.rank or LORA_RANK) if recipe.trainable == "lora" else 0
    return cfg


def recipe_overrides(policy_cfg: Any, recipe: Recipe) -> list[str]:
    """The command-line overrides that select ``recipe`` (printed with the choice, so a run can be repeated)."""
    names, out = _fields(policy_cfg), []
    if "dtype" in names:
        out.append(f"policy.dtype={recipe.dtype}")
    if "gradient_checkpointing" in names:
        out.append(f"policy.gradient_checkpointing={str(recipe.gradient_checkpointing).lower()}")
    elif _ckpt_owner(policy_cfg) is not None:
        out.append(f"policy.backbone.gradient_checkpointing={str(recipe.gradient_checkpointing).lower()}")
    if "freeze_vlm" in names:
        out.append(f"policy.freeze_vlm={str(recipe.trainable == 'expert').lower()}")
    if "lora" in names:
        rank = (policy_cfg.lora.rank or LORA_RANK) if recipe.trainable == "lora" else 0
        out.append(f"policy.lora.rank={rank}")
    return out


__all__ = ["LORA_RANK", "TRAINABLE", "Recipe", "apply_recipe", "configured_recipe", "recipe_overrides",
           "recipes_from"]
