"""``policy=openvla`` / ``policy=openvla_oft``: the exact networks (``openvla.py``, ``openvla_oft.py``) as RL
policies.

Observation -> model (OpenVLA's own transforms): each camera [B, H, W, 3] uint8 -> both towers' normalization
at the architecture's image size, cameras stacked along channels (third-person first); the instruction ->
``"In: What action should the robot take to {task}?\\nOut:"`` tokens + 29871 (prompts of different lengths
are padded right after <s>, the pads masked as keys and skipped by the position ids, so a row acts alone as in any
batch); the state (OFT) -> [-1, 1] with the checkpoint's proprio statistics, else running mean / std, -> the
proprio token.

Distributions (sampling and ``evaluate`` apply the same rule, so a sample re-scores to its own log-prob):

* ``action_head=tokens``: a categorical over the 256 action ids (OpenVLA's bins), tempered by ``temperature``
  and cut to ``top_k``; per-token log-probs [B, T, A] (chunk level = their sum). OpenVLA decodes the
  ``T * A`` tokens one by one with a KV cache and re-scores them teacher-forced; OFT predicts them in one
  bidirectional pass.
* ``action_head=l1`` (OFT): a Gaussian around the L1 head's output in normalized units, with a learned
  per-dimension log std (``log_std_init``); the env gets the sample clipped to [-1, 1] and un-normalized.
  With ``squash`` (SAC/RLPD's actor, docs/sac_vla_actors.md) the sample ``u`` goes through ``tanh`` instead of
  the clip, then the same un-normalization: the log-prob gets both change-of-variables terms
  (``policies.heads.gaussian.tanh_squash``), ``replay`` keeps ``u`` (``pre_tanh``), ``rsample`` draws it with gradients,
  ``act`` is the squashed mean, and ``critic_encoder`` gives the SAC critics a small image encoder of their own.

Actions are un-normalized with the checkpoint's dataset statistics (``unnorm_key``), or with the env's action
bounds for a model built here. The value head reads the hidden state at the prompt's last token.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from policies.ar_vla.openvla import (
    EMPTY_TOKEN,
    PROMPT,
    ActionStatistics,
    OpenVLA,
    OpenVLAConfig,
    prompt,
    published_config,
    tiny_config,
)
from policies.ar_vla.openvla_checkpoint import load_openvla
from policies.ar_vla.openvla_config import OpenVLAOFTPolicyConfig, OpenVLAPolicyConfig
from policies.ar_vla.openvla_oft import OpenVLAOFT
from policies.ar_vla.prismatic_vision import pixel_values
from policies.base import ActionSample, Policy, PolicySpec, as_float_tensor
from policies.cnn.modeling import CNNCriticEncoder, CNNPolicyConfig
from policies.heads.categorical import TokenCategoricalHead
from policies.heads.gaussian import tanh_squash
from policies.inputs import check_images, check_instructions
from policies.processors.libero import LiberoGripper, OFTImages
from policies.processors.normalize import RunningNormalize
from policies.registry import register_policy
from policies.value_head import config_value_support, value_expectation, value_output, with_value_bins
from policies.vlm.backbone import BACKBONE_CONFIG_NAME
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
from policies.vlm.tokenizer import build_byte_tokenizer

BOS, PAD = 1, 32000
BYTE_OFFSET = 3  # the tiny byte tokenizer's ids shifted past <unk>/<s>/</s>
# policy.conventions: the checkpoint family's own evaluation conventions around the network (None = none)
CONVENTIONS = {"": lambda: None, "libero_oft": lambda: (OFTImages(), LiberoGripper())}
# the CNNPolicyConfig keys CNNCriticEncoder reads: what ``policy.critic_cnn`` may set (squash=true)
CRITIC_CNN_KEYS = ("vision_encoder", "freeze_vision", "image_size", "cnn_channels", "vision_dim", "text_encoder",
                   "text_dim", "use_state")


@register_policy("openvla", OpenVLAPolicyConfig)
class OpenVLAPolicy(VLAPolicy):
    """OpenVLA (token head, sequential decoding); ``OpenVLAOFTPolicy`` runs OFT's network on the same code."""

    architecture = "openvla"

    def __init__(self, config: OpenVLAPolicyConfig, spec: PolicySpec, *, restore_dir: Path | None = None):
        super().__init__(config, spec)  # the network is the exact one, not a look-alike backbone
        arch = self.architecture
        oft = config if isinstance(config, OpenVLAOFTPolicyConfig) else None
        action_head = oft.action_head if oft is not None else "tokens"
        if action_head not in ("tokens", "l1"):
            raise ValueError(f"policy.action_head='{action_head}' is not one of {arch}'s heads ('tokens'; 'l1')")
        stats = proprio = None
        self.tokenizer = None
        if config.conventions not in CONVENTIONS:
            raise ValueError(f"policy.conventions='{config.conventions}' is unknown; use one of {sorted(CONVENTIONS)}")
        # (image step, action step) of a checkpoint family's evaluation code; a plain tuple: no weights, not saved
        self.conventions = CONVENTIONS[config.conventions]()
        restoring = bool(config.arch) and restore_dir is not None
        if config.pretrained_path and not restoring:
            if config.arch:
                raise ValueError(f"policy.arch.* ({sorted(config.arch)}) shapes a model built here; a pretrained_path "
                                 "checkpoint brings its own architecture: drop the policy.arch overrides")
            ckpt = load_openvla(config.pretrained_path, config.unnorm_key, variant=arch,
                                num_images=config.num_images or None, chunk_size=config.chunk_size)
            model, cfg, stats, proprio = ckpt.model, ckpt.config, ckpt.stats, ckpt.proprio_stats
        else:  # built here (tiny / published size, random weights), or restored from its saved ``arch``
            cfg = (tiny_config if config.size == "tiny" else published_config)(arch)
            cfg.action_dim, cfg.chunk_size = spec.action_dim, config.chunk_size
            cfg.num_images = config.num_images or max(1, len(spec.image_keys))
            cfg.proprio_dim = spec.state_dim if oft is not None and oft.use_state else 0
            cfg.action_head = action_head
            cfg = _with_overrides(cfg, dict(config.arch))
            model = (OpenVLAOFT if cfg.parallel else OpenVLA)(cfg)
        self.tokenizer = _llama_tokenizer(config.pretrained_path, restore_dir)
        config = replace(config, arch=asdict(cfg))  # the built architecture, in this policy's copy (a save restores it)
        self.config = config
        if cfg.action_dim != spec.action_dim or cfg.chunk_size != config.chunk_size and arch == "openvla_oft":
            raise ValueError(f"the {arch} model acts with action_dim={cfg.action_dim}, chunk {cfg.chunk_size}; the env "
                             f"needs action_dim={spec.action_dim}, policy.chunk_size={config.chunk_size}")
        self.blank_cameras = not spec.image_keys and config.empty_cameras > 0
        if self.blank_cameras and config.empty_cameras != cfg.num_images:
            raise ValueError(f"policy.empty_cameras={config.empty_cameras} but the {arch} model takes {cfg.num_images} "
                             f"image(s): set policy.num_images={config.empty_cameras}")
        if len(spec.image_keys) < cfg.num_images and not self.blank_cameras:
            raise ValueError(f"{arch} takes {cfg.num_images} camera image(s); the env has {list(spec.image_keys)} "
                             f"(set policy.num_images or env cameras; a state-only env: policy.empty_cameras=1)")
        self.model, self.cfg = model, cfg
        self.n_tokens = cfg.chunk_size * cfg.action_dim
        self.byte_tokenizer = build_byte_tokenizer() if self.tokenizer is None else None
        self._prompt_rows: dict[str, list[int]] = {}  # instruction -> prompt ids (``_prompt_row``)
        stats = stats or ActionStatistics(torch.tensor(spec.action_low, dtype=torch.float64),
                                          torch.tensor(spec.action_high, dtype=torch.float64),
                                          torch.ones(spec.action_dim, dtype=torch.bool))
        self.register_buffer("stat_low", stats.low.float())
        self.register_buffer("stat_high", stats.high.float())
        self.register_buffer("stat_mask", stats.mask)
        self.stat_eps = stats.eps
        self.proprio_stats = proprio
        self.state_norm = RunningNormalize("state", spec.state_dim, 10.0)
        self.register_buffer("action_ids", model.bins.token_ids.clone(), persistent=False)
        self.log_std = nn.Parameter(torch.full((cfg.action_dim,), float(oft.log_std_init))) \
            if oft is not None and cfg.action_head == "l1" else None
        self._check_squash()
        self.value_support = config_value_support(config)
        self.value_head = self._build_value_head_exact()
        self._finish_exact()

    # -- construction helpers ----------------------------------------------------------------------
    def _check_squash(self) -> None:
        """``policy.squash`` (OFT) needs the L1 head's Gaussian; ``policy.critic_cnn`` may set only what the encoder
        reads."""
        self.squash = False
        if not isinstance(self.config, OpenVLAOFTPolicyConfig):
            return
        self.squash = bool(self.config.squash)
        if self.squash and self.log_std is None:
            raise ValueError(f"policy.squash=true needs the continuous L1 head ({self.architecture} with "
                             f"action_head={self.config.action_head} has no Gaussian to squash): set "
                             f"policy=openvla_oft policy.action_head=l1, or policy.squash=false")
        unknown = sorted(set(self.config.critic_cnn) - set(CRITIC_CNN_KEYS))
        if self.squash and unknown:
            raise ValueError(f"policy.critic_cnn has keys {unknown} that the critics' CNNCriticEncoder does not read; "
                             f"known: {list(CRITIC_CNN_KEYS)}")

    def _build_value_head_exact(self) -> nn.Module:
        """On the state (``value_from=state``) or the prompt's last hidden state; K outputs with ``value_bins``."""
        src = self.config.value_from
        if src not in VALUE_SOURCES:
            raise ValueError(f"policy.value_from='{src}' is unknown; choose one of {VALUE_SOURCES}")
        if src == "critic_state":
            head = critic_state_value(self.spec)
        else:
            head = value_mlp(self.spec.state_dim, 256, 2) if src == "state" else value_mlp(self.cfg.llm_dim)
        return with_value_bins(head, self.value_support)

    def _finish_exact(self) -> None:
        cfg, m = self.config, self.model
        trunk = (m.vision_backbone, m.projector, m.language_model)
        if cfg.freeze_vlm:
            for part in trunk:
                part.requires_grad_(False)
        elif cfg.freeze_vision:
            m.vision_backbone.requires_grad_(False)
            for p in m.vision_backbone.film_parameters():  # OFT+ trains FiLM's maps with the towers frozen
                p.requires_grad_(not cfg.freeze_film)
        if cfg.freeze_embeddings:
            m.language_model.get_input_embeddings().requires_grad_(False)
        if cfg.lora.rank > 0:
            from peft import LoraConfig, inject_adapter_in_model

            lc = LoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                            target_modules=list(cfg.lora.target_modules))
            inject_adapter_in_model(lc, m.language_model)
            for name, p in m.language_model.named_parameters():
                p.requires_grad_("lora_" in name)
        if cfg.gradient_checkpointing:
            m.language_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for part in trunk:
            part.to(DTYPES[cfg.dtype])

    @property
    def device(self) -> torch.device:
        return self.stat_low.device

    @property
    def stats(self) -> ActionStatistics:
        return ActionStatistics(self.stat_low.double(), self.stat_high.double(), self.stat_mask, self.stat_eps)

    # -- observation -> model inputs ------------------------------------------------------------------
    def check_instructions(self, instructions: list[str]) -> None:
        """Refuse an empty instruction (one line); OpenVLA's prompt is never cut, so any length fits."""
        check_instructions(instructions, f"policy={self.architecture}")

    def _text(self, instructions: list[str], batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt ids [B, L] (<s> ... "Out:" 29871) and mask [B, L]; shorter prompts are padded right after <s>
        (the image stays after <s>, the action positions stay aligned at the end)."""
        if len(instructions) != batch:
            base = instructions or [self.spec.instruction]
            instructions = [base[i % len(base)] for i in range(batch)]
        self.check_instructions(instructions)
        rows = [self._prompt_row(s) for s in instructions]
        L = max(len(r) for r in rows)
        ids = torch.full((batch, L), PAD, dtype=torch.long)
        mask = torch.zeros(batch, L, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, 0], mask[i, 0] = BOS, 1
            ids[i, L - len(r) + 1 :], mask[i, L - len(r) + 1 :] = torch.tensor(r[1:]), 1
        return ids.to(self.device), mask.to(self.device)

    def _prompt_row(self, instruction: str) -> list[int]:
        """One instruction's prompt ids, tokenized once per distinct string: a replay batch repeats a few
        instructions, and tokenizing each row was a quarter of a batch-64 forward of the tiny model."""
        cache = self._prompt_rows
        if instruction not in cache:
            if len(cache) >= 4096:  # bounded: an env that writes a new instruction per episode
                cache.clear()
            text = prompt(instruction)
            if self.tokenizer is not None:
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            else:
                ids = [i + BYTE_OFFSET for i in self.byte_tokenizer(text, add_special_tokens=False)["input_ids"]]
            cache[instruction] = [BOS, *ids] + ([] if ids and ids[-1] == EMPTY_TOKEN else [EMPTY_TOKEN])
        return cache[instruction]

    def pixel_inputs(self, obs: dict[str, Any]) -> torch.Tensor:
        """The towers' input from ``obs``: the cameras the policy reads (or its black frames), through the
        checkpoint's image conventions, resized and normalized per tower, in the model's dtype."""
        if self.blank_cameras:  # a state-only env: constant black frames, the state enters as the proprio token
            size, batch = self.cfg.image_sizes[0], len(as_float_tensor(obs["state"], self.device))
            ims = [torch.zeros(batch, size, size, 3, dtype=torch.uint8, device=self.device)] * self.cfg.num_images
        else:
            keys = list(self.spec.image_keys)[: self.cfg.num_images]
            check_images(obs.get("images") or {}, self.spec, keys, f"policy={self.architecture}", check_size=False)
            ims = [torch.as_tensor(obs["images"][k], device=self.device) for k in keys]
            if self.conventions is not None:  # the checkpoint's own LIBERO image path (TF-exact resize, crop)
                ims = [self.conventions[0].apply(im) for im in ims]
        pv = torch.cat([pixel_values(im, self.cfg.timm_model_ids, self.cfg.image_sizes[0]) for im in ims], 1)
        return pv.to(DTYPES[self.config.dtype])

    def _inputs(self, obs: dict[str, Any]):
        pv = self.pixel_inputs(obs)
        ids, mask = self._text(list(obs.get("instruction", [])), pv.shape[0])
        proprio = None
        if isinstance(self.model, OpenVLAOFT) and self.model.proprio_projector is not None:
            state = as_float_tensor(obs["state"], self.device)
            proprio = self.proprio_stats.normalize(state) if self.proprio_stats is not None else \
                self.state_norm.normalize(state).clamp(-5, 5)
        return ids, mask, pv, proprio

    # -- the two distributions ----------------------------------------------------------------------------
    def _token_log_probs(self, h: torch.Tensor) -> torch.Tensor:
        """Hidden [B, n, H] -> log-probs over the 256 action ids [B, n, 256] (temperature, top-k)."""
        head = self.model.language_model.lm_head
        return self.token_head.log_probs(F.linear(h, head.weight[self.action_ids]).float())

    @property
    def token_head(self) -> TokenCategoricalHead:
        """The RL head over the 256 action ids (``policies.heads.categorical``)."""
        return TokenCategoricalHead(self.config.temperature, self.config.top_k)

    def _forward(self, obs: dict[str, Any], bins: torch.Tensor | None):
        """-> (per-position output [B, n, 256] log-probs or [B, T, A] L1 mean, value [B] or logits [B, K]).

        ``bins`` [B, n] are teacher-forced for OpenVLA's sequential decoding."""
        ids, mask, pv, proprio = self._inputs(obs)
        if isinstance(self.model, OpenVLAOFT):
            h, h_pre = self.model.parallel_hidden(ids, pv, proprio, mask)
            out = self.model.action_head(h.float()) if self.model.action_head is not None else self._token_log_probs(h)
        else:
            full = torch.cat([ids, self.action_ids[bins[:, :-1]]], 1)
            fmask = torch.cat([mask, mask.new_ones(mask.shape[0], self.n_tokens - 1)], 1)
            hid = self.model.hidden(full, pv, fmask)
            h = hid[:, hid.shape[1] - self.n_tokens :]
            h_pre = h[:, 0]
            out = self._token_log_probs(h)
        return out, self._value_exact(h_pre, obs)

    def _value_exact(self, h_pre: torch.Tensor, obs: dict[str, Any]) -> torch.Tensor:
        """What ``evaluate`` returns as the value: [B], or logits [B, K] with a binned head."""
        if self.config.value_from == "state":
            x = self.state_norm.normalize(as_float_tensor(obs["state"], self.device))
        elif self.config.value_from == "critic_state":
            x = critic_state_of(obs, self.spec, self.device, h_pre.shape[0])
        else:
            x = h_pre.float()
        return value_output(self.value_head(x), self.value_support)

    def _generate(self, obs: dict[str, Any], greedy: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """OpenVLA: ``T * A`` tokens one by one with a KV cache -> (bins [B, n], log-probs [B, n, 256], value)."""
        ids, mask, pv, _ = self._inputs(obs)
        emb, keys = self.model.embed(ids, pv, attention_mask=mask)
        bins: list[torch.Tensor] = []
        logps: list[torch.Tensor] = []
        values: list[torch.Tensor] = []

        def draw(h: torch.Tensor) -> torch.Tensor:
            if not values:  # the value reads the hidden state before the first action token
                values.append(self._value_exact(h, obs))
            logp = self._token_log_probs(h[:, None])[:, 0]
            bins.append(self.token_head.draw(logp, greedy))
            logps.append(logp)
            return self.action_ids[bins[-1]]

        self.model.decode(emb, keys, self.n_tokens, draw)
        return torch.stack(bins, 1), torch.stack(logps, 1), values[0]

    def _to_env(self, normalized: torch.Tensor) -> torch.Tensor:
        """Normalized [B, T, A] -> env units (clipped to [-1, 1] first, then the statistics; then the env's
        gripper convention under ``conventions``)."""
        out = self.stats.unnormalize(normalized.clamp(-1, 1))
        if self.conventions is not None:
            out = self.conventions[1].inverse({"action": out})["action"]
        return out

    def _bins_to_env(self, bins: torch.Tensor) -> torch.Tensor:
        x = self.model.bins.decode(self.action_ids[bins]).view(bins.shape[0], self.cfg.chunk_size, self.cfg.action_dim)
        return self._to_env(x)

    def _chunk(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], self.cfg.chunk_size, self.cfg.action_dim)

    # -- the squashed actor (policy.squash, action_head=l1) -------------------------------------------------
    def _squashed(self, dist: torch.distributions.Normal, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalized Gaussian sample ``u`` [B, T, A] -> (env-unit actions, log-prob): ``tanh`` then the
        un-normalization's affine map (the statistics' ``hi - lo + eps`` where they apply, identity on dims kept
        as predicted, e.g. the gripper); a zero-width statistic is widened to 1e-6 so its log-prob stays finite."""
        m = self.stat_mask
        low = torch.where(m, self.stat_low, -1.0)
        high = torch.maximum(torch.where(m, self.stat_high + self.stat_eps, 1.0), low + 1e-6)
        return tanh_squash(u, dist.log_prob(u), low, high)

    def rsample(self, obs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterized squashed chunk with gradients (SAC's actor loss): (actions [B, T, A] in env units,
        log-prob [B, T, A])."""
        if not self.squash:
            raise ValueError("rsample draws the tanh-squashed chunk: set policy.squash=true (action_head=l1)")
        mean, _ = self._forward(obs, None)
        dist = torch.distributions.Normal(mean, self.log_std.exp())
        return self._squashed(dist, dist.rsample())

    @property
    def critic_image_keys(self) -> list[str]:
        """The cameras the model reads (none for blank frames on a state-only env): SAC's critics read the same."""
        return [] if self.blank_cameras else list(self.spec.image_keys)[: self.cfg.num_images]

    def critic_encoder(self) -> nn.Module:
        """A fresh small image encoder ``obs -> [B, F]`` for SAC's critics: the CNN family's ``CNNCriticEncoder``
        over this model's cameras, shaped by ``policy.critic_cnn`` (CNNPolicyConfig's defaults: 64 px, small_cnn).
        The critic loss trains it and never reaches the VLA backbone (7B parameters at the published size), whose
        features follow the actor loss alone."""
        cnn = CNNPolicyConfig(**{**dict(self.config.critic_cnn), "chunk_size": self.config.chunk_size})
        return CNNCriticEncoder(cnn, replace(self.spec, image_keys=self.critic_image_keys))

    # -- the Policy interface ---------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, obs: dict[str, Any]) -> ActionSample:
        if self.log_std is not None:
            mean, value = self._forward(obs, None)
            x = mean + self.log_std.exp() * torch.randn_like(mean)
            if self.squash:
                actions, logp = self._squashed(torch.distributions.Normal(mean, self.log_std.exp()), x)
                return ActionSample(actions, logp, value_expectation(value, self.value_support),
                                    {"actions": actions, "pre_tanh": x})
            logp = torch.distributions.Normal(mean, self.log_std.exp()).log_prob(x)
            return ActionSample(self._to_env(x), logp, value_expectation(value, self.value_support),
                                {"normalized_actions": x})
        if isinstance(self.model, OpenVLAOFT):
            logp, value = self._forward(obs, None)
            bins = self.token_head.draw(logp)
        else:
            bins, logp, value = self._generate(obs, greedy=False)
        lp, _ = self.token_head.score(logp, bins)
        return ActionSample(self._bins_to_env(bins), self._chunk(lp), value_expectation(value, self.value_support),
                            {"action_tokens": self._chunk(bins)})

    def evaluate(self, obs: dict[str, Any], replay: dict[str, torch.Tensor]):
        if self.log_std is not None:
            mean, value = self._forward(obs, None)
            dist = torch.distributions.Normal(mean, self.log_std.exp())
            if self.squash:  # the Gaussian's entropy, before the squash (as policies.mlp)
                return self._squashed(dist, replay["pre_tanh"].to(mean))[1], dist.entropy(), value
            return dist.log_prob(replay["normalized_actions"].to(mean)), dist.entropy(), value
        bins = replay["action_tokens"].reshape(-1, self.n_tokens).long()
        logp, value = self._forward(obs, bins)
        lp, entropy = self.token_head.score(logp, bins)
        return self._chunk(lp), self._chunk(entropy), value

    @torch.no_grad()
    def act(self, obs: dict[str, Any]) -> torch.Tensor:
        if self.log_std is not None:
            mean = self._forward(obs, None)[0]
            if self.squash:
                return self._squashed(torch.distributions.Normal(mean, self.log_std.exp()), mean)[0]
            return self._to_env(mean)
        if isinstance(self.model, OpenVLAOFT):
            return self._bins_to_env(self.token_head.draw(self._forward(obs, None)[0], greedy=True))
        return self._bins_to_env(self._generate(obs, greedy=True)[0])

    @torch.no_grad()
    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        if isinstance(self.model, OpenVLAOFT):
            return value_expectation(self._forward(obs, None)[1], self.value_support)
        ids, mask, pv, _ = self._inputs(obs)
        return value_expectation(self._value_exact(self.model.hidden(ids, pv, mask)[:, -1], obs), self.value_support)

    def update_normalization(self, obs: dict[str, Any]) -> None:
        if not self.config.freeze_state_norm and "state" in obs:
            self.state_norm.update(as_float_tensor(obs["state"], self.device))
        fold_critic_state(self.value_head, obs)

    def normalization_stats(self) -> dict[str, list[float]]:
        return {"action_low": self.stat_low.tolist(), "action_high": self.stat_high.tolist(),
                "action_mask": self.stat_mask.tolist(), "state_mean": self.state_norm.mean.tolist(),
                "state_var": self.state_norm.var.tolist()}

    def sft_loss(self, obs: dict[str, Any], actions: torch.Tensor) -> torch.Tensor:
        """Demonstration actions [B, T, A] (env units): L1 on the head's output (OFT's loss; with ``squash``, on
        the squashed output ``act`` returns, in normalized units) or cross-entropy of their bin tokens."""
        target = self.stats.normalize(actions.to(self.device)).reshape(actions.shape[0], -1)
        if self.log_std is not None:
            mean, _ = self._forward(obs, None)
            if self.squash:  # act() is the squashed mean: fit that, or tanh shrinks every SFT'd action toward 0
                acted = self._squashed(torch.distributions.Normal(mean, self.log_std.exp()), mean)[0]
                mean = self.stats.normalize(acted).reshape(mean.shape)
            return F.l1_loss(mean, target.view_as(mean))
        k = (self.model.bins.encode(target) - self.action_ids[0]).clamp(0, len(self.action_ids) - 1)
        logp, _ = self._forward(obs, k)
        return F.nll_loss(logp.flatten(0, 1), k.flatten())

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Base files + the processor (tokenizer files, ``processor_config.json``) + ``backbone_config.json``
        (the architecture), so the checkpoint restores and exports without the original folder."""
        d = Policy.save_pretrained(self, directory)
        (self.tokenizer or self.byte_tokenizer).save_pretrained(str(d))
        proc = {"tokenizer": "llama" if self.tokenizer is not None else "byte", "byte_offset": BYTE_OFFSET,
                "prompt": PROMPT, "image_keys": list(self.spec.image_keys)[: self.cfg.num_images],
                "image_sizes": self.cfg.image_sizes, "timm_model_ids": self.cfg.timm_model_ids}
        (d / PROCESSOR_NAME).write_text(json.dumps(proc, indent=2))
        (d / BACKBONE_CONFIG_NAME).write_text(json.dumps({"architecture": self.architecture,
                                                          "openvla": self.config.arch}, indent=2))
        return d


@register_policy("openvla_oft", OpenVLAOFTPolicyConfig)
class OpenVLAOFTPolicy(OpenVLAPolicy):
    """OpenVLA-OFT: a whole chunk in one bidirectional pass, the proprio token, the L1 head (a Gaussian around it,
    tanh-squashed for SAC with ``squash``) or OFT's token head."""

    architecture = "openvla_oft"


def _with_overrides(cfg: OpenVLAConfig, overrides: dict[str, Any]) -> OpenVLAConfig:
    """``policy.arch`` over a base architecture: top-level fields replaced, ``text_config`` merged key by key
    (``policy.arch.text_config.hidden_size=64`` widens the tiny Llama); a restored save sets every field."""
    known = {f.name for f in fields(OpenVLAConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"policy.arch has keys {unknown} that OpenVLAConfig does not know; known: {sorted(known)}")
    merged = {**asdict(cfg), **overrides}
    merged["text_config"] = {**cfg.text_config, **dict(overrides.get("text_config", {}))}
    return OpenVLAConfig(**merged)


def _llama_tokenizer(pretrained_path: str | None, restore: Path | None):
    """The checkpoint's own tokenizer: a restored policy's folder (``restore``) first, else the OpenVLA folder;
    None = bytes."""
    from transformers import AutoTokenizer

    for folder in (restore, Path(pretrained_path) if pretrained_path else None):
        if folder is None or not (folder / "tokenizer_config.json").is_file():
            continue
        proc = folder / PROCESSOR_NAME
        if folder == restore and proc.is_file() and json.loads(proc.read_text()).get("tokenizer") == "byte":
            return None
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return None
