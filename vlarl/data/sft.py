"""Supervised fine-tuning from demonstrations: episodes -> chunked (obs, actions) batches -> ``sft_loss``.

RL starts from an SFT'd policy. Every VLA family exposes ``sft_loss(obs, actions [B, T, A])`` (token
cross-entropy, flow matching, denoising); this module turns demonstrations into those batches. The readers
(ManiSkill HDF5, LeRobot v3.0) are in ``vlarl.data.demonstrations``; this module only needs their episodes'
``state [L, D]`` and ``actions [L, A]``. ``sft_and_save`` is what the experiment scripts run: SFT, then a
directory ``vlarl-eval`` and ``init_from=`` read (the policy and the env it was trained for).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from policies.episode import Episode


def action_chunks(actions: torch.Tensor, chunk: int) -> torch.Tensor:
    """[L, A] -> [L, chunk, A]: the next ``chunk`` actions from every step, padded with the last one."""
    L = actions.shape[0]
    idx = (torch.arange(L)[:, None] + torch.arange(chunk)[None]).clamp(max=L - 1)
    return actions[idx]


def demonstration_batches(episodes: list[Episode], chunk: int, batch_size: int, instruction: str,
                          generator: torch.Generator | None = None, cameras: tuple[str, ...] = ()):
    """Shuffled (obs, actions [B, chunk, A]) batches over all steps of all episodes. Each row's instruction is its
    episode's where the episode has one (a language or multi-task dataset's), else ``instruction``. ``cameras``:
    the cameras a pixel policy reads; each row then carries its step's frame of each, ``obs["images"][camera]``
    uint8 [B, H, W, 3] (the frame before the action, ``CameraEpisode.images`` / ``LeRobotEpisode.images``)."""
    states = torch.cat([torch.from_numpy(e.state) for e in episodes])
    texts = [e.instruction or instruction for e in episodes for _ in range(len(e.state))]
    chunks = torch.cat([action_chunks(torch.from_numpy(e.actions), chunk) for e in episodes])
    images = {c: torch.cat([torch.from_numpy(np.asarray(frames(e, c)[: len(e.state)])) for e in episodes])
              for c in cameras}
    perm = torch.randperm(states.shape[0], generator=generator)
    for start in range(0, len(perm), batch_size):
        idx = perm[start : start + batch_size]
        obs = {"state": states[idx], "images": {c: v[idx] for c, v in images.items()},
               "instruction": [texts[i] for i in idx.tolist()]}
        yield obs, chunks[idx]


def frames(episode: Any, camera: str) -> np.ndarray:
    """``episode``'s frames of ``camera`` (uint8 [L, H, W, 3]); one line naming the fix when it has none."""
    held = getattr(episode, "images", None) or {}
    if camera not in held:
        raise ValueError(f"the policy reads camera '{camera}' but a demonstration holds frames of {sorted(held)}; "
                         f"fine-tune on demonstrations with that camera's frames (vlarl-demos with an RGB env, or "
                         f"vlarl.multitask_demos for a multi-task env)")
    return held[camera]


def sft_epoch(policy: Any, optimizer: torch.optim.Optimizer, episodes: list[Episode], batch_size: int,
              instruction: str, generator: torch.Generator | None = None) -> float:
    """One pass of ``policy.sft_loss`` over the demonstrations (with the frames of every camera the policy reads);
    returns the mean loss."""
    losses = []
    cameras = tuple(policy.spec.image_keys)
    for obs, actions in demonstration_batches(episodes, policy.chunk_size, batch_size, instruction, generator,
                                              cameras):
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
              seed: int = 0, log=None, fit_normalization: bool = True) -> list[float]:
    """Normalization from the demonstrations (``fit_normalization``; off: a trained policy keeps its statistics),
    then ``epochs`` of ``sft_epoch`` with Adam; mean loss per epoch."""
    if not episodes:
        raise ValueError("no demonstration episodes to fine-tune on; record some first")
    failed = sum(getattr(e, "success", None) is False for e in episodes)
    if failed:  # imitation copies what it is shown: a failed episode would be learned as a way to act
        raise ValueError(f"{failed} of {len(episodes)} demonstration episodes failed; imitate the successful ones "
                         f"only (read_maniskill_h5(..., successful_only=True))")
    if fit_normalization:
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


def save_policy_dir(policy: Any, env_cfg: Any, out: str | Path) -> Path:
    """``policy.save_pretrained(out)`` plus the env config it was trained for (``vlarl.checkpoint.ENV_CONFIG_NAME``,
    which ``vlarl-eval checkpoint=<out>`` reads the env from); returns ``out``."""
    from vlarl.checkpoint import ENV_CONFIG_NAME

    out = Path(out)
    policy.save_pretrained(out)
    (out / ENV_CONFIG_NAME).write_text(json.dumps(asdict(env_cfg), indent=2))
    return out


def sft_and_save(policy: Any, episodes: list[Episode], env_cfg: Any, out: str | Path, epochs: int, batch_size: int,
                 lr: float, instruction: str, seed: int = 0, log: Callable[[int, float], None] | None = None,
                 fit_normalization: bool = True) -> dict[str, Any]:
    """``sft_train`` then ``save_policy_dir``: the SFT stage of an experiment script. Returns its record:
    ``episodes``, ``demo_steps`` (actions in them), ``epochs``, ``lr``, ``loss_first`` / ``loss_last`` (mean loss of
    the first and last epoch), ``wall_s``. ``log(epoch, loss)`` is called after each epoch."""
    t0 = time.time()
    losses = sft_train(policy, episodes, epochs, batch_size, lr, instruction, seed, log, fit_normalization)
    save_policy_dir(policy, env_cfg, out)
    return {"episodes": len(episodes), "demo_steps": sum(len(e.actions) for e in episodes), "epochs": epochs,
            "lr": lr, "loss_first": losses[0], "loss_last": losses[-1], "wall_s": time.time() - t0}
