"""Teach a tiny VLA's vision towers where things are before it imitates: regress the simulator's scene state from
the camera frame.

A published VLA starts RL with vision towers pretrained on the web: their features already say where the cube and
the goal are, and RL tunes what the model does with them. The tiny exact models vlarl trains on CPU start from
random towers (the tiny OpenVLA-OFT: two ViTs of width 16 and 24 on a 32 px view) and learn to see only from the
few demonstrations SFT shows them; PPO from such a start did not gain on PushCube from pixels in 132k env steps
(docs/vla_pixels.md). This stage gives the towers a domain pretraining in place of the web one: frames of the task
with the arm moving at random, each labelled with the scene state the simulator holds for it (the env's
``obs["critic_state"]``: every actor's pose and velocity and the robot's joints), and the towers plus a small
head trained to predict that state (each varying dimension standardized) from the frame. The head is thrown away;
the policy is saved with the pretrained towers and the demonstrations' state statistics, ready for SFT to go on
training it (``scripts/multitask_sft_rl.py --sft-from``). Built with ``policy.freeze_vision=true`` the towers are
still trained here and the saved policy keeps them frozen through SFT and RL.

Towers with FiLM (``policy.arch.use_film=true``, OFT+: the words scale and shift every block's features) are
pretrained as plain towers: their FiLM maps are set to zero, which makes each FiLM the identity for any words, and
left out of this stage, so SFT starts from exactly the pretrained features and learns how the words should modulate
them (with ``policy.freeze_vision=true`` SFT and RL train the FiLM maps only, as OFT+ does).

Only the policy's own image path is used (``pixel_inputs``: its camera, image conventions, size and statistics), so
what the towers learn is what they see in RL. The OpenVLA family (OpenVLA, OpenVLA-OFT) is supported; others are
refused in one line.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

#: a dimension of the scene state whose std over the frames is below this is constant (a fixed actor) and not a target
MIN_STD = 1e-4


@dataclass
class Frames:
    """What ``collect_frames`` gathered: ``images`` uint8 [N, H, W, 3] (the policy's camera), ``states`` float32 [N, C]
    (the scene state of the same instant), ``episodes`` (scenes drawn)."""

    images: torch.Tensor
    states: torch.Tensor
    episodes: int


def check_supported(policy: Any) -> None:
    from policies.ar_vla.openvla_policy import OpenVLAPolicy

    if not isinstance(policy, OpenVLAPolicy):
        raise ValueError(f"vision pretraining reads the OpenVLA family's towers (policy=openvla, openvla_oft); "
                         f"{type(policy).__name__} has its own vision path: leave this stage out for it")
    if not policy.spec.image_keys:
        raise ValueError("the policy reads no camera (a state-only env): there is nothing to pretrain")
    if policy.cfg.num_images > 1:
        raise ValueError(f"the policy reads {policy.cfg.num_images} cameras; vision pretraining collects one: "
                         f"pretrain a policy with policy.num_images=1")


def collect_frames(env: Any, camera: str, frames: int, chunk: int, seed: int,
                   log: Callable[[int], None] | None = None) -> Frames:
    """Step ``env`` (an env whose observations hold ``critic_state``) with random end-effector moves, each held for a
    chunk, and keep the frame of ``camera`` and the scene state after every chunk until ``frames`` are kept. Seeds
    count up from ``seed`` (keep them below the held-out 1,000,000)."""
    gen = torch.Generator().manual_seed(seed)
    obs = env.reset(seed=seed)
    if "critic_state" not in obs:
        raise ValueError("the env reports no obs['critic_state'] (the scene state to regress): set env.critic_state=true")
    images, states, episodes = [obs["images"][camera]], [obs["critic_state"]], env.num_envs
    kept = env.num_envs
    while kept < frames:
        a = (torch.rand(env.num_envs, 1, env.spec.action_dim, generator=gen) * 2 - 1).expand(-1, chunk, -1)
        res = env.chunk_step(a.contiguous())
        images.append(res.obs["images"][camera])
        states.append(res.obs["critic_state"])
        episodes += int(np.asarray(res.done).sum())
        kept += env.num_envs
        if log is not None:
            log(kept)
    im = torch.as_tensor(np.concatenate([np.asarray(i) for i in images]))[:frames]
    st = torch.as_tensor(np.concatenate([np.asarray(s, dtype=np.float32) for s in states]))[:frames]
    return Frames(im, st, episodes)


class StateHead(nn.Module):
    """Patch features [B, N, D] -> the standardized varying scene-state dims [B, K]."""

    def __init__(self, patches: int, dim: int, out: int, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(patches * dim, hidden), nn.GELU(), nn.Linear(hidden, out))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features)


def r2(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-dimension R^2 [K] of targets standardized over all frames: 1 - mean squared error (their variance is 1,
    so a few validation frames whose own spread is small do not blow it up)."""
    return 1 - ((pred - target) ** 2).mean(0)


def pretrain_towers(policy: Any, data: Frames, epochs: int, batch_size: int = 64, lr: float = 1e-3,
                    val_frac: float = 0.1, seed: int = 0,
                    log: Callable[[int, float, float], None] | None = None) -> dict[str, Any]:
    """Train ``policy``'s vision backbone (in place) with a throw-away head to predict the frames' scene states.
    Returns the record: frames, targets (varying dims), the validation R^2 (mean and per target dim) before and
    after, the loss per epoch, wall seconds. ``log(epoch, train_loss, val_r2)`` after each epoch."""
    check_supported(policy)
    t0 = time.time()
    mean, std = data.states.mean(0), data.states.std(0)
    keep = std > MIN_STD
    if not bool(keep.any()):
        raise ValueError("every scene-state dim is constant over the frames: nothing to learn where things are")
    y = (data.states[:, keep] - mean[keep]) / std[keep]
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(y), generator=gen)
    n_val = max(1, int(round(val_frac * len(y))))
    val, train = perm[:n_val], perm[n_val:]
    backbone = policy.model.vision_backbone
    torch.manual_seed(seed)
    head = StateHead(backbone.num_patches, backbone.embed_dim, int(keep.sum()))
    # this stage trains the towers even where the policy's config freezes them for SFT and RL
    # (policy.freeze_vision=true: the pretrained features are then kept as they are)
    flags = [(p, p.requires_grad) for p in backbone.parameters()]
    film = backbone.film_parameters()
    with torch.no_grad():  # FiLM as the identity for any words: SFT learns the modulation from these features
        for p in film:
            p.zero_()
    trained = [p for p in backbone.parameters() if all(p is not f for f in film)]
    for p in trained:
        p.requires_grad_(True)
    opt = torch.optim.Adam([*trained, *head.parameters()], lr=lr)

    camera = policy.spec.image_keys[0]  # read through the policy's own image path (conventions, size, statistics)

    def predict(idx: torch.Tensor) -> torch.Tensor:
        pixels = policy.pixel_inputs({"images": {camera: data.images[idx]}})
        words = pixels.new_zeros(len(idx), backbone.film_dim) if backbone.film else None  # any words: FiLM is zero
        return head(backbone(pixels, words).float())

    def val_r2() -> torch.Tensor:
        backbone.eval()
        with torch.no_grad():
            got = torch.cat([predict(val[i:i + 256]) for i in range(0, len(val), 256)])
        backbone.train()
        return r2(got, y[val])

    before = after = val_r2()
    losses: list[float] = []
    backbone.train()
    for epoch in range(epochs):
        order = train[torch.randperm(len(train), generator=gen)]
        total, n = 0.0, 0
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            loss = F.mse_loss(predict(idx), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total, n = total + float(loss.detach()) * len(idx), n + len(idx)
        losses.append(total / max(n, 1))
        after = val_r2()
        if log is not None:
            log(epoch, losses[-1], float(after.mean()))
    backbone.eval()
    for p, flag in flags:
        p.requires_grad_(flag)
    if not all(math.isfinite(x) for x in losses):
        raise FloatingPointError(f"vision pretraining diverged (losses {losses[-3:]}); lower the lr")
    return {"frames": len(y), "episodes": data.episodes, "val_frames": n_val, "targets": int(keep.sum()),
            "state_dims": int(keep.numel()), "target_dims": keep.nonzero().flatten().tolist(),
            "val_r2_before": float(before.mean()), "val_r2_after": float(after.mean()),
            "val_r2_per_dim": [round(float(v), 4) for v in after], "film_zeroed": len(film), "loss": losses, "epochs": epochs, "lr": lr,
            "batch_size": batch_size, "wall_s": time.time() - t0}
