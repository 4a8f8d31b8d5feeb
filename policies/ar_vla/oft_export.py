"""Write an OpenVLA-OFT policy back in OFT's layout: the inverse of ``openvla_checkpoint.load_openvla``.

    write(policy, "out/oft")   # then OFT's deploy code: get_vla / get_action_head / get_proprio_projector

The folder is what OFT's ``finetune.py`` leaves and its ``experiments/robot/openvla_utils.py`` loads:

* ``config.json``: the Prismatic modelling config (``OpenVLAForActionPrediction``, model_type ``openvla``): the
  source folder's (``policy.config.pretrained_path``) when it still exists, else built from the network config
  with OFT's published backbone ids; ``norm_stats`` updated like ``dataset_statistics.json``;
* ``model.safetensors``: every tensor of the network except the action head and proprio projector, under the
  reference's names (vlarl's network uses them unchanged), in the policy's dtype (fp32 after RL, so the
  reference runs the same numbers);
* ``action_head--latest_checkpoint.pt`` / ``proprio_projector--latest_checkpoint.pt``: those two modules'
  state dicts with the ``module.`` prefix of OFT's DDP training (its loader strips it, as vlarl's does);
* ``dataset_statistics.json``: the source's entries, with the policy's ``unnorm_key`` entry replaced by the
  statistics the policy acts with now (action q01/q99 and mask, proprio q01/q99);
* the tokenizer and image-processor files of the source folder, copied.

A LoRA-tuned policy is merged by the caller (``vlarl.export.merge_lora``). OFT+ (FiLM) policies are refused in
one line: OFT saves their vision backbone in its FiLM wrapper's own layout, which is not written yet.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from policies.ar_vla.openvla_checkpoint import ARCHITECTURE, COMPONENTS
from policies.ar_vla.openvla_policy import OpenVLAOFTPolicy
from policies.base import CheckpointError

OWN_FILES = ("config.json", "dataset_statistics.json", "model.safetensors", "model.safetensors.index.json")
STEP = "latest"  # OFT's name for a run's last component files (``--latest_checkpoint.pt``)
# what OFT's published checkpoints name their backbones (config.json of a folder built here, without a source)
PRISMATIC_IDS = {"vision_backbone_id": "dinosiglip-vit-so-224px", "llm_backbone_id": "llama2-7b-pure",
                 "arch_specifier": "no-align+fused-gelu-mlp", "image_resize_strategy": "resize-naive",
                 "hf_llm_id": "meta-llama/Llama-2-7b-hf", "llm_max_length": 2048}


def _fail(what: str) -> CheckpointError:
    return CheckpointError(f"OFT export: {what}")


def _source(policy: Any) -> Path | None:
    src = Path(policy.config.pretrained_path) if policy.config.pretrained_path else None
    return src if src is not None and (src / "config.json").is_file() else None


def _bounds(low: torch.Tensor, high: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, list]:
    out = {"q01": low.double().tolist(), "q99": high.double().tolist()}
    if mask is not None:
        out["mask"] = mask.bool().tolist()
    return out


def statistics(policy: Any, source: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``dataset_statistics.json`` content: the source's entries with ``unnorm_key``'s replaced by the policy's."""
    key = policy.config.unnorm_key or (next(iter(source)) if len(source) == 1 else "vlarl")
    entry = dict(source.get(key, {}))
    entry["action"] = {**entry.get("action", {}), **_bounds(policy.stat_low, policy.stat_high, policy.stat_mask)}
    if policy.model.proprio_projector is not None:
        if policy.proprio_stats is None:
            raise _fail("the policy normalizes its state with running mean/std, which OFT's bounds normalization "
                        "cannot hold; fine-tune from an OFT checkpoint (its proprio statistics) to export to OFT")
        p = policy.proprio_stats
        entry["proprio"] = {**entry.get("proprio", {}), **_bounds(p.low, p.high)}
    return key, {**source, key: entry}


def write(policy: Any, out: str | Path, vlm_path: str | Path | None = None) -> dict[str, Any]:
    """Write ``policy`` (an ``OpenVLAOFTPolicy`` with the L1 head) as an OFT folder ``out``; returns a report.

    ``vlm_path``: a folder whose tokenizer / processor files to ship when the source folder is gone."""
    if not isinstance(policy, OpenVLAOFTPolicy):
        raise _fail(f"covers openvla_oft policies, not '{policy.name}'")
    cfg = policy.cfg
    if cfg.use_film:
        raise _fail("OFT+ (FiLM) vision backbones are not written yet; export without FiLM or use formats=[hf]")
    if cfg.action_head != "l1":
        raise _fail(f"OFT's deploy code loads an L1 action head; this policy has action_head='{cfg.action_head}'")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    src = _source(policy)
    hf = json.loads((src / "config.json").read_text()) if src is not None else {
        "architectures": [ARCHITECTURE], "model_type": "openvla", **PRISMATIC_IDS,
        "use_fused_vision_backbone": len(cfg.timm_model_ids) == 2, "pad_token_id": 32000}
    hf.update(timm_model_ids=list(cfg.timm_model_ids), image_sizes=list(cfg.image_sizes),
              text_config={**hf.get("text_config", {}), **cfg.text_config}, n_action_bins=cfg.n_action_bins,
              pad_to_multiple_of=cfg.pad_to_multiple_of)
    stats_file = src / "dataset_statistics.json" if src is not None else None
    source_stats = json.loads(stats_file.read_text()) if stats_file and stats_file.is_file() else \
        dict(hf.get("norm_stats") or {})
    key, stats = statistics(policy, source_stats)
    hf["norm_stats"] = stats
    folder = Path(vlm_path) if vlm_path else src
    if folder is not None:  # tokenizer, image processor, generation config
        for f in sorted(folder.iterdir()):
            if f.is_file() and f.name not in OWN_FILES and not f.name.startswith("model-") and \
                    not f.name.endswith("checkpoint.pt"):
                shutil.copy(f, out / f.name)
    elif policy.tokenizer is not None:
        policy.tokenizer.save_pretrained(str(out))
    (out / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    (out / "dataset_statistics.json").write_text(json.dumps(stats, indent=2) + "\n")

    state = {k: v.detach().contiguous().cpu() for k, v in policy.model.state_dict().items()}
    parts = {name: {k[len(prefix) + 1 :]: state.pop(k) for k in list(state) if k.startswith(prefix + ".")}
             for name, prefix in COMPONENTS.items() if name != "vision_backbone"}
    save_file(dict(sorted(state.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    for name, tensors in parts.items():
        if tensors:
            torch.save({f"module.{k}": v for k, v in sorted(tensors.items())}, out / f"{name}--{STEP}_checkpoint.pt")
    return {"type": "openvla_oft", "dir": str(out), "tensors": len(state), "unnorm_key": key,
            "components": sorted(n for n, t in parts.items() if t), "source": str(src) if src else None,
            "exact": True}


def reload(policy: Any, out: str | Path) -> Any:
    """The exported folder loaded back as the same policy class, through ``policy.pretrained_path``."""
    cfg = dataclasses.replace(policy.config, pretrained_path=str(out), arch={})
    return type(policy)(cfg, policy.spec)
