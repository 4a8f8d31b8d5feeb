"""The exact flow networks as RL policies: the base class ``ExactFlowPolicy`` and one config per network
(``policy=pi0`` / ``pi05`` / ``smolvla``; the classes that bind a network live in ``pi0_policy.py`` and
``smolvla_policy.py``, imported when their family is first built).

The network is the architecture's own (``self.net``, parameter names as in the reference checkpoint under
``net.``); this class adds what RL needs around it, with the chain and likelihoods of ``FlowChain``:

* a processor (``policies.processors``, saved as ``processor.json``): env cameras -> the network's
  (``camera_map``), uint8 -> [0, 1] (``images_to_float``), state ``[B, S]`` -> normalized (a running mean/std
  for a model built from config, the checkpoint's own statistics, fixed, for a loaded one) -> zero-padded to
  the architecture's ``max_state_dim``; model actions ``[B, T, A_pad]`` -> the first ``A`` dims -> env units
  (env bounds, or the checkpoint's action statistics); a checkpoint fine-tunes on an env with fewer dims than
  its padding (a new embodiment: then running state statistics and env bounds, since its own statistics are
  another robot's), the unused dims masked out of the SFT loss and the likelihoods;
* value head on the pooled prefix features (``value_from=hidden``), on the normalized state (``state``) or on
  the env's privileged ``obs["critic_state"]`` (``critic_state``: asymmetric actor-critic), scalar or binned (``value_bins``: logits from ``evaluate``, their expectation from ``sample`` / ``value``);
* freezing (``freeze_vlm``: train the expert only; ``freeze_vision``), LoRA on the VLM (peft), dtype and
  gradient checkpointing.

A model comes from ``size`` (``tiny`` | ``published``) with ``arch`` overrides, or whole from a published
checkpoint (``pretrained_path``). ``save_pretrained`` writes the resolved architecture config
(``backbone_config.json``), the tokenizer and ``processor_config.json`` beside the weights, so
``from_pretrained`` rebuilds it without the original checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from policies.base import Policy, PolicySpec, as_float_tensor
from policies.flow_vla.interface import FlowInputs, FlowPrefix
from policies.heads.flow import FlowChain, FlowChainConfig
from policies.inputs import check_images, check_instructions
from policies.processors import CameraMap, Normalize, PadVector, Processor, RunningNormalize
from policies.value_head import config_value_support, value_output, with_value_bins
from policies.vlm.policy_base import (
    DTYPES,
    PROCESSOR_NAME,
    VALUE_SOURCES,
    VLAPolicy,
    critic_state_of,
    critic_state_value,
    fold_critic_state,
    value_mlp,
)

ARCH_FILE = "backbone_config.json"  # the name VLA checkpoints use for their network's configs


def _repeat(x: Any, n: int) -> Any:
    """Every tensor in a nested prefix/inputs structure, each row repeated ``n`` times (dim 0)."""
    if isinstance(x, torch.Tensor):
        return x.repeat_interleave(n, 0)
    if isinstance(x, (list, tuple)):
        return type(x)(_repeat(v, n) for v in x)
    if isinstance(x, dict):
        return {k: _repeat(v, n) for k, v in x.items()}
    if dataclasses.is_dataclass(x):
        return dataclasses.replace(x, **{f.name: _repeat(getattr(x, f.name), n) for f in dataclasses.fields(x)})
    return x


def _fixed_normalizer(key: str, norm: Any, dim: int) -> Normalize:
    """A reference checkpoint's normalizer (LeRobot / openpi ``Normalizer``) as a processor step, bit-equal."""
    if norm.mode == "IDENTITY":
        return Normalize(key=key, dim=dim, mode="identity")
    shift, scale, _ = norm._shift_scale()
    return Normalize.from_shift_scale(key, norm.mode.lower(), shift.float(), scale.float())


def _normalize_buffer(key: str, name: str) -> property:
    """A read-only attribute for buffer ``name`` of the processor's ``normalize`` step of ``key``."""
    return property(lambda self: getattr(self._proc_step(Normalize, key), name))


# state-dict names of the statistics before they moved into the processor (checkpoints written then still load)
_OLD_STATS = {f"{k}_{n}": (k, n) for k in ("state", "action") for n in ("shift", "scale", "mul", "add")}


