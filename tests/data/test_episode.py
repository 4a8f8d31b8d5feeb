"""One Episode class: the demonstration readers, SFT batching and the critic's pair labelling share it, so
one recorded episode (frames, instruction, success, state, actions) feeds both trainers as it is."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def test_one_recorded_episode_feeds_sft_batches_and_critic_pairs():
    import policies.critics
    import vlarl.data.demonstrations
    from policies.critics.labels import sample_pairs
    from policies.episode import Episode
    from vlarl.data.sft import demonstration_batches

    assert policies.critics.Episode is Episode is vlarl.data.demonstrations.Episode
    L = 5
    g = torch.Generator().manual_seed(0)
    ep = Episode(frames=torch.randint(0, 256, (L, 8, 8, 3), generator=g, dtype=torch.uint8), instruction="push",
                 success=True, state=np.arange(L * 2, dtype=np.float32).reshape(L, 2),
                 actions=np.arange(L, dtype=np.float32).reshape(L, 1) / 10)
    obs, chunks = next(demonstration_batches([ep], chunk=2, batch_size=L, instruction="push",
                                             generator=torch.Generator().manual_seed(0)))
    rows = obs["state"][:, 0].long() // 2  # which step each row is
    torch.testing.assert_close(chunks[:, 0, 0], torch.from_numpy(ep.actions[rows.numpy(), 0]))
    torch.testing.assert_close(chunks[:, 1, 0], torch.from_numpy(ep.actions[(rows + 1).clamp(max=L - 1).numpy(), 0]))
    pairs = sample_pairs([ep], 8, np.random.default_rng(0))
    assert pairs.earlier.shape == (8, 8, 8, 3) and set(pairs.instructions) <= {"push", ""}
    forward = pairs.kind == 0
    assert bool((pairs.progress[forward] >= 0).all())


def test_an_episode_without_frames_or_actions_names_what_it_needs():
    from policies.episode import Episode

    with pytest.raises(ValueError, match="needs frames .* or state and actions"):
        Episode(state=np.zeros((3, 2), np.float32))
