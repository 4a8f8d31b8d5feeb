"""Supervised training of a progress critic on labelled frame pairs (see ``labels``).

Loss = MSE(progress, label) + done_weight * BCE(done_logit, done label); the done term uses
``pos_weight`` because only one frame per successful episode is a positive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from policies.critics.labels import PairMix, sample_pairs
from policies.episode import Episode


@dataclass
class CriticTrainConfig:
    steps: int = 600
    batch_size: int = 32
    lr: float = 3e-4
    weight_decay: float = 0.01
    done_weight: float = 0.5
    done_pos_weight: float = 5.0
    max_grad_norm: float = 1.0
    seed: int = 0
    reference_prob: float = 0.0  # chance a batch sees a successful episode's frames as in-context reference
    reference_frames: int = 4
    mix: PairMix = field(default_factory=PairMix)


def reference_frames(episode: Episode, n: int) -> torch.Tensor:
    """``n`` evenly spaced frames of an episode: uint8 [n, H, W, 3] (a one-shot reference trajectory)."""
    idx = torch.linspace(0, episode.frames.shape[0] - 1, n).round().long()
    return episode.frames[idx]


def critic_loss(critic: Any, batch, cfg: CriticTrainConfig,
                reference: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    out = critic(batch.earlier, batch.later, batch.instructions, reference=reference)
    dev = out.progress.device
    prog_loss = F.mse_loss(out.progress, batch.progress.to(dev))
    done_loss = F.binary_cross_entropy_with_logits(
        out.done_logit, batch.done.to(dev), pos_weight=torch.tensor(cfg.done_pos_weight, device=dev))
    loss = prog_loss + cfg.done_weight * done_loss
    return loss, {"loss": loss.item(), "progress_mse": prog_loss.item(), "done_bce": done_loss.item()}


def train_critic(critic: Any, episodes: list[Episode], cfg: CriticTrainConfig,
                 distractor_instructions: list[str] | None = None, log_every: int = 50) -> list[dict[str, float]]:
    """AdamW on freshly sampled pairs each step; returns the logged metrics (every ``log_every`` steps)."""
    rng = np.random.default_rng(cfg.seed)
    torch.manual_seed(cfg.seed)
    opt = torch.optim.AdamW([p for p in critic.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay)
    critic.train()
    log: list[dict[str, float]] = []
    for step in range(1, cfg.steps + 1):
        batch = sample_pairs(episodes, cfg.batch_size, rng, cfg.mix, distractor_instructions)
        reference = None
        if cfg.reference_prob > 0 and rng.random() < cfg.reference_prob:
            succ = [e for e in episodes if e.success]
            reference = reference_frames(succ[rng.integers(len(succ))], cfg.reference_frames)
        loss, metrics = critic_loss(critic, batch, cfg, reference)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(critic.parameters(), cfg.max_grad_norm)
        opt.step()
        if step % log_every == 0 or step == cfg.steps:
            log.append({"step": step, **metrics})
            print(f"[critic] step {step}/{cfg.steps} " + " ".join(f"{k}={v:.4f}" for k, v in metrics.items()),
                  flush=True)
    critic.eval()
    return log
