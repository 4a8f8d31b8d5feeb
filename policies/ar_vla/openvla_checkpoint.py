"""Load an OpenVLA or OpenVLA-OFT checkpoint folder whole (Hugging Face layout), nothing downloaded.

    ckpt = load_openvla("openvla-7b", unnorm_key="bridge_orig")
    ckpt = load_openvla("openvla-7b-oft-finetuned-libero-spatial", unnorm_key="libero_spatial_no_noops")
    ckpt.report.missing, ckpt.report.unused   # both empty, or loading fails in one line naming them

The folder is what ``save_pretrained`` of ``OpenVLAForActionPrediction`` writes: ``config.json``
(``"architectures": ["OpenVLAForActionPrediction"]``, the timm tower ids, image sizes, ``text_config``,
``norm_stats``), ``model.safetensors`` or shards with ``model.safetensors.index.json``, and
``dataset_statistics.json`` (preferred over the config's ``norm_stats``, as OFT's loader does). An OFT folder
adds ``action_head--<step>_checkpoint.pt`` (L1 head) and ``proprio_projector--<step>_checkpoint.pt``
(``module.`` prefixes of DDP training are stripped). A folder with an action head loads as OFT (parallel,
L1); ``variant="openvla_oft"`` without one gives OFT's discrete-token variant. What the files do not record
(OFT's chunk size and number of images: constants of its training run) comes from the arguments.

OFT+ (FiLM) folders add ``vision_backbone--<step>_checkpoint.pt``: the whole FiLM-wrapped vision backbone as OFT's
``finetune.py`` saves it (the merged shards' ``vision_backbone.*`` do not hold it), keys
``vision_backbone.<tower>.blocks.<i>.block.<...>`` plus per-block ``scale`` / ``shift``; when the run used LoRA its
LoRA'd layers (peft's "all-linear" targets every layer named like a linear one, so also the patch-embedding conv
``proj``) are ``base_layer`` + ``lora_A/B.default`` and are merged here with OFT's scaling
``min(r, 16) / r`` (its ``LoraConfig(lora_alpha=min(lora_rank, 16))``). This file replaces the shards' vision
tensors, as OFT's loader does (``_apply_film_to_vla``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from policies.ar_vla.openvla import ActionStatistics, OpenVLA, OpenVLAConfig
from policies.ar_vla.openvla_oft import OpenVLAOFT
from policies.ar_vla.prismatic_vision import pixel_values as to_pixel_values
from policies.base import CheckpointError
from policies.vlm.checkpoint_mapping import LoadReport, read_safetensors_dir

ARCHITECTURE = "OpenVLAForActionPrediction"
COMPONENTS = {"action_head": "action_head", "proprio_projector": "proprio_projector",
              "vision_backbone": "vision_backbone"}
FILM_KEY = re.compile(r"\.blocks\.\d+\.(scale|shift)\.")


@dataclass
class OpenVLACheckpoint:
    model: OpenVLA  # OpenVLAOFT for the OFT variants
    config: OpenVLAConfig
    unnorm_key: str
    stats: ActionStatistics  # actions
    proprio_stats: ActionStatistics | None
    report: LoadReport

    def pixel_values(self, images: list[torch.Tensor]) -> torch.Tensor:
        """One tensor per camera ([B, H, W, 3] uint8), third-person first -> [B, 6 * num_images, S, S]."""
        n = self.config.num_images
        if len(images) != n:
            raise ValueError(f"openvla: got {len(images)} camera image(s) but this checkpoint takes {n} "
                             f"(third-person{' + wrist' if n > 1 else ''}); pass exactly {n} or load with num_images")
        ids, size = self.config.timm_model_ids, self.config.image_sizes[0]
        return torch.cat([to_pixel_values(im, ids, size) for im in images], 1)

    def normalize_proprio(self, proprio: torch.Tensor) -> torch.Tensor:
        if self.proprio_stats is None:
            raise ValueError(f"openvla: the statistics of '{self.unnorm_key}' have no 'proprio' entry")
        return self.proprio_stats.normalize(proprio)

    @torch.no_grad()
    def predict_action(self, input_ids: torch.Tensor, pixel_values: torch.Tensor,
                       proprio: torch.Tensor | None = None) -> torch.Tensor:
        """Env-unit actions: [B, A] (OpenVLA) or [B, T, A] (OFT); ``proprio`` [B, P] in env units."""
        if isinstance(self.model, OpenVLAOFT):
            p = self.normalize_proprio(proprio) if self.model.proprio_projector is not None else None
            return self.model.predict_action(input_ids, pixel_values, self.stats, p)
        return self.model.predict_action(input_ids, pixel_values, self.stats)


def _fail(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"openvla checkpoint {path}: {what}")


def _component(path: Path, name: str) -> tuple[Path | None, dict[str, torch.Tensor]]:
    """The newest ``<name>--<step>_checkpoint.pt`` (or ``--latest_checkpoint.pt``), ``module.`` stripped."""
    files = sorted(path.glob(f"{name}--*checkpoint.pt"))
    if not files:
        return None, {}

    def step(p: Path) -> float:
        m = re.search(r"--(\d+)_checkpoint", p.name)
        return float(m.group(1)) if m else float("inf")

    f = max(files, key=step)
    state = torch.load(f, map_location="cpu", weights_only=True)
    return f, {k.removeprefix("module."): v for k, v in state.items()}


def _lora_scaling(rank: int) -> float:
    """OFT trains and deploys LoRA with ``lora_alpha=min(rank, 16)``; peft scales B @ A by alpha / rank."""
    return min(rank, 16) / rank


def _film_vision_backbone(path: Path, file: Path, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """OFT's FiLM-wrapped vision backbone state -> our ``vision_backbone.*`` names, LoRA merged (fp32).

    ``vision_backbone.featurizer.blocks.0.block.attn.qkv.base_layer.weight`` (+ ``lora_A/B.<adapter>.weight``)
    -> ``vision_backbone.featurizer.blocks.0.attn.qkv.weight``; ``...blocks.0.scale.weight`` keeps its name."""
    out: dict[str, torch.Tensor] = {}
    lora: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        if not key.startswith("vision_backbone."):
            raise _fail(path, f"{file.name} has '{key}' outside the FiLM wrapper's 'vision_backbone.'; it is not "
                              "the vision backbone that OFT's finetune.py saves with use_film")
        key = re.sub(r"(blocks\.\d+)\.block\.", r"\1.", key)
        m = re.fullmatch(r"(.+)\.lora_([AB])\.[^.]+\.weight", key)
        if m:
            lora.setdefault(m.group(1), {})[m.group(2)] = value.float()
            continue
        out[key.replace(".base_layer.", ".")] = value
    for layer, ab in lora.items():
        if set(ab) != {"A", "B"} or f"{layer}.weight" not in out:
            raise _fail(path, f"{file.name}: LoRA layer '{layer}' lacks its base_layer weight or one of lora_A/lora_B")
        # B [out, r] (a 1x1 conv [out, r, 1, 1] for peft's Conv2d LoRA) times A [r, in] or [r, in, kh, kw]
        delta = torch.einsum("or,r...->o...", ab["B"].flatten(1), ab["A"])
        out[f"{layer}.weight"] = out[f"{layer}.weight"].float() + _lora_scaling(ab["A"].shape[0]) * delta
    return out


def _statistics(path: Path, hf: dict, unnorm_key: str | None) -> tuple[str, dict]:
    f = path / "dataset_statistics.json"
    stats = json.loads(f.read_text()) if f.is_file() else hf.get("norm_stats") or {}
    where = "dataset_statistics.json" if f.is_file() else "config.json norm_stats"
    if not stats:
        raise _fail(path, "no dataset statistics (dataset_statistics.json or config.json norm_stats); "
                          "copy the training run's dataset_statistics.json into the folder")
    if unnorm_key is None:
        if len(stats) != 1:
            raise _fail(path, f"trained on {len(stats)} datasets; pass unnorm_key= one of {sorted(stats)}")
        unnorm_key = next(iter(stats))
    if unnorm_key not in stats:
        raise _fail(path, f"unnorm_key '{unnorm_key}' is not in {where}; choose one of {sorted(stats)}")
    if "action" not in stats[unnorm_key]:
        raise _fail(path, f"the statistics of '{unnorm_key}' in {where} have no 'action' entry")
    return unnorm_key, stats[unnorm_key]


def load_openvla(path: str | Path, unnorm_key: str | None = None, variant: str | None = None,
                 num_images: int | None = None, chunk_size: int = 8, normalization: str = "bounds_q99",
                 strict: bool = True, use_film: bool | None = None) -> OpenVLACheckpoint:
    """An OpenVLA / OpenVLA-OFT folder -> model (fp32, eval) with its statistics; every tensor accounted for.

    ``variant``: ``"openvla"`` (autoregressive) | ``"openvla_oft"`` (parallel); default: OFT when the folder
    has an action head. ``num_images`` default 1 (OpenVLA) / 2 (OFT: third-person + wrist). ``chunk_size``
    (OFT only) is 8 for LIBERO, 25 for ALOHA; ``normalization`` "bounds_q99" (LIBERO, OpenVLA) or "bounds".
    ``use_film`` (OFT+): default what the folder holds (FiLM tensors in ``vision_backbone--*_checkpoint.pt``);
    True or False against what it holds fails in one line."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise _fail(path, "missing config.json; point at an OpenVLA / OpenVLA-OFT folder (save_pretrained output)")
    hf = json.loads(cfg_file.read_text())
    arch = (hf.get("architectures") or [hf.get("model_type", "?")])[0]
    if arch != ARCHITECTURE or hf.get("model_type") != "openvla":
        raise _fail(path, f"is a '{arch}' checkpoint (model_type '{hf.get('model_type')}'), not OpenVLA's "
                          f"'{ARCHITECTURE}'; load it with its own policy")
    head_file, head_state = _component(path, COMPONENTS["action_head"])
    proprio_file, proprio_state = _component(path, COMPONENTS["proprio_projector"])
    vision_file, vision_state = _component(path, COMPONENTS["vision_backbone"])
    vision_state = _film_vision_backbone(path, vision_file, vision_state) if vision_file else {}
    has_film = any(FILM_KEY.search(k) for k in vision_state)
    if use_film is True and not has_film:
        raise _fail(path, "has no FiLM tensors (no vision_backbone--*_checkpoint.pt with per-block scale/shift): it "
                          "is not an OFT+ checkpoint; load it with use_film=False")
    if use_film is False and has_film:
        raise _fail(path, f"{vision_file.name} holds FiLM (OFT+) tensors (per-block scale/shift); load it with "
                          "use_film=True (or leave use_film unset: the folder decides)")
    variant = variant or ("openvla_oft" if head_file or proprio_file or has_film else "openvla")
    if variant not in ("openvla", "openvla_oft"):
        raise _fail(path, f"variant '{variant}' is unknown; choose 'openvla' or 'openvla_oft'")
    oft = variant == "openvla_oft"
    if has_film and not oft:
        raise _fail(path, f"{vision_file.name} holds FiLM (OFT+) tensors, which only OpenVLA-OFT reads; load it "
                          "with variant='openvla_oft'")
    unnorm_key, entry = _statistics(path, hf, unnorm_key)
    action_dim = len(entry["action"]["q01" if "q01" in entry["action"] else "min"])
    config = OpenVLAConfig(
        timm_model_ids=list(hf["timm_model_ids"]), image_sizes=[int(s) for s in hf["image_sizes"]],
        text_config=dict(hf["text_config"]), n_action_bins=int(hf.get("n_action_bins", 256)),
        pad_to_multiple_of=int(hf.get("pad_to_multiple_of", 64)),
        num_images=num_images or (2 if oft else 1), parallel=oft, chunk_size=chunk_size if oft else 1,
        action_dim=action_dim, action_head="l1" if oft and head_file else "tokens",
        proprio_dim=int(proprio_state["fc1.weight"].shape[1]) if oft and proprio_state else 0,
        use_film=has_film,
    )
    if (len(config.timm_model_ids) == 2) != bool(hf.get("use_fused_vision_backbone", True)):
        raise _fail(path, "use_fused_vision_backbone disagrees with the number of timm_model_ids")
    try:
        model = (OpenVLAOFT if oft else OpenVLA)(config)
    except ValueError as e:
        raise _fail(path, str(e)) from None
    try:
        weights = read_safetensors_dir(path)
    except FileNotFoundError as e:
        raise _fail(path, str(e)) from None
    if oft:
        weights.update({f"action_head.{k}": v for k, v in head_state.items()})
        weights.update({f"proprio_projector.{k}": v for k, v in proprio_state.items()})
    if vision_state:  # the FiLM run's whole vision backbone replaces the shards' (OFT's loader does the same)
        weights = {k: v for k, v in weights.items() if not k.startswith("vision_backbone.")}
        weights.update(vision_state)
    own = model.state_dict()
    report = LoadReport(missing=sorted(set(own) - set(weights)), unused=sorted(set(weights) - set(own)))
    if strict and (report.missing or report.unused):
        raise _fail(path, f"{len(report.missing)} missing keys {report.missing[:5]}, {len(report.unused)} unused "
                          f"keys {report.unused[:5]}; the folder is not this architecture (or load with strict=False)")
    bad = [k for k in set(own) & set(weights) if own[k].shape != weights[k].shape]
    if bad:
        k = sorted(bad)[0]
        raise _fail(path, f"'{k}' is {tuple(weights[k].shape)} in the checkpoint, {tuple(own[k].shape)} here "
                          f"(OFT files must agree with the statistics' action dim {action_dim} and the LLM width)")
    model.load_state_dict({k: v.float() for k, v in weights.items() if k in own}, strict=False)
    model.eval()
    eps = 1e-8 if oft else 0.0
    stats = ActionStatistics.from_entry(entry["action"], normalization, eps)
    proprio_stats = ActionStatistics.from_entry(entry["proprio"], normalization) if "proprio" in entry else None
    return OpenVLACheckpoint(model, config, unnorm_key, stats, proprio_stats, report)
