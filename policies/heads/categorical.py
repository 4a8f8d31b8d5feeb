"""A categorical over action tokens (one per action dimension and chunk step): the RL head of the token VLAs
(``ar_vla`` and OpenVLA's 256 bins).

The network gives logits ``[B, n, V]`` over the V action tokens at each of the ``n = T * A`` positions; the
head tempers them (``temperature``), keeps the top ``top_k`` (the rest get a finite ``MASKED`` logit, so a
masked token replayed later scores a ratio of 0, not NaN) and owns the rest: ``log_probs``, ``draw`` (a sample,
or the argmax when greedy), ``score`` (log-prob and entropy of replayed tokens). The same rule samples and
re-scores, so PPO's ratio is exactly 1 before an update.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MASKED = -1e9  # logit of tokens outside the top k


@dataclass(frozen=True)
class TokenCategoricalHead:
    temperature: float = 1.0
    top_k: int = 0  # 0 = all tokens

    def log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., V]`` -> tempered, top-k log-probs ``[..., V]``."""
        logits = logits / self.temperature
        k = self.top_k
        if 0 < k < logits.shape[-1]:
            kth = logits.topk(k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, MASKED)
        return logits.log_softmax(-1)

    @staticmethod
    def draw(logp: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        """Log-probs ``[..., V]`` -> one token per position ``[...]`` (the argmax when ``greedy``)."""
        if greedy:
            return logp.argmax(-1)
        return torch.multinomial(logp.exp().reshape(-1, logp.shape[-1]), 1).view(logp.shape[:-1])

    @staticmethod
    def score(logp: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-prob ``[..., n]`` of ``tokens [..., n]``, entropy ``[..., n]``) under ``logp [..., n, V]``."""
        lp = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        return lp, -(logp.exp() * logp).sum(-1)
