"""Loss aggregation: how per-element losses become one scalar.

``loss`` and ``mask`` share a shape whose first dim is the sample (one chunk step of one env);
trailing dims are the tokens of that sample at the configured log-prob level.

- ``token-mean``: every real token weighs the same. The usual choice; a long sample (more
  executed actions / tokens) contributes more. Equal to the plain mean when nothing is padded.
- ``seq-mean-token-mean``: mean over each sample's tokens, then over samples: every chunk step
  weighs the same however many of its actions were executed.
- ``traj-mean``: mean within each trajectory (episode, or episode segment in this rollout), then
  over trajectories: every episode weighs the same, so short successful episodes are not drowned
  by long failing ones (useful with sparse success rewards and GRPO).
"""

from __future__ import annotations

import torch

AGG_MODES = ("token-mean", "seq-mean-token-mean", "traj-mean")


def aggregate_loss(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    traj_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """loss, mask: [M, ...]; traj_ids: [M] int (needed by ``traj-mean``). Returns a scalar.

    Samples without any real token are ignored; an all-masked input gives 0 (with a gradient path).
    """
    m = mask.to(loss.dtype)
    if mode == "token-mean":
        return (loss * m).sum() / m.sum().clamp_min(1.0)
    per_sample_tokens = m.reshape(m.shape[0], -1).sum(-1)
    per_sample = (loss * m).reshape(m.shape[0], -1).sum(-1) / per_sample_tokens.clamp_min(1.0)
    real = per_sample_tokens > 0
    if mode == "seq-mean-token-mean":
        return (per_sample * real).sum() / real.sum().clamp_min(1)
    if mode == "traj-mean":
        if traj_ids is None:
            raise ValueError("loss_agg_mode='traj-mean' needs trajectory ids per sample")
        _, inv = torch.unique(traj_ids[real], return_inverse=True)
        n_traj = int(inv.max()) + 1 if inv.numel() else 0
        if n_traj == 0:
            return (loss * m).sum()
        sums = torch.zeros(n_traj, dtype=loss.dtype, device=loss.device).index_add(0, inv, per_sample[real])
        counts = torch.zeros(n_traj, dtype=loss.dtype, device=loss.device).index_add(
            0, inv, torch.ones_like(per_sample[real]))
        return (sums / counts).mean()
    raise ValueError(f"algorithm.loss_agg_mode='{mode}' is unknown; choose one of {AGG_MODES}")


def trajectory_ids(ended: torch.Tensor) -> torch.Tensor:
    """Episode-segment id per sample from end flags ``ended [N, B]`` (time-major) -> [N, B] int.

    A new trajectory starts after every step where an episode ended; ids are unique across envs.
    """
    N, B = ended.shape
    before = torch.cumsum(ended.long(), 0) - ended.long()  # episodes finished before step t
    return torch.arange(B, device=ended.device).unsqueeze(0) * (N + 1) + before
