"""pi0 / pi0.5 behind the env's observation schema: what the flow family's policy needs beyond the network.

    arch = build_pi0(PI0Config-or-overrides, spec, pretrained_path=None | LeRobot/openpi dir, vlm_path=None)
    inputs = arch.inputs(obs, normalized_state)   # FlowInputs for encode_prefix / velocity
    arch.model                                     # the PI0 network (FlowArchitecture)

Env cameras map to the checkpoint's ``observation.images.<name>`` by name, else in order (a ``camera_map``
processor step, ``policies.flow_vla.adapter``); checkpoint cameras the env lacks become masked blank images. A
tiny config without a checkpoint gets the project's byte-level tokenizer. pi0.5's tokens depend on the state
(it is written into the prompt), so ``tokens(tasks, state)`` needs the normalized state there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from policies.base import PolicySpec
from policies.flow_vla.adapter import FlowAdapter, check_cameras, check_config_keys, env_cameras
from policies.flow_vla.pi0 import PI0, PI0Config, make_inputs, state_prompt_tokens, tokenize
from policies.flow_vla.pi0_checkpoint import load_pi0
from policies.flow_vla.sizes import check_padding
from policies.processors import CameraMap


@dataclass
class PI0Adapter(FlowAdapter):
    """pi0 / pi0.5: ``tokens`` puts pi0.5's normalized state into the prompt."""

    make_inputs = staticmethod(make_inputs)

    def __post_init__(self) -> None:
        if self.model.pi05:  # the state-prompt token table, made on real tensors now (a fake trace cannot)
            state_prompt_tokens(self.tokenizer, self.model.cfg.tokenizer_max_length)

    def prompt_tokens(self, task: str) -> int | None:
        """pi0: the task and its newline; pi0.5: None (its prompt also holds the state's bins, so whether it fits
        depends on the state, not on the words alone)."""
        return None if self.model.pi05 else super().prompt_tokens(task)

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


def _checkpoint_cameras(kind: str, env_keys: list[str], ckpt_keys: list[str]) -> CameraMap:
    """Env camera per checkpoint camera: by name (``observation.images.<name>``), else in order; the checkpoint's
    ``empty_camera_*`` slots stay blank."""
    real = [k for k in ckpt_keys if "empty_camera_" not in k]
    cams = CameraMap.fit(real, env_keys, min_present=1, who=kind, fill_blank=False)
    empty = [k for k in ckpt_keys if "empty_camera_" in k]
    return CameraMap(cameras=cams.cameras + empty, sources=cams.sources + [""] * len(empty), fill_blank=False)


def build_pi0(
    cfg: PI0Config | dict | None, spec: PolicySpec, pretrained_path: str | Path | None = None,
    vlm_path: str | Path | None = None, tokenizer_path: str | Path | None = None,
) -> PI0Adapter:
    """A tiny/random pi0 or pi0.5 from ``cfg``, or a checkpoint whole (then a dict ``cfg`` holds config fields set
    over the checkpoint's, e.g. ``train_expert_only``). Whether the env's dims fit the network's padding is the
    policy processor's check (``pad_vector``).

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
        cams = _checkpoint_cameras(kind, list(spec.image_keys), ckpt.image_keys)
        return PI0Adapter(ckpt.model, ckpt.tokenizer, cams, ckpt)
    cfg = check_config_keys("pi0", cfg, PI0Config)
    check_cameras(cfg.type, spec, cfg.empty_cameras)
    from policies.vlm.tokenizer import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    if len(tokenizer) > cfg.resolved_dims["vocab_size"]:
        raise ValueError(f"{cfg.type}: a random-weight PaliGemma needs vocab_size >= {len(tokenizer)} (byte tokenizer)")
    return PI0Adapter(PI0(cfg), tokenizer, env_cameras(spec, cfg.empty_cameras))
