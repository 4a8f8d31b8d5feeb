"""Critic quality on held-out episodes.

* VOC (value-order correlation): Spearman rank correlation between the predicted progress of frame t
  (relative to the episode's first frame) and t, averaged over successful episodes; Kendall's tau too.
* reversed-pair negative rate: fraction of (later, earlier) pairs with a gap of at least
  ``min_gap_frac`` of the episode whose predicted progress is < 0; its mirror, the forward-pair
  positive rate on the same pairs in time order, keeps a critic with a constant negative output from
  looking good (``pair_order_accuracy`` is their mean).
* delta return: the sum of per-step progress deltas (the ``delta`` reward mode) over an episode, averaged
  separately over successful and failed episodes; a useful dense reward pays the first more. Likewise
  final progress: progress(first frame -> last frame), what ``potential`` shaping pays per episode.
* done precision / recall: ``done_prob > threshold`` against "this is the last frame of a successful
  episode", over every frame of every held-out episode.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from policies.episode import Episode


def rankdata(x: torch.Tensor) -> torch.Tensor:
    """Average ranks (ties share the mean rank), float64 [n]."""
    x = x.double().flatten()
    order = torch.argsort(x, stable=True)
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(len(x), dtype=torch.float64)
    for v in torch.unique(x):
        m = x == v
        if int(m.sum()) > 1:
            ranks[m] = ranks[m].mean()
    return ranks


def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    """Spearman rank correlation; NaN when either input is constant."""
    rx, ry = rankdata(x), rankdata(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = float(rx.norm() * ry.norm())
    return float((rx * ry).sum()) / den if den > 0 else float("nan")


def kendall_tau(x: torch.Tensor, y: torch.Tensor) -> float:
    """Kendall's tau-a over all pairs (O(n^2); n is an episode length)."""
    x, y = x.double().flatten(), y.double().flatten()
    dx = torch.sign(x[:, None] - x[None, :])
    dy = torch.sign(y[:, None] - y[None, :])
    n = len(x)
    return float((dx * dy).sum()) / (n * (n - 1)) if n > 1 else float("nan")


def value_curve(critic: Any, episode: Episode, batch_size: int = 64,
                reference: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(progress [L] of frame t relative to frame 0, done_prob [L])."""
    L = episode.frames.shape[0]
    first = episode.frames[:1].expand(L, *episode.frames.shape[1:])
    return critic.score(first, episode.frames, [episode.instruction] * L, reference=reference, batch_size=batch_size)


@torch.no_grad()
def critic_quality(critic: Any, episodes: list[Episode], min_gap_frac: float = 0.2, max_pairs: int = 64,
                   done_threshold: float = 0.5, seed: int = 0,
                   reference: torch.Tensor | None = None) -> dict[str, float]:
    """VOC (Spearman, Kendall), pair-order rates and done precision/recall on ``episodes``.

    reference: uint8 [R, H, W, 3] frames of a successful episode shown to the critic in context (or None).
    """
    rng = np.random.default_rng(seed)
    vocs, taus, neg, pos, tp, fp, fn = [], [], [], [], 0, 0, 0
    ret_ok, ret_fail, fin_ok, fin_fail = [], [], [], []
    for ep in episodes:
        L = ep.frames.shape[0]
        prog, done = value_curve(critic, ep, reference=reference)
        step, _ = critic.score(ep.frames[:-1], ep.frames[1:], [ep.instruction] * (L - 1), reference=reference)
        (ret_ok if ep.success else ret_fail).append(float(step.sum()))
        (fin_ok if ep.success else fin_fail).append(float(prog[-1]))
        t = torch.arange(L, dtype=torch.float32)
        label = torch.zeros(L, dtype=torch.bool)
        if ep.success:
            r = spearman(prog, t)
            if r == r:  # not NaN
                vocs.append(r)
            taus.append(kendall_tau(prog, t))
            label[-1] = True
            gap = max(1, int(round(min_gap_frac * (L - 1))))
            pairs = [(i, j) for i in range(L) for j in range(i + gap, L)]
            if len(pairs) > max_pairs:
                pairs = [pairs[k] for k in rng.choice(len(pairs), max_pairs, replace=False)]
            if pairs:
                i, j = torch.tensor(pairs).T
                p, _ = critic.score(ep.frames[j], ep.frames[i], [ep.instruction] * len(pairs), reference=reference)
                neg += (p < 0).tolist()
                p_fwd, _ = critic.score(ep.frames[i], ep.frames[j], [ep.instruction] * len(pairs), reference=reference)
                pos += (p_fwd > 0).tolist()
        pred = done > done_threshold
        tp += int((pred & label).sum())
        fp += int((pred & ~label).sum())
        fn += int((~pred & label).sum())
    return {
        "voc_spearman": float(np.mean(vocs)) if vocs else float("nan"),
        "voc_kendall": float(np.mean(taus)) if taus else float("nan"),
        "reversed_negative_rate": float(np.mean(neg)) if neg else float("nan"),
        "forward_positive_rate": float(np.mean(pos)) if pos else float("nan"),
        "pair_order_accuracy": float(np.mean(neg + pos)) if neg else float("nan"),
        "delta_return_success": float(np.mean(ret_ok)) if ret_ok else float("nan"),
        "delta_return_failure": float(np.mean(ret_fail)) if ret_fail else float("nan"),
        "final_progress_success": float(np.mean(fin_ok)) if fin_ok else float("nan"),
        "final_progress_failure": float(np.mean(fin_fail)) if fin_fail else float("nan"),
        "done_precision": tp / (tp + fp) if tp + fp else float("nan"),
        "done_recall": tp / (tp + fn) if tp + fn else float("nan"),
        "episodes": len(episodes),
        "successful_episodes": sum(e.success for e in episodes),
    }