@dataclass(frozen=True)
class FlowNetwork:
    """What the RL policy needs from an exact flow network beyond its ``FlowArchitecture``:

    * ``config``: its hyperparameter dataclass (saved beside the weights, rebuilt on load);
    * ``tiny(**overrides)`` / ``published(name)``: its CPU-test and released-size configs;
    * ``build(cfg_or_overrides, spec, pretrained_path=None, vlm_path=None) -> adapter`` with ``adapter.model``
      (the network), ``.tokenizer``, ``.cameras`` (env image keys in model order), ``.empty_cameras``,
      ``.checkpoint`` (normalization statistics when loaded), ``.inputs(obs, normalized_state) -> FlowInputs``
      and ``.tokens(tasks) -> (ids, mask)`` (an exported graph bakes the instruction's tokens in);
    * ``vlm`` / ``vision``: attribute paths of the VLM (frozen by ``freeze_vlm``, LoRA's root) and of the vision
      tower (frozen by ``freeze_vision``) inside the network;
    * ``prefix_width`` / ``expert_width``: attribute paths of the prefix features' width (value head input) and
      of the expert's hidden width (Flow-Noise's noise head input).
    """

    name: str
    config: type
    tiny: Callable[..., Any]
    published: Callable[[str], Any]
    build: Callable[..., Any]
    vlm: str
    vision: str
    prefix_width: str
    expert_width: str


def submodule(root: Any, path: str) -> Any:
    """``root.a.b.c`` for ``path='a.b.c'``."""
    for part in path.split("."):
        root = getattr(root, part)
    return root


@dataclass
class ExactFlowConfig(FlowChainConfig):
    """The keys of an exact flow network's policy (the chain's, plus where the network comes from)."""

    size: str = "tiny"  # "tiny" (CPU) | "published" (the released size, random weights)
    arch: dict[str, Any] = field(default_factory=dict)  # network config fields set over the size's (not a checkpoint's)
    pretrained_path: str = ""  # a published checkpoint dir (LeRobot / openpi layout), loaded whole
    vlm_path: str = ""  # local folder with the VLM's config + tokenizer when the checkpoint does not hold them
    # env cameras the network reads, in its camera order (empty: every camera the env renders); a camera the
    # env does not render is refused when the config loads (the processor's camera_map check)
    cameras: list[str] = field(default_factory=list)
    gradient_checkpointing: bool = False  # recompute trunk/expert layers in backward


@dataclass
class PI0PolicyConfig(ExactFlowConfig):
    name: str = "pi0"


@dataclass
class PI05PolicyConfig(ExactFlowConfig):
    name: str = "pi05"


@dataclass
class SmolVLAPolicyConfig(ExactFlowConfig):
    name: str = "smolvla"


