"""SmolVLA behind the env's observation schema: what the flow family's policy needs beyond the network.

    arch = build_smolvla(SmolVLAConfig-or-overrides, spec, pretrained_path=None | LeRobot dir, vlm_path=None)
    inputs = arch.inputs(obs, normalized_state)   # FlowInputs for encode_prefix / velocity
    arch.model                                     # the SmolVLA network (FlowArchitecture)

Env observations (``images: name -> uint8 [B, H, W, 3]``, ``instruction: list[str]``) become LeRobot's
camera tensors in [0, 1]; env cameras map to the checkpoint's ``observation.images.<name>`` by name,
else in order. A tiny config without a checkpoint gets the project's byte-level tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from policies.base import PolicySpec
from policies.flow_vla.interface import FlowInputs
from policies.flow_vla.sizes import check_padding
from policies.flow_vla.smolvla import SmolVLA, SmolVLAConfig, make_inputs, tokenize
from policies.flow_vla.smolvla_checkpoint import IMAGE_PREFIX, SmolVLACheckpoint, load_smolvla


@dataclass
class SmolVLAAdapter:
    model: SmolVLA
    tokenizer: Any
    cameras: list[str]  # env image keys, in the model's camera order
    empty_cameras: int = 0
    checkpoint: SmolVLACheckpoint | None = None  # normalization statistics and report when loaded

    def inputs(self, obs: dict[str, Any], state: torch.Tensor,
               tokens: tuple[torch.Tensor, torch.Tensor] | None = None) -> FlowInputs:
        """``obs`` in the env schema, ``state [B, S]`` already normalized -> model inputs (``tokens``:
        ids and mask from ``tokens()`` instead of the instruction)."""
        device = self.model.state_proj.weight.device
        images = [torch.as_tensor(obs["images"][k]).to(device).permute(0, 3, 1, 2).float() / 255.0
                  for k in self.cameras]
        return make_inputs(self.model.cfg, self.tokenizer, images, state.to(device), list(obs.get("instruction", [])),
                           self.empty_cameras, tokens)

    def tokens(self, tasks: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Task strings -> (ids [B, L], mask [B, L]) as SmolVLA's pre-processor tokenizes them."""
        return tokenize(self.model.cfg, self.tokenizer, tasks, self.model.state_proj.weight.device)


def _map_cameras(env_keys: list[str], ckpt_keys: list[str], empty: int) -> list[str]:
    """Env camera per checkpoint camera: by name (``observation.images.<name>``), else in order."""
    names = [k[len(IMAGE_PREFIX) :] if k.startswith(IMAGE_PREFIX) else k for k in ckpt_keys]
    need = len(names) - empty
    by_name = [n for n in names if n in env_keys]
    if by_name and len(by_name) >= need:
        return by_name
    if len(env_keys) < need:
        raise ValueError(f"smolvla: the env has cameras {env_keys}; the checkpoint needs {need} of {names}")
    return env_keys[: len(names)]


def build_smolvla(
    cfg: SmolVLAConfig | dict | None, spec: PolicySpec, pretrained_path: str | Path | None = None,
    vlm_path: str | None = None,
) -> SmolVLAAdapter:
    """A tiny/random SmolVLA from ``cfg`` (env dims must fit the padding), or a LeRobot checkpoint whole
    (then a dict ``cfg`` holds config fields set over the checkpoint's, e.g. ``train_expert_only``); a
    checkpoint fine-tunes on env dims that differ from its own within its padding (as ``build_pi0``)."""
    if pretrained_path is not None:
        ckpt = load_smolvla(pretrained_path, vlm_path, overrides=cfg if isinstance(cfg, dict) else None)
        check_padding("smolvla", spec, ckpt.config.max_state_dim, ckpt.config.max_action_dim)
        cams = _map_cameras(list(spec.image_keys), ckpt.image_keys, ckpt.config.empty_cameras)
        empty = len(ckpt.image_keys) - len(cams)
        return SmolVLAAdapter(ckpt.model, ckpt.tokenizer, cams, empty, ckpt)
    if not isinstance(cfg, SmolVLAConfig):
        names = {f.name for f in fields(SmolVLAConfig)}
        unknown = sorted(set(cfg or {}) - names)
        if unknown:
            raise ValueError(f"smolvla: unknown config keys {unknown}; known: {sorted(names)}")
        cfg = SmolVLAConfig(**(cfg or {}))
    if spec.state_dim > cfg.max_state_dim or spec.action_dim > cfg.max_action_dim:
        raise ValueError(f"smolvla: env state/action dims {spec.state_dim}/{spec.action_dim} exceed "
                         f"max_state_dim/max_action_dim {cfg.max_state_dim}/{cfg.max_action_dim}")
    if not spec.image_keys and cfg.empty_cameras < 1:
        raise ValueError("smolvla: the env has no cameras; set policy.arch.empty_cameras=1 (a blank, masked camera) "
                         "or use an env with an RGB camera")
    from policies.vlm.tokenizer import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    vocab = cfg.vlm.get("text_config", {}).get("vocab_size", 0)
    if len(tokenizer) > vocab:
        raise ValueError(f"smolvla: a random-weight SmolVLM needs vocab_size >= {len(tokenizer)} (byte tokenizer)")
    return SmolVLAAdapter(SmolVLA(cfg), tokenizer, list(spec.image_keys), cfg.empty_cameras)
