"""``policy=pi0fast``: pi0-FAST (``pi0fast.py``, LeRobot's network, parity-tested) as an RL policy with a token
categorical head.

Observation -> model (LeRobot's pre-processing): each camera ``uint8 [B, H, W, 3]`` -> ``[0, 1]`` -> resized with
padding to the checkpoint's resolution -> ``[-1, 1]`` (the checkpoint's cameras in order, the env's
``image_keys`` matched to them one by one; ``empty_camera_*`` slots blank and masked); the state -> the
checkpoint's MEAN_STD statistics -> padded -> 256 bins in the prompt ``"Task: ..., State: ...;\\n"``.

Distribution: the answer's tokens, decoded one by one (KV cache) from the softmax at ``temperature``; the tokens
up to and including the first ``"|"`` count (LeRobot ignores what follows). ``replay`` keeps the tokens and that
mask; ``evaluate`` re-scores them teacher-forced in the same layout (``PI0Fast.sample_logits``). A FAST answer has
no token per action dimension, so the chunk's log-prob (and entropy) is spread evenly over the ``[B, T, A]``
entries: their sum is the answer's log-prob, which is what ``granularity=chunk`` uses (the only granularity
that means something here). ``act`` decodes greedily. Actions: FAST-decoded, un-normalized with the checkpoint's
action statistics, the first ``chunk_size`` steps.

Sources: a LeRobot checkpoint (``pretrained_path``, loaded whole), or without one a tiny random model for the
env's spec (``pi0fast_tiny``: toy widths, offline tokenizers, a FAST tokenizer fitted here). ``save_pretrained``
writes, beside vlarl's files, ``pi0fast/`` (network config, cameras, statistics, both tokenizers: what
``from_pretrained`` rebuilds from) and, for a model that came from LeRobot, ``lerobot/``: the checkpoint in
LeRobot's own layout (its config and processors, ``model.safetensors`` from the current weights under LeRobot's
names, both tokenizers).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer

from policies.ar_vla.pi0fast import FastInputs, PI0Fast, PI0FastConfig, make_inputs, tokenize
from policies.ar_vla.pi0fast_checkpoint import PI0FastCheckpoint, load_pi0fast
from policies.ar_vla.pi0fast_config import PI0FastPolicyConfig
from policies.ar_vla.pi0fast_tiny import fit_fast, smooth_chunks, text_tokenizer, tiny_dims
from policies.ar_vla.pi0fast_tokenizer import FastActionTokenizer, Pi0FastVocabulary, detokenize
from policies.base import ActionSample, CheckpointError, Policy, PolicySpec, as_float_tensor
from policies.flow_vla.smolvla_checkpoint import Normalizer
from policies.registry import register_policy
from policies.vlm.checkpoint_mapping import LoadReport
from policies.vlm.policy_base import value_mlp

VISION = "paligemma_with_expert.paligemma.model.vision_tower"
LEROBOT_DIR = "lerobot"  # the LeRobot-layout copy inside a vlarl checkpoint
ASSETS_DIR = "pi0fast"  # network config, processor statistics and tokenizers inside a vlarl checkpoint
VALUE_SOURCES = ("hidden", "none")


@register_policy("pi0fast", PI0FastPolicyConfig)
class PI0FastPolicy(Policy):
    """pi0-FAST from a LeRobot checkpoint (loaded whole), a vlarl save, or built tiny from config; ``net`` holds
    its parameters under LeRobot's names."""

    def __init__(self, config: PI0FastPolicyConfig, spec: PolicySpec, *, restore_dir: Path | None = None):
        super().__init__(config, spec)
        if config.value_from not in VALUE_SOURCES:
            raise ValueError(f"policy.value_from='{config.value_from}' is unknown; choose one of {VALUE_SOURCES}")
        self._lerobot_source: Path | None = None  # a LeRobot-layout folder whose config/processors a save reuses
        if restore_dir is not None:
            ck = read_assets(restore_dir / ASSETS_DIR)
            if (restore_dir / LEROBOT_DIR).is_dir():
                self._lerobot_source = restore_dir / LEROBOT_DIR
        elif config.pretrained_path:
            ck = load_pi0fast(config.pretrained_path, config.vlm_path or None, config.fast_path or None)
            self._lerobot_source = Path(config.pretrained_path)
        else:
            ck = tiny_checkpoint(config, spec)
        self._check_spec(ck, spec)
        self.ckpt: PI0FastCheckpoint = ck
        self.net = ck.model
        self.horizon = ck.config.n_action_steps
        self.steps = config.max_decoding_steps or ck.config.max_decoding_steps
        self._chunk = config.chunk_size or self.horizon
        if not 1 <= self._chunk <= self.horizon:
            raise ValueError(f"policy.chunk_size={config.chunk_size} must be 0 or in 1..{self.horizon} "
                             f"(the model's n_action_steps)")
        self.value_head = value_mlp(self.net.width) if config.value_from == "hidden" else None
        if config.freeze_vision:
            self.net.pali.model.vision_tower.requires_grad_(False)
            self.net.pali.model.multi_modal_projector.requires_grad_(False)

    @staticmethod
    def _check_spec(ck: PI0FastCheckpoint, spec: PolicySpec) -> None:
        real = [k for k in ck.image_keys if ".empty_camera_" not in k]
        if len(spec.image_keys) != len(real):
            raise ValueError(f"pi0fast: the checkpoint has {len(real)} cameras {real}, the env {len(spec.image_keys)} "
                             f"{list(spec.image_keys)}; choose env cameras that match them one by one")
        if spec.state_dim != ck.state_dim or spec.action_dim != ck.action_dim:
            raise ValueError(f"pi0fast: the checkpoint's state/action dims are {ck.state_dim}/{ck.action_dim}, the env's "
                             f"{spec.state_dim}/{spec.action_dim}; use an env with the checkpoint's dims")

    @property
    def chunk_size(self) -> int:
        return self._chunk

    @property
    def device(self) -> torch.device:
        return self.net.pali.lm_head.weight.device

    # -- processor -----------------------------------------------------------------------------------------
    def inputs(self, obs: dict[str, Any]) -> FastInputs:
        """Observation -> model inputs (images, binned-state prompt tokens)."""
        state = self.ckpt.state_norm.normalize(as_float_tensor(obs["state"], self.device))
        batch = state.shape[0]
        tasks = list(obs.get("instruction", [])) or [self.spec.instruction] * batch
        if len(tasks) != batch:
            tasks = [tasks[i % len(tasks)] for i in range(batch)]
        ids, mask = tokenize(self.ckpt.config, self.ckpt.tokenizer, tasks, state)
        images = []
        for k in self.spec.image_keys:
            x = torch.as_tensor(obs["images"][k], device=self.device)
            if x.ndim != 4 or x.shape[-1] != 3:
                raise ValueError(f"obs['images']['{k}'] must be uint8 [B, H, W, 3], got {tuple(x.shape)}")
            images.append(x.permute(0, 3, 1, 2).float() / 255.0)
        empty = len(self.ckpt.image_keys) - len(images)
        return make_inputs(self.ckpt.config, images, ids, mask, empty=empty)

    def _actions(self, tokens: torch.Tensor) -> torch.Tensor:
        normalized = detokenize(tokens, self.ckpt.vocab, self.ckpt.fast, self.horizon, self.ckpt.action_dim)
        return self.ckpt.action_norm.unnormalize(normalized)[:, : self._chunk]

    def _answer_mask(self, tokens: torch.Tensor) -> torch.Tensor:
        """True up to and including the first ``"|"`` of each row (all True without one)."""
        end = (tokens == self.ckpt.vocab.end_id).long()
        after = (torch.cumsum(end, 1) - end) > 0
        return ~after

    def _score(self, inputs: FastInputs, tokens: torch.Tensor, mask: torch.Tensor):
        logits, h_bos = self.net.sample_logits(inputs, self.ckpt.vocab.bos_id, tokens)
        logp_all = torch.log_softmax(logits / self.config.temperature, -1)
        logp = logp_all.gather(-1, tokens[..., None])[..., 0] * mask
        entropy = -(logp_all.exp() * logp_all).sum(-1) * mask
        value = self.value_head(h_bos.float()).squeeze(-1) if self.value_head is not None else None
        return logp.sum(1), entropy.sum(1), value

    def _spread(self, per_chunk: torch.Tensor) -> torch.Tensor:
        """``[B]`` -> ``[B, T, A]`` whose sum over T and A is ``per_chunk``."""
        n = self._chunk * self.spec.action_dim
        return (per_chunk / n)[:, None, None].expand(-1, self._chunk, self.spec.action_dim).contiguous()

    # -- the Policy contract ---------------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, obs: dict[str, Any]) -> ActionSample:
        inputs = self.inputs(obs)
        tokens = self.net.generate(inputs, self.ckpt.vocab.bos_id, self.steps, temperature=self.config.temperature)
        mask = self._answer_mask(tokens)
        logp, _, value = self._score(inputs, tokens, mask)
        return ActionSample(self._actions(tokens), self._spread(logp), value,
                            {"tokens": tokens, "token_mask": mask})

    def evaluate(self, obs: dict[str, Any], replay: dict[str, torch.Tensor]):
        tokens, mask = replay["tokens"].to(self.device), replay["token_mask"].to(self.device)
        logp, entropy, value = self._score(self.inputs(obs), tokens, mask)
        return self._spread(logp), self._spread(entropy), value

    @torch.no_grad()
    def act(self, obs: dict[str, Any]) -> torch.Tensor:
        return self._actions(self.net.generate(self.inputs(obs), self.ckpt.vocab.bos_id, self.steps))

    @torch.no_grad()
    def value(self, obs: dict[str, Any]) -> torch.Tensor | None:
        if self.value_head is None:
            return None
        inputs = self.inputs(obs)
        bos = torch.full((inputs.tokens.shape[0], 1), self.ckpt.vocab.bos_id, device=self.device)
        return self._score(inputs, bos, torch.ones_like(bos, dtype=torch.bool))[2]

    # -- persistence -----------------------------------------------------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        d = super().save_pretrained(directory)
        write_assets(self.ckpt, d / ASSETS_DIR)
        if self._lerobot_source is not None:
            write_lerobot(self, d / LEROBOT_DIR)
        return d

    @classmethod
    def _restore(cls, config: PI0FastPolicyConfig, spec: PolicySpec, directory: Path) -> Policy:
        return cls(config, spec, restore_dir=directory)


