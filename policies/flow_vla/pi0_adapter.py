"""pi0 / pi0.5 behind the env's observation schema: what the flow family's policy needs beyond the network.

    arch = build_pi0(PI0Config-or-overrides, spec, pretrained_path=None | LeRobot/openpi dir, vlm_path=None)
    inputs = arch.inputs(obs, normalized_state)   # FlowInputs for encode_prefix / velocity
    arch.model                                     # the PI0 network (FlowArchitecture)

Env observations (``images: name -> uint8 [B, H, W, 3]``, ``instruction: list[str]``) become LeRobot's
camera tensors in [0, 1]; env cameras map to the checkpoint's ``observation.images.<name>`` by name,
else in order; checkpoint cameras the env lacks become masked blank images. A tiny config without a
checkpoint gets the project's byte-level tokenizer. pi0.5's tokens depend on the state (it is written
into the prompt), so ``tokens(tasks, state)`` needs the normalized state there.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from policies.base import PolicySpec
from policies.flow_vla.interface import FlowInputs
from policies.flow_vla.pi0 import PI0, PI0Config, make_inputs, tokenize
from policies.flow_vla.pi0_checkpoint import IMAGE_PREFIX, PI0Checkpoint, load_pi0
from policies.flow_vla.sizes import check_padding


@dataclass
class PI0Adapter:
    model: PI0
    tokenizer: Any
    cameras: list[str]  # env image keys, in the model's camera order
    empty_cameras: int = 0
    checkpoint: PI0Checkpoint | None = None  # normalization statistics and report when loaded

    @property
    def device(self) -> torch.device:
        return self.model.action_in_proj.weight.device

    def inputs(self, obs: dict[str, Any], state: torch.Tensor,
               tokens: tuple[torch.Tensor, torch.Tensor] | None = None) -> FlowInputs:
        """``obs`` in the env schema, ``state [B, S]`` already normalized -> model inputs (``tokens``: ids and
        mask from ``tokens()`` instead of the instruction)."""
        images = [torch.as_tensor(obs["images"][k]).to(self.device).permute(0, 3, 1, 2).float() / 255.0
                  for k in self.cameras]
        return make_inputs(self.model.cfg, self.tokenizer, images, state.to(self.device),
                           list(obs.get("instruction", [])), self.empty_cameras, tokens)

    def tokens(
        self, tasks: list[str], state: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Task strings -> (ids [B, L], mask [B, L]) as LeRobot's pre-processor makes them.

        pi0.5 writes the normalized ``state`` into the prompt: without ``state`` it returns None, and
        ``inputs(obs, state, None)`` then tokenizes with the state it is given (no fixed tokens to bake in).
        """
        if self.model.pi05 and state is None:
            return None
        state = state.to(self.device) if state is not None else None
        return tokenize(self.model.cfg, self.tokenizer, tasks, state, self.device)


def _map_cameras(kind: str, env_keys: list[str], ckpt_keys: list[str]) -> list[str]:
    """Env camera per checkpoint camera: by name (``observation.images.<name>``), else in order."""
    names = [k[len(IMAGE_PREFIX) :] if k.startswith(IMAGE_PREFIX) else k for k in ckpt_keys if "empty_camera_" not in k]
    by_name = [n for n in names if n in env_keys]
    if by_name:
        return by_name
    if not env_keys:
        raise ValueError(f"{kind}: the env has no cameras; the checkpoint needs some of {names}")
    return env_keys[: len(names)]


def build_pi0(
    cfg: PI0Config | dict | None, spec: PolicySpec, pretrained_path: str | Path | None = None,
    vlm_path: str | Path | None = None, tokenizer_path: str | Path | None = None,
) -> PI0Adapter:
    """A tiny/random pi0 or pi0.5 from ``cfg`` (env dims must fit the padding), or a checkpoint whole (then a
    dict ``cfg`` holds config fields set over the checkpoint's, e.g. ``train_expert_only``).

    A checkpoint fine-tunes on an env whose action / state dims differ from its own (a new embodiment) as
    long as they fit its padding ``max_action_dim`` / ``max_state_dim``; past the padding it is refused.
    ``vlm_path``: a local folder with the PaliGemma tokenizer (``policy.vlm_path`` on the command line;
    default: the folder the checkpoint's pre-processor names). ``tokenizer_path``: deprecated alias."""
    if pretrained_path is not None:
        ckpt = load_pi0(pretrained_path, vlm_path, overrides=cfg if isinstance(cfg, dict) else None,
                        tokenizer_path=tokenizer_path)
        kind = ckpt.config.type
        if ckpt.tokenizer is None:
            raise ValueError(f"{kind}: {pretrained_path} has no tokenizer; pass vlm_path=<local tokenizer folder> "
                             "(policy.vlm_path=... on the command line)")
        check_padding(kind, spec, ckpt.config.max_state_dim, ckpt.config.max_action_dim)
        cams = _map_cameras(kind, list(spec.image_keys), ckpt.image_keys)
        return PI0Adapter(ckpt.model, ckpt.tokenizer, cams, len(ckpt.image_keys) - len(cams), ckpt)
    if not isinstance(cfg, PI0Config):
        names = {f.name for f in fields(PI0Config)}
        unknown = sorted(set(cfg or {}) - names)
        if unknown:
            raise ValueError(f"pi0: unknown config keys {unknown}; known: {sorted(names)}")
        cfg = PI0Config(**(cfg or {}))
    if spec.state_dim > cfg.max_state_dim or spec.action_dim > cfg.max_action_dim:
        raise ValueError(f"{cfg.type}: env state/action dims {spec.state_dim}/{spec.action_dim} exceed "
                         f"max_state_dim/max_action_dim {cfg.max_state_dim}/{cfg.max_action_dim}")
    if not spec.image_keys and cfg.empty_cameras < 1:
        raise ValueError(f"{cfg.type}: the env has no cameras; set policy.arch.empty_cameras=1 (a blank, masked "
                         "camera) or use an env with an RGB camera")
    from policies.vlm.tokenizer import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    if len(tokenizer) > cfg.resolved_dims["vocab_size"]:
        raise ValueError(f"{cfg.type}: a random-weight PaliGemma needs vocab_size >= {len(tokenizer)} (byte tokenizer)")
    return PI0Adapter(PI0(cfg), tokenizer, list(spec.image_keys), cfg.empty_cameras)
