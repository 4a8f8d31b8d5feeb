"""Critic training episodes from policy rollouts.

A user improves the critic on the episodes their own policy produces: the training run splits the frames the
critic scored into episodes here and stores them (``reward.save_episodes``, written by
``vlarl.data.critic_episodes``), and ``scripts/train_critic.py train --data <that dir> --init <critic>``
fine-tunes on them. Rollout frames are the chunk-boundary frames (one per chunk step), so an episode of L
chunk steps has L + 1 frames; labels are normalized time progress, so any frame rate works.
"""

from __future__ import annotations

import torch

from policies.episode import Episode


def split_rollout(frames: torch.Tensor, next_frames: torch.Tensor, ended: torch.Tensor, success: torch.Tensor,
                  instructions: list[str], starts_fresh: bool = False) -> list[Episode]:
    """The complete episodes of a rollout.

    frames / next_frames: uint8 [N, B, H, W, 3], the frame each chunk step started from / ended at (the final
    frame where an episode ended); ended: bool [N, B]; success: [N, B], the episode's success where it ended
    (NaN elsewhere is fine); instructions: B strings, or N*B (one per row, time-major; an episode takes its
    first row's). An episode counts when the rollout saw its start: after an
    end inside the rollout, or at step 0 when ``starts_fresh`` (every env was reset there, as in GRPO groups).
    """
    N, B = ended.shape
    if frames.shape[:2] != (N, B) or next_frames.shape != frames.shape:
        raise ValueError(f"frames {tuple(frames.shape)} / next_frames {tuple(next_frames.shape)} must be "
                         f"[N={N}, B={B}, H, W, 3] like ended")
    if instructions and len(instructions) not in (B, N * B):
        raise ValueError(f"got {len(instructions)} instructions for {N} steps x {B} envs; give one per env or one per row")
    per_row = len(instructions) == N * B and N > 1
    episodes = []
    for b in range(B):
        start = 0 if starts_fresh else None
        for t in range(N):
            if bool(ended[t, b]):
                if start is not None:
                    ep = torch.cat([frames[start : start + 1, b], next_frames[start : t + 1, b]])
                    words = instructions[start * B + b] if per_row else instructions[b]
                    episodes.append(Episode(ep.clone(), words, bool(torch.nan_to_num(success[t, b]) > 0)))
                start = t + 1 if t + 1 < N else None
    return episodes