def tiny_checkpoint(config: PI0FastPolicyConfig, spec: PolicySpec) -> PI0FastCheckpoint:
    """A tiny random pi0-FAST for ``spec`` (toy widths, 32 px, chunk 4, offline tokenizers, state as given,
    actions mapped to the env's bounds)."""
    horizon = config.chunk_size or 4
    cfg = PI0FastConfig(dims=tiny_dims(), chunk_size=horizon, n_action_steps=horizon,
                        max_state_dim=max(8, spec.state_dim), max_action_dim=max(8, spec.action_dim),
                        max_action_tokens=48, image_resolution=(32, 32), empty_cameras=0 if spec.image_keys else 1,
                        tokenizer_max_length=160, max_decoding_steps=config.max_decoding_steps or 12,
                        validate_action_token_prefix=False)
    tokenizer = text_tokenizer()
    low, high = torch.tensor(spec.action_low, dtype=torch.float32), torch.tensor(spec.action_high, dtype=torch.float32)
    return PI0FastCheckpoint(
        model=PI0Fast(cfg), config=cfg, tokenizer=tokenizer,
        fast=fit_fast(smooth_chunks(200, horizon, spec.action_dim)),
        vocab=Pi0FastVocabulary.from_tokenizer(tokenizer, cfg.fast_skip_tokens),
        image_keys=[f"observation.images.{k}" for k in spec.image_keys] or ["observation.images.empty_camera_0"],
        state_dim=spec.state_dim, action_dim=spec.action_dim, state_norm=Normalizer("IDENTITY", {}),
        action_norm=Normalizer("MIN_MAX", {"min": low, "max": high}), report=LoadReport())