class ExactFlowPolicy(FlowChain, VLAPolicy):
    """An exact flow network (``network``, set by each registered subclass) with the RL chain around it.

    ``chunk_size`` / ``num_steps`` 0 take the network's own (a loaded checkpoint's); the policy records the
    resolved values in its own copy of the config (``self.config``), never in the caller's."""

    network: ClassVar[FlowNetwork]

    def __init__(self, config: ExactFlowConfig, spec: PolicySpec, *, restore_dir: Path | None = None):
        super().__init__(config, spec)  # the network brings its own VLM (no look-alike backbone)
        entry = self.network
        saved = json.loads((Path(restore_dir) / ARCH_FILE).read_text()) if restore_dir is not None else None
        seen = dataclasses.replace(spec, image_keys=list(config.cameras)) if config.cameras else spec
        adapter = self._build(entry, config, seen, saved, restore_dir)
        self.entry, self.adapter = entry, adapter
        self.net = adapter.model
        config = dataclasses.replace(config, chunk_size=int(self.net.chunk_size), num_steps=int(self.net.num_steps))
        self.config = config
        self._check_flow_config(config)
        A, S = spec.action_dim, spec.state_dim
        ckpt = adapter.checkpoint
        # a checkpoint on an env of other dims (a new embodiment inside its padding): its statistics describe
        # another robot, so the state gets running statistics and the actions the env's bounds
        same_body = ckpt is not None and (ckpt.state_dim, ckpt.action_dim) == (S, A)
        self.fixed_norm = bool(saved["fixed_normalization"]) if saved is not None else same_body
        if self.fixed_norm:  # the checkpoint's statistics (the saved processor's on restore)
            state_step = _fixed_normalizer("state", ckpt.state_norm, S) if ckpt else \
                Normalize(key="state", dim=S, mode="identity")
            action_step = _fixed_normalizer("action", ckpt.action_norm, A) if ckpt else \
                Normalize(key="action", dim=A, mode="min_max")
        else:  # running state statistics; actions scaled to the env's bounds, clamped to them on the way out
            state_step = RunningNormalize("state", S, 10.0)
            action_step = Normalize.from_bounds("action", spec.action_low, spec.action_high, clip_inverse=True)
        self.processor = Processor([*adapter.image_steps(), state_step,
                                    PadVector("state", S, int(self.net.max_state_dim), "policy.arch.max_state_dim"),
                                    action_step,
                                    PadVector("action", A, self.model_action_dim, "policy.arch.max_action_dim")])
        self.processor.check(spec)
        self._fitting_instructions: set[str] = set()  # instructions found to fit the prompt (check_instructions)
        self._register_load_state_dict_pre_hook(self._upgrade_old_stats)
        self.value_support = config_value_support(config)
        self.value_head = self._make_value_head(int(submodule(self.net, entry.prefix_width)))
        self._make_noise_head(int(submodule(self.net, entry.expert_width)))
        self._finish_exact()

    # -- construction -------------------------------------------------------------------------------
    @staticmethod
    def _overrides(entry: FlowNetwork, config: ExactFlowConfig) -> dict[str, Any]:
        """The network config fields the policy config sets (``arch`` + the shared switches)."""
        names = {f.name for f in dataclasses.fields(entry.config)}
        unknown = sorted(set(config.arch) - names)
        if unknown:
            raise ValueError(f"policy.arch has keys {unknown} that {entry.name} does not know; known: {sorted(names)}")
        steps = "num_steps" if "num_steps" in names else "num_inference_steps"  # pi0's name for it
        shared = {"chunk_size": config.chunk_size, steps: config.num_steps,
                  "gradient_checkpointing": config.gradient_checkpointing, "train_expert_only": config.freeze_vlm,
                  "freeze_vision_encoder": config.freeze_vision or config.freeze_vlm}
        shared = {k: v for k, v in shared.items() if k in names and not (k in ("chunk_size", steps) and v <= 0)}
        return {**dict(config.arch), **shared}

    @staticmethod
    def _build(entry: FlowNetwork, config: ExactFlowConfig, spec: PolicySpec, saved: dict | None,
               restore_dir: Path | None) -> Any:
        build, cfg_class = entry.build, entry.config
        if saved is not None:  # a vlarl checkpoint: the resolved config, the saved tokenizer and cameras
            if saved.get("architecture") != entry.name:
                raise ValueError(f"checkpoint holds a '{saved.get('architecture')}' network, not policy={entry.name}'s")
            from transformers import AutoTokenizer

            adapter = build(cfg_class(**saved["config"]), spec)
            adapter.tokenizer = AutoTokenizer.from_pretrained(str(restore_dir), local_files_only=True)
            if Processor.exists(restore_dir):  # the saved camera map (the rest of the processor loads with it)
                adapter.camera_map = Processor.load(restore_dir).find(CameraMap)
            else:  # written before the processor: the env cameras it fed, then its blank ones
                cams, empty = list(saved["cameras"]), int(saved["empty_cameras"])
                adapter.camera_map = CameraMap(cameras=cams + [f"empty_camera_{i}" for i in range(empty)],
                                               sources=cams + [""] * empty, fill_blank=False)
            return adapter
        overrides = ExactFlowPolicy._overrides(entry, config)
        if config.pretrained_path:  # the checkpoint's config, with the training switches only (not ``arch``)
            switches = {k: v for k, v in overrides.items() if k not in config.arch}
            return build(switches, spec, pretrained_path=config.pretrained_path, vlm_path=config.vlm_path or None)
        if config.size == "tiny":
            cfg = entry.tiny(**overrides)
        else:
            name = entry.name if config.size == "published" else config.size
            cfg = dataclasses.replace(entry.published(name), **overrides)
        return build(cfg, spec)

    def _make_value_head(self, prefix_width: int) -> nn.Module:
        src = self.config.value_from
        if src not in VALUE_SOURCES:
            raise ValueError(f"policy.value_from='{src}' is unknown; choose one of {VALUE_SOURCES}")
        if src == "state":
            head = value_mlp(self.spec.state_dim, 256, 2)
        elif src == "critic_state":
            head = critic_state_value(self.spec)
        else:
            head = value_mlp(prefix_width)
        return with_value_bins(head, self.value_support)

    def _finish_exact(self) -> None:
        """Freezing where the architecture has no switch of its own, LoRA on the VLM, dtype."""
        cfg, names = self.config, {f.name for f in dataclasses.fields(self.net.cfg)}
        if "train_expert_only" not in names and cfg.freeze_vlm:
            submodule(self.net, self.entry.vlm).requires_grad_(False)
        if "freeze_vision_encoder" not in names and cfg.freeze_vision:
            submodule(self.net, self.entry.vision).requires_grad_(False)
        if cfg.lora.rank > 0:
            from peft import LoraConfig, inject_adapter_in_model

            lc = LoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                            target_modules=list(cfg.lora.target_modules))
            root = submodule(self.net, self.entry.vlm)
            inject_adapter_in_model(lc, root)
            for name, p in root.named_parameters():  # LoRA trains the adapters, not the VLM under them
                p.requires_grad_("lora_" in name)
        self.net.to(DTYPES[cfg.dtype])

    @property
    def device(self) -> torch.device:
        return self._proc_step(Normalize, "action").scale.device

    @property
    def model_action_dim(self) -> int:
        return int(self.net.max_action_dim)

    # -- processor ----------------------------------------------------------------------------------
    def _proc_step(self, kind: type, key: str) -> Any:
        step = self.processor.find(kind, key)
        if step is None:
            raise RuntimeError(f"the policy's processor has no {kind.__name__} step for '{key}'")
        return step

    # the normalization's buffers (``x_norm = (x - shift) / scale * mul + add``, the processor's), read and set by
    # the exports (``lerobot_export.policy_stats``, ``openpi_export.reload``); state_* under fixed statistics only
    state_shift = _normalize_buffer("state", "shift")
    state_scale = _normalize_buffer("state", "scale")
    state_mul = _normalize_buffer("state", "mul")
    state_add = _normalize_buffer("state", "add")
    action_shift = _normalize_buffer("action", "shift")
    action_scale = _normalize_buffer("action", "scale")
    action_mul = _normalize_buffer("action", "mul")
    action_add = _normalize_buffer("action", "add")

    @property
    def state_norm(self) -> RunningNormalize | None:
        """The running state statistics (a processor step), None under a checkpoint's fixed ones."""
        return self.processor.find(RunningNormalize, "state")

    def _upgrade_old_stats(self, state: dict, prefix: str, *_: Any) -> None:
        """Checkpoints written before the processor held the statistics (``state_shift``, ``state_norm.mean``...):
        their names become the processor's (a running-statistics one also kept unused identity state buffers)."""
        steps = {(type(s), s.key): i for i, s in enumerate(self.processor) if hasattr(s, "key")}
        renames = {old: (Normalize, key, name) for old, (key, name) in _OLD_STATS.items()}
        renames.update({f"state_norm.{n}": (RunningNormalize, "state", n) for n in ("mean", "var", "count")})
        for old, (kind, key, name) in renames.items():
            if prefix + old in state:
                value = state.pop(prefix + old)
                if (kind, key) in steps:
                    state[f"{prefix}processor.steps.{steps[kind, key]}.{name}"] = value

    def _state(self, obs: dict[str, Any]) -> torch.Tensor:
        state = as_float_tensor(obs["state"], self.device)
        if state.ndim != 2 or state.shape[1] != self.spec.state_dim:
            raise ValueError(f"obs['state'] must be [B, {self.spec.state_dim}], got {tuple(state.shape)}")
        return state

    def check_instructions(self, instructions: list[str]) -> None:
        """Refuse (``ValueError``, one line) an empty instruction or one longer than the prompt the network keeps
        (``tokenizer_max_length``): its tail would be cut off silently. Asked where the env's words are known
        (config load, ``vlarl-eval``); a batch is only checked for empty words, since the reference's own runs
        cut a long prompt and the exact models reproduce them."""
        check_instructions(instructions, f"policy={self.entry.name}", self.adapter.prompt_tokens,
                           int(self.net.cfg.tokenizer_max_length), "policy.arch.tokenizer_max_length",
                           self._fitting_instructions)

    def _text(self, instructions: list[str], batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and mask [B, L] of the instructions (an export bakes them in through this hook)."""
        if len(instructions) != batch:
            instructions = [instructions[i % len(instructions)] if instructions else self.spec.instruction
                            for i in range(batch)]
        check_instructions(instructions, f"policy={self.entry.name}")  # empty words; the length: check_instructions
        return self.adapter.tokens(instructions)

    def flow_inputs(self, obs: dict[str, Any]) -> tuple[FlowInputs, torch.Tensor]:
        """Env observation -> (the architecture's inputs, normalized state [B, S]) through the processor."""
        check_images(obs.get("images") or {}, self.spec, self.adapter.camera_map.fed, f"policy={self.entry.name}",
                     check_size=False)
        images = {k: torch.as_tensor(v).to(self.device) for k, v in (obs.get("images") or {}).items()}
        batch = self.processor({"images": images, "state": self._state(obs)})
        state = batch["state"][..., : self.spec.state_dim]  # the value head reads the unpadded state
        tokens = self._text(list(obs.get("instruction", [])), state.shape[0])
        return self.adapter.network_inputs(self.adapter.fed_images(batch["images"]), batch["state"],
                                           list(obs.get("instruction", [])), tokens), state

    def normalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Env units [..., A] -> model space [..., A_pad] (zero padding)."""
        return self.processor({"action": actions})["action"]

    def unnormalize_actions(self, x: torch.Tensor) -> torch.Tensor:
        """Model space [..., A_pad] -> env units [..., A] (clamped to [-1, 1] first under env-bound scaling)."""
        return self.processor.inverse({"action": x})["action"]

    # -- FlowChain hooks ----------------------------------------------------------------------------
    def _flow_context(self, obs: dict[str, Any]):
        inputs, state = self.flow_inputs(obs)
        prefix: FlowPrefix = self.net.encode_prefix(inputs)
        src = self.config.value_from
        head_in = state if src == "state" else prefix.features
        if src == "critic_state":
            head_in = critic_state_of(obs, self.spec, self.device, state.shape[0])
        return (prefix, inputs), value_output(self.value_head(head_in.float()), self.value_support)

    def _flow_velocity(self, ctx, x: torch.Tensor, t: torch.Tensor):
        v, h = self.net.velocity(ctx[0], ctx[1], x, t, return_hidden=True)
        return v.float(), h

    def _flow_repeat(self, ctx, n: int):
        return _repeat(ctx, n)

    def update_normalization(self, obs: dict[str, Any]) -> None:
        """Rollouts fold into the running state statistics (not for a checkpoint's fixed ones, nor with
        ``freeze_state_norm``)."""
        if not self.fixed_norm and not self.config.freeze_state_norm:
            self.state_norm.update(as_float_tensor(obs["state"], self.device))
        fold_critic_state(self.value_head, obs)

    def normalization_stats(self) -> dict[str, list[float]]:
        act = self._proc_step(Normalize, "action")
        out = {f"action_{n}": getattr(act, n).tolist() for n in ("shift", "scale", "mul", "add")}
        if self.state_norm is None:
            st = self._proc_step(Normalize, "state")
            out.update({f"state_{n}": getattr(st, n).tolist() for n in ("shift", "scale", "mul", "add")})
        else:
            out.update(state_mean=self.state_norm.mean.tolist(), state_var=self.state_norm.var.tolist())
        return out

    # -- persistence --------------------------------------------------------------------------------
    def _save_base(self, directory: str | os.PathLike) -> Path:
        """``Policy.save_pretrained``'s files (tied tensors, PaliGemma's lm_head = embeddings, written as copies)."""
        return Policy.save_pretrained(self, directory)

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Base files + the resolved architecture config + tokenizer + processor config (flat files)."""
        d = self._save_base(directory)
        arch = {"architecture": self.entry.name, "config": dataclasses.asdict(self.net.cfg),
                "cameras": list(self.adapter.cameras), "empty_cameras": int(self.adapter.empty_cameras),
                "fixed_normalization": self.fixed_norm}
        (d / ARCH_FILE).write_text(json.dumps(arch, indent=2))
        self.adapter.tokenizer.save_pretrained(str(d))
        proc = {"image_keys": list(self.spec.image_keys), "cameras": list(self.adapter.cameras),
                "empty_cameras": int(self.adapter.empty_cameras), "image_size": int(self.net.cfg.image_size),
                "tokenizer": "."}
        (d / PROCESSOR_NAME).write_text(json.dumps(proc, indent=2))
        return d

