"""Training pairs for a progress critic, labelled from time along episodes.

Label rules (L = frames in the episode, i < j frame indices):

    forward, successful episode   progress = (j - i) / (L - 1)    done = j >= L - 1 - done_window
    reversed (later <- earlier)   progress = -(j - i) / (L - 1)   done = 0
    failed episode, either order  progress = failed_progress (0)  done = 0
    mismatched instruction        progress = 0                    done = 0
    same frame twice              progress = 0                    done = as for forward

so regression on reversed pairs must come out negative and a wrong instruction must give ~0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from policies.episode import Episode

PAIR_KINDS = ("forward", "reversed", "failed", "mismatched", "same")


@dataclass
class PairBatch:
    """M labelled pairs: earlier/later uint8 [M, H, W, 3]; progress/done float32 [M]; kind long [M]."""

    earlier: torch.Tensor
    later: torch.Tensor
    instructions: list[str]
    progress: torch.Tensor
    done: torch.Tensor
    kind: torch.Tensor


@dataclass
class PairMix:
    """Fractions of each pair kind in a batch (renormalized over the kinds that are possible)."""

    forward: float = 0.4
    reversed: float = 0.25
    failed: float = 0.15
    mismatched: float = 0.1
    same: float = 0.1
    done_window: int = 0
    failed_progress: float = 0.0
    # share of forward / same pairs whose later frame is one of a success's last ``end_frames`` frames: the
    # done head sees its rare positives (the last frame) beside look-alike negatives (the frames just before)
    end_focus: float = 0.0
    end_frames: int = 4


def time_progress(i: int, j: int, length: int) -> float:
    """Normalized time progress from frame i to frame j of an L-frame successful episode."""
    return (j - i) / max(1, length - 1)


def sample_pairs(episodes: list[Episode], n: int, rng: np.random.Generator, mix: PairMix | None = None,
                 distractor_instructions: list[str] | None = None) -> PairBatch:
    """Draw ``n`` labelled pairs following ``mix`` (see module docstring for the labels)."""
    mix = mix or PairMix()
    succ = [e for e in episodes if e.success and e.frames.shape[0] >= 2]
    fail = [e for e in episodes if not e.success and e.frames.shape[0] >= 2]
    if not succ:
        raise ValueError("critic training needs at least one successful episode with >= 2 frames")
    weights = np.array([mix.forward, mix.reversed, mix.failed if fail else 0.0,
                        mix.mismatched if distractor_instructions else 0.0, mix.same], dtype=np.float64)
    weights /= weights.sum()
    kinds = rng.choice(len(PAIR_KINDS), size=n, p=weights)
    earlier, later, instr, prog, done = [], [], [], [], []
    for k in kinds:
        name = PAIR_KINDS[k]
        ep = fail[rng.integers(len(fail))] if name == "failed" else succ[rng.integers(len(succ))]
        L = ep.frames.shape[0]
        i, j = sorted(rng.choice(L, size=2, replace=False).tolist())
        if name in ("forward", "same") and mix.end_focus > 0 and rng.random() < mix.end_focus:
            j = int(rng.integers(max(1, L - mix.end_frames), L))
            i = int(rng.integers(0, j))
        text, p, d = ep.instruction, time_progress(i, j, L), float(j >= L - 1 - mix.done_window)
        if name == "reversed":
            i, j, p, d = j, i, -p, 0.0
        elif name == "failed":
            if rng.random() < 0.5:
                i, j = j, i
            p, d = mix.failed_progress, 0.0
        elif name == "mismatched":
            text = distractor_instructions[rng.integers(len(distractor_instructions))]
            p, d = 0.0, 0.0
        elif name == "same":
            i = j
            p = 0.0
        earlier.append(ep.frames[i])
        later.append(ep.frames[j])
        instr.append(text)
        prog.append(p)
        done.append(d)
    return PairBatch(torch.stack(earlier), torch.stack(later), instr, torch.tensor(prog, dtype=torch.float32),
                     torch.tensor(done, dtype=torch.float32), torch.as_tensor(kinds, dtype=torch.long))
