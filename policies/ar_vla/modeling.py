"""Autoregressive token VLA (OpenVLA-style) on any Hugging Face VLM backbone.

Each normalized action dimension is one token: a uniform bin (256 by default) mapped onto reserved
vocabulary ids (``policies.vlm.tokenizer.ActionTokenizer``). The LM's output projection restricted to
those ids gives a categorical over bins, tempered by ``temperature`` and cut to ``top_k``; sampling and
re-scoring apply the same rule, so ``evaluate(obs, replay)`` reproduces ``sample``'s log-probs.

Decoding a chunk of ``T`` actions x ``A`` dims = ``n = T * A`` tokens:
* ``parallel`` (OFT-style): one forward over ``[prefix | n learned action queries]``; every token is
  predicted at its query position from the prefix alone, so the chunk comes out of a single pass.
* ``sequential``: token-by-token generation with a KV cache; training re-scores with one teacher-forced
  pass over ``[prefix | tokens[:-1]]``.
The value head reads the hidden state of the last prefix position (before the first action token).

This is the look-alike composition on ``backbone.kind``; the exact OpenVLA / OpenVLA-OFT networks are families
of their own (``policy=openvla`` / ``openvla_oft``, ``policies/ar_vla/openvla_policy.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from policies.base import ActionSample, PolicySpec
from policies.heads.categorical import TokenCategoricalHead
from policies.registry import register_policy
from policies.value_head import config_value_support, value_expectation, with_value_bins
from policies.vlm.backbone import BackboneConfig
from policies.vlm.policy_base import BackboneVLAPolicy, VLAPolicyConfig, fold_critic_state
from policies.vlm.tokenizer import ActionTokenizer, add_action_tokens

DECODINGS = ("parallel", "sequential")


@dataclass
class ARVLAConfig(VLAPolicyConfig):
    name: str = "ar_vla"
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    chunk_size: int = 4  # actions per chunk (T)
    n_action_bins: int = 256
    action_token_strategy: str = "added"  # "added" (<action_i> tokens) | "tail" (last n ids) | "openvla" (255 bins counting down from the vocab end)
    decoding: str = "parallel"  # "parallel" (one pass, OFT-style) | "sequential" (generate)
    temperature: float = 1.0
    top_k: int = 0  # 0 = all bins
    use_state: bool = True  # add a projected proprio-state token to the prefix


@register_policy("ar_vla", ARVLAConfig)
class ARVLAPolicy(BackboneVLAPolicy):
    def __init__(self, config: ARVLAConfig, spec: PolicySpec, *, restore_dir: Path | None = None):
        if config.decoding not in DECODINGS:
            raise ValueError(f"policy.decoding='{config.decoding}' is unknown; choose one of {DECODINGS}")
        if config.temperature <= 0:
            raise ValueError(f"policy.temperature must be > 0, got {config.temperature}")
        super().__init__(
            config, spec,
            extra_tokens=lambda tok: add_action_tokens(tok, config.n_action_bins, config.action_token_strategy),
            restore_dir=restore_dir,
        )
        self.action_tokenizer = ActionTokenizer(self.backbone.tokenizer, config.n_action_bins,
                                                config.action_token_strategy)
        self.register_buffer("action_token_ids", self.action_tokenizer.token_ids.clone(), persistent=False)
        H = self.backbone.hidden_size
        self.n_tokens = config.chunk_size * spec.action_dim
        self.action_queries = nn.Parameter(torch.randn(self.n_tokens, H) * 0.02) if config.decoding == "parallel" else None
        self.value_support = config_value_support(config)
        self.value_head = with_value_bins(self._build_value_head(), self.value_support)
        self._finish_init()

    # -- the distribution over bins ------------------------------------------------------------
    def _bin_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Hidden [B, n, H] -> logits over action bins [B, n, n_bins] (LM head rows of the action ids)."""
        head = self.backbone.lm_head
        w = head.weight[self.action_token_ids]
        b = head.bias[self.action_token_ids] if head.bias is not None else None
        return F.linear(h, w, b).float()

    @property
    def head(self) -> TokenCategoricalHead:
        """The RL head (``policies.heads.categorical``): temperature + top-k, one rule to sample and re-score."""
        return TokenCategoricalHead(self.config.temperature, self.config.top_k)

    def _log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        return self.head.log_probs(logits)

    def _hidden(self, obs: dict[str, Any], bins: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass -> (hidden at the n action-token predictions [B, n, H], last prefix hidden [B, H]).

        ``bins`` [B, n] are teacher-forced in sequential mode (ignored in parallel mode)."""
        emb, mask = self.prefix(obs)
        B, L = mask.shape
        if self.config.decoding == "parallel":
            tail = self.action_queries.to(emb.dtype).unsqueeze(0).expand(B, -1, -1)
        else:
            tail = self.backbone.embed_tokens(self.action_token_ids[bins[:, :-1]])
        ones = torch.ones(B, tail.shape[1], dtype=mask.dtype, device=mask.device)
        h, _ = self.backbone(torch.cat([emb, tail.to(emb.dtype)], 1), torch.cat([mask, ones], 1))
        h_act = h[:, L:] if self.config.decoding == "parallel" else h[:, L - 1 :]
        return h_act, h[:, L - 1]

    def _forward_tokens(self, obs: dict[str, Any], bins: torch.Tensor | None):
        """-> (log-probs [B, n, n_bins], value [B] or logits [B, K] with a binned value head)."""
        h_act, h_pre = self._hidden(obs, bins)
        return self._log_probs(self._bin_logits(h_act)), self._value(h_pre, obs)

    def _generate(self, obs: dict[str, Any], greedy: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sequential decoding with a KV cache -> (bins [B, n], log-probs [B, n, n_bins], value [B])."""
        emb, mask = self.prefix(obs)
        h, past = self.backbone(emb, mask, use_cache=True)
        value = self._value(h[:, -1], obs)
        h_last = h[:, -1:]
        bins, logps = [], []
        for _ in range(self.n_tokens):
            logp = self._log_probs(self._bin_logits(h_last))[:, 0]
            tok = self.head.draw(logp, greedy)
            bins.append(tok)
            logps.append(logp)
            if len(bins) == self.n_tokens:
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            e = self.backbone.embed_tokens(self.action_token_ids[tok]).unsqueeze(1)
            h_last, past = self.backbone(e, mask, past_key_values=past, use_cache=True)
        return torch.stack(bins, 1), torch.stack(logps, 1), value

    def _to_actions(self, bins: torch.Tensor) -> torch.Tensor:
        B = bins.shape[0]
        x = self.action_tokenizer.decode(bins).view(B, self.config.chunk_size, self.spec.action_dim)
        return self.unnormalize_actions(x)

    def _chunk(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], self.config.chunk_size, self.spec.action_dim)

    # -- the Policy interface ------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, obs: dict[str, Any]) -> ActionSample:
        if self.config.decoding == "parallel":
            logp, value = self._forward_tokens(obs, None)
            bins = self.head.draw(logp)
        else:
            bins, logp, value = self._generate(obs, greedy=False)
        lp, _ = self.head.score(logp, bins)
        return ActionSample(self._to_actions(bins), self._chunk(lp), value_expectation(value, self.value_support),
                            {"action_tokens": self._chunk(bins)})

    def evaluate(self, obs: dict[str, Any], replay: dict[str, torch.Tensor]):
        bins = replay["action_tokens"].reshape(-1, self.n_tokens).long()
        logp, value = self._forward_tokens(obs, bins)
        lp, entropy = self.head.score(logp, bins)
        return self._chunk(lp), self._chunk(entropy), value

    @torch.no_grad()
    def act(self, obs: dict[str, Any]) -> torch.Tensor:
        if self.config.decoding == "parallel":
            bins = self.head.draw(self._forward_tokens(obs, None)[0], greedy=True)
        else:
            bins = self._generate(obs, greedy=True)[0]
        return self._to_actions(bins)

    @torch.no_grad()
    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        emb, mask = self.prefix(obs)
        h, _ = self.backbone(emb, mask)
        return value_expectation(self._value(h[:, -1], obs), self.value_support)

    def update_normalization(self, obs: dict[str, Any]) -> None:
        """RL rollouts fold into the state statistics unless ``freeze_state_norm`` keeps the SFT ones (a
        ``value_from=critic_state`` head's statistics fold in either way)."""
        if not self.config.freeze_state_norm:
            super().update_normalization(obs)
        else:
            fold_critic_state(self.value_head, obs)

    def sft_loss(self, obs: dict[str, Any], actions: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of demonstration actions [B, T, A] (env units) as bin tokens (temperature 1)."""
        bins = self.action_tokenizer.encode(self.normalize_actions(actions.to(self.device))).reshape(-1, self.n_tokens)
        h_act, _ = self._hidden(obs, bins)
        return F.cross_entropy(self._bin_logits(h_act).flatten(0, 1), bins.flatten())
