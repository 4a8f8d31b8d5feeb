"""SmolVLA behind the env's observation schema: what the flow family's policy needs beyond the network.

    arch = build_smolvla(SmolVLAConfig-or-overrides, spec, pretrained_path=None | LeRobot dir, vlm_path=None)
    inputs = arch.inputs(obs, normalized_state)   # FlowInputs for encode_prefix / velocity
    arch.model                                     # the SmolVLA network (FlowArchitecture)

Env cameras map to the checkpoint's ``observation.images.<name>`` by name, else in order (a ``camera_map``
processor step, ``policies.flow_vla.adapter``). A tiny config without a checkpoint gets the project's
byte-level tokenizer.
"""

from __future__ import annotations

from pathlib import Path

import torch

from policies.base import PolicySpec
from policies.flow_vla.adapter import FlowAdapter, check_cameras, check_config_keys, env_cameras
from policies.flow_vla.sizes import check_padding
from policies.flow_vla.smolvla import SmolVLA, SmolVLAConfig, make_inputs, tokenize
from policies.flow_vla.smolvla_checkpoint import load_smolvla
from policies.processors import CameraMap


class SmolVLAAdapter(FlowAdapter):
    make_inputs = staticmethod(make_inputs)

    def tokens(self, tasks: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Task strings -> (ids [B, L], mask [B, L]) as SmolVLA's pre-processor tokenizes them."""
        return tokenize(self.model.cfg, self.tokenizer, tasks, self.device)


def build_smolvla(
    cfg: SmolVLAConfig | dict | None, spec: PolicySpec, pretrained_path: str | Path | None = None,
    vlm_path: str | None = None,
) -> SmolVLAAdapter:
    """A tiny/random SmolVLA from ``cfg``, or a LeRobot checkpoint whole (then a dict ``cfg`` holds config fields
    set over the checkpoint's, e.g. ``train_expert_only``); a checkpoint fine-tunes on env dims that differ from
    its own within its padding (as ``build_pi0``). Whether a tiny network's padding fits the env is the policy
    processor's check (``pad_vector``)."""
    if pretrained_path is not None:
        ckpt = load_smolvla(pretrained_path, vlm_path, overrides=cfg if isinstance(cfg, dict) else None)
        check_padding("smolvla", spec, ckpt.config.max_state_dim, ckpt.config.max_action_dim)
        need = len(ckpt.image_keys) - ckpt.config.empty_cameras
        cams = CameraMap.fit(ckpt.image_keys, list(spec.image_keys), min_present=need, who="smolvla", fill_blank=False)
        return SmolVLAAdapter(ckpt.model, ckpt.tokenizer, cams, ckpt)
    cfg = check_config_keys("smolvla", cfg, SmolVLAConfig)
    check_cameras("smolvla", spec, cfg.empty_cameras)
    from policies.vlm.tokenizer import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    vocab = cfg.vlm.get("text_config", {}).get("vocab_size", 0)
    if len(tokenizer) > vocab:
        raise ValueError(f"smolvla: a random-weight SmolVLM needs vocab_size >= {len(tokenizer)} (byte tokenizer)")
    return SmolVLAAdapter(SmolVLA(cfg), tokenizer, env_cameras(spec, cfg.empty_cameras))