def write_assets(ck: PI0FastCheckpoint, out: Path) -> Path:
    """What rebuilds the network and its processor without the source checkpoint: the network config, cameras,
    dims, normalization statistics (``arch.json``) and both tokenizers."""
    out.mkdir(parents=True, exist_ok=True)

    def norm(n: Normalizer) -> dict[str, Any]:
        return {"mode": n.mode, "eps": n.eps, "stats": {k: v.tolist() for k, v in n.stats.items()}}

    arch = {"config": ck.config.to_dict(), "image_keys": ck.image_keys, "state_dim": ck.state_dim,
            "action_dim": ck.action_dim, "state_norm": norm(ck.state_norm), "action_norm": norm(ck.action_norm)}
    (out / "arch.json").write_text(json.dumps(arch, indent=2))
    ck.tokenizer.save_pretrained(out / "tokenizer")
    ck.fast.save(out / "action_tokenizer")
    return out


def read_assets(folder: Path) -> PI0FastCheckpoint:
    """``write_assets``' folder -> the checkpoint parts, with a randomly initialized network (weights load next)."""
    if not (folder / "arch.json").is_file():
        raise CheckpointError(f"pi0fast checkpoint {folder.parent}: missing {ASSETS_DIR}/arch.json; point at a "
                              "directory written by save_pretrained")
    arch = json.loads((folder / "arch.json").read_text())
    cfg = PI0FastConfig.from_dict(arch["config"])
    tokenizer = AutoTokenizer.from_pretrained(str(folder / "tokenizer"), local_files_only=True)

    def norm(d: dict[str, Any]) -> Normalizer:
        return Normalizer(d["mode"], {k: torch.tensor(v) for k, v in d["stats"].items()}, d["eps"])

    return PI0FastCheckpoint(model=PI0Fast(cfg).eval(), config=cfg, tokenizer=tokenizer,
                             fast=FastActionTokenizer.from_folder(folder / "action_tokenizer"),
                             vocab=Pi0FastVocabulary.from_tokenizer(tokenizer, cfg.fast_skip_tokens),
                             image_keys=arch["image_keys"], state_dim=arch["state_dim"], action_dim=arch["action_dim"],
                             state_norm=norm(arch["state_norm"]), action_norm=norm(arch["action_norm"]),
                             report=LoadReport())


