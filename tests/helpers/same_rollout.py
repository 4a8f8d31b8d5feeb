"""Bitwise comparison of two runs of the same chunks through ``chunk_step`` (rendering every step vs at chunk
boundaries, tests/simulators/test_maniskill*_render_once.py)."""

from __future__ import annotations

import math

import torch


def same_obs(a: dict, b: dict, where: str) -> None:
    """The same words, state and every camera's uint8 frame, bit for bit."""
    assert a["instruction"] == b["instruction"], where
    assert torch.equal(a["state"], b["state"]), where
    assert a["images"].keys() == b["images"].keys() and a["images"], where
    for k in a["images"]:
        assert a["images"][k].dtype == torch.uint8, where
        assert torch.equal(a["images"][k], b["images"][k]), f"{where}: camera {k} differs"


def same_chunk_results(ref: list, got: list) -> int:
    """Each chunk's obs, rewards, flags, episode metrics and ``final_obs`` equal; returns how many chunks ended an
    episode."""
    ended = 0
    for c, (r, s) in enumerate(zip(ref, got, strict=True)):
        same_obs(r.obs, s.obs, f"chunk {c}")
        for field in ("rewards", "terminated", "truncated", "step_mask", "success", "done"):
            assert torch.equal(getattr(r, field), getattr(s, field)), f"chunk {c}: {field}"
        for k, v in r.episode.items():
            assert [x if not math.isnan(x) else None for x in v.tolist()] == \
                   [x if not math.isnan(x) else None for x in s.episode[k].tolist()], f"chunk {c}: {k}"
        assert (r.final_obs is None) == (s.final_obs is None), f"chunk {c}"
        if r.final_obs is not None:
            same_obs(r.final_obs, s.final_obs, f"chunk {c} final_obs")
            ended += 1
    return ended
