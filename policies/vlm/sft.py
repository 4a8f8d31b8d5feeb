"""Supervised fine-tuning from demonstrations: ManiSkill HDF5 trajectories -> chunked (obs, actions).

RL starts from an SFT'd policy. Every VLA family exposes ``sft_loss(obs, actions [B, T, A])`` (token
cross-entropy, flow matching, denoising); this module turns demonstrations into those batches.

ManiSkill's ``trajectory.h5`` layout (what ``mani_skill`` record/replay tools write): one group per
episode ``traj_<i>`` with ``actions [L, A]`` and ``obs`` ``[L + 1, D]`` for ``obs_mode=state`` (the
final observation after the last action is included). The instruction is not stored; pass it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from policies.vlm.episode import Episode


def read_maniskill_h5(path: str | os.PathLike, max_episodes: int | None = None) -> list[Episode]:
    """Episodes of a ManiSkill state-observation trajectory file, in ``traj_<i>`` order."""
    import h5py

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"demonstration file '{p}' does not exist; pass a ManiSkill trajectory .h5")
    episodes = []
    with h5py.File(p, "r") as f:
        names = sorted((k for k in f if k.startswith("traj_")), key=lambda k: int(k.split("_")[1]))
        if not names:
            raise ValueError(f"'{p}' has no traj_<i> groups; is it a ManiSkill trajectory file?")
        for name in names[:max_episodes]:
            g = f[name]
            if not isinstance(g.get("obs"), h5py.Dataset):
                raise ValueError(f"'{p}'/{name}/obs is not an array; record demonstrations with obs_mode=state")
            actions = np.asarray(g["actions"], dtype=np.float32)
            obs = np.asarray(g["obs"], dtype=np.float32)
            episodes.append(Episode(state=obs[: len(actions)], actions=actions))
    return episodes


def read_demonstrations(path: str | os.PathLike, max_episodes: int | None = None, **kw: Any) -> list[Episode]:
    """A LeRobot v3.0 dataset folder (``meta/info.json``) or a ManiSkill trajectory ``.h5`` -> episodes;
    ``kw`` goes to ``policies.vlm.lerobot_dataset.read_lerobot_dataset`` (cameras, state_key, ...)."""
    p = Path(path)
    if (p / "meta" / "info.json").is_file():
        from policies.vlm.lerobot_dataset import read_lerobot_dataset

        return read_lerobot_dataset(p, max_episodes=max_episodes, **kw)
    if p.is_file() and p.suffix in (".h5", ".hdf5"):
        return read_maniskill_h5(p, max_episodes)
    raise FileNotFoundError(f"'{p}' is neither a LeRobot dataset directory (with meta/info.json) nor a ManiSkill "
                            f"trajectory .h5 file; pass one of those")


def action_chunks(actions: torch.Tensor, chunk: int) -> torch.Tensor:
    """[L, A] -> [L, chunk, A]: the next ``chunk`` actions from every step, padded with the last one."""
    L = actions.shape[0]
    idx = (torch.arange(L)[:, None] + torch.arange(chunk)[None]).clamp(max=L - 1)
    return actions[idx]


def demonstration_batches(episodes: list[Episode], chunk: int, batch_size: int, instruction: str,
                          generator: torch.Generator | None = None):
    """Shuffled (obs, actions [B, chunk, A]) batches over all steps of all episodes (state obs, no images)."""
    states = torch.cat([torch.from_numpy(e.state) for e in episodes])
    chunks = torch.cat([action_chunks(torch.from_numpy(e.actions), chunk) for e in episodes])
    perm = torch.randperm(states.shape[0], generator=generator)
    for start in range(0, len(perm), batch_size):
        idx = perm[start : start + batch_size]
        obs = {"state": states[idx], "images": {}, "instruction": [instruction] * len(idx)}
        yield obs, chunks[idx]


def sft_epoch(policy: Any, optimizer: torch.optim.Optimizer, episodes: list[Episode], batch_size: int,
              instruction: str, generator: torch.Generator | None = None) -> float:
    """One pass of ``policy.sft_loss`` over the demonstrations; returns the mean loss."""
    losses = []
    for obs, actions in demonstration_batches(episodes, policy.chunk_size, batch_size, instruction, generator):
        loss = policy.sft_loss(obs, actions)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return sum(losses) / max(len(losses), 1)


def fit_state_normalization(policy: Any, episodes: list[Episode]) -> None:
    """Fold every demonstration state into the policy's running state normalizer before SFT, so the
    policy is trained (and later fine-tuned by RL) with the statistics it is saved with."""
    states = torch.cat([torch.from_numpy(e.state) for e in episodes])
    norm = getattr(policy, "state_norm", None)  # VLA families (whose RL may hold it fixed: freeze_state_norm)
    if norm is not None:
        norm.update(states.to(norm.mean.device))
    else:
        policy.update_normalization({"state": states})


def sft_train(policy: Any, episodes: list[Episode], epochs: int, batch_size: int, lr: float, instruction: str,
              seed: int = 0, log=None) -> list[float]:
    """Normalization from the demonstrations, then ``epochs`` of ``sft_epoch`` with Adam; mean loss per epoch."""
    if not episodes:
        raise ValueError("no demonstration episodes to fine-tune on; record some first")
    fit_state_normalization(policy, episodes)
    policy.train()
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=lr)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for epoch in range(epochs):
        losses.append(sft_epoch(policy, optimizer, episodes, batch_size, instruction, generator))
        if log is not None:
            log(epoch, losses[-1])
    policy.eval()
    return losses