def write_lerobot(policy: PI0FastPolicy, out: Path) -> Path:
    """The policy's network in LeRobot's ``pi0_fast`` layout: the source checkpoint's config, processors,
    statistics and ``tiny_dims.json``, both tokenizers as ``tokenizer/`` / ``action_tokenizer/`` (the names the
    config and pre-processor are rewritten to), and ``model.safetensors`` from the current weights (``model.``
    prefix; the tied embedding saved once, as ``lm_head``)."""
    src = policy._lerobot_source  # noqa: SLF001
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "model.safetensors" and not f.name.startswith("io."):
            shutil.copy2(f, out / f.name)
    raw = json.loads((src / "config.json").read_text())
    for given, key, dest in ((policy.config.vlm_path, "text_tokenizer_name", "tokenizer"),
                             (policy.config.fast_path, "action_tokenizer_name", "action_tokenizer")):
        folder = Path(given or raw.get(key, ""))
        shutil.copytree(folder if folder.is_absolute() else src / folder, out / dest)
    raw.update(text_tokenizer_name="tokenizer", action_tokenizer_name="action_tokenizer")
    (out / "config.json").write_text(json.dumps(raw, indent=4))
    pre = json.loads((out / "policy_preprocessor.json").read_text())
    for step in pre.get("steps", []):
        cfg = step.get("config", {})
        if "tokenizer_name" in cfg:
            cfg["tokenizer_name"] = "tokenizer"
        if "action_tokenizer_name" in cfg:
            cfg["action_tokenizer_name"] = "action_tokenizer"
    (out / "policy_preprocessor.json").write_text(json.dumps(pre, indent=4))
    state = {}
    for k, v in policy.net.state_dict().items():
        if k.endswith("language_model.embed_tokens.weight"):
            continue  # tied to lm_head, which LeRobot saves
        k = k.replace(f"{VISION}.", f"{VISION}.vision_model.")  # transformers 4.5x's SigLIP nesting
        state[f"model.{k}"] = v.detach().cpu().contiguous()
    save_file(state, str(out / "model.safetensors"))
    return out

