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

Grounded (``grounded=True``, OFT+ only): a task whose words name one of several things in the scene
(``simulators.base.GroundedTask``: the language task's red or blue goal) labels its frames with where the named thing
is, and the towers learn to say it from the frame *and the words*: the FiLM maps start at zero as above but train
here, fed the frame's own instruction the way the policy feeds it (the average of the language model's input
embeddings, which train here too; keep both through SFT and RL with ``policy.freeze_film=true
policy.freeze_embeddings=true``). A VLM's grounding
pretraining gives its features "where is the red goal" the same way; without it the tiny OFT never bound the colour
word to the goal's side from demonstrations (docs/vla_pixels.md). The record says how well the words are read:
the grounded targets' validation R^2 with each frame's own words, and with other words of the task (the other
goal's: a tower that reads them points the other way, far below 0).

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
    (the scene state of the same instant), ``episodes`` (scenes drawn); ``words`` (each frame's instruction) and
    ``grounding`` float32 [N, K] (where its words point, a NaN row where its task names nothing) when the env has
    them."""

    images: torch.Tensor
    states: torch.Tensor
    episodes: int
    words: list[str] | None = None
    grounding: torch.Tensor | None = None


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
    from simulators.base import ReportsGrounding

    def labels(o: dict[str, Any]) -> tuple[list[str], np.ndarray | None]:
        """The frames' instructions and where their words point (None from an env that does not say)."""
        where = env.grounding_targets() if isinstance(env, ReportsGrounding) else None
        return list(o.get("instruction") or [""] * env.num_envs), where

    images, states, episodes = [obs["images"][camera]], [obs["critic_state"]], env.num_envs
    w, g = labels(obs)
    words, grounding = [w], [g]
    kept = env.num_envs
    while kept < frames:
        a = (torch.rand(env.num_envs, 1, env.spec.action_dim, generator=gen) * 2 - 1).expand(-1, chunk, -1)
        res = env.chunk_step(a.contiguous())
        images.append(res.obs["images"][camera])
        states.append(res.obs["critic_state"])
        w, g = labels(res.obs)
        words.append(w)
        grounding.append(g)
        episodes += int(np.asarray(res.done).sum())
        kept += env.num_envs
        if log is not None:
            log(kept)
    im = torch.as_tensor(np.concatenate([np.asarray(i) for i in images]))[:frames]
    st = torch.as_tensor(np.concatenate([np.asarray(s, dtype=np.float32) for s in states]))[:frames]
    gr = None if any(g is None for g in grounding) else torch.as_tensor(np.concatenate(grounding))[:frames]
    return Frames(im, st, episodes, words=[x for w in words for x in w][:frames], grounding=gr)


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


def _grounding_targets(data: Frames) -> tuple[torch.Tensor, torch.Tensor]:
    """(standardized grounding targets [N, K], 0 where a frame has none; mask [N] of the frames that have them)."""
    if data.grounding is None or data.words is None:
        raise ValueError("grounded pretraining needs frames of a task whose words name a thing in the scene "
                         "(simulators.base.GroundedTask, e.g. env.tasks with PushCubeToColor-v1); these have none")
    g = data.grounding.float()
    has = torch.isfinite(g).all(1)
    if int(has.sum()) < 2:
        raise ValueError("fewer than 2 frames come from a grounded task: add PushCubeToColor-v1 to env.tasks or "
                         "collect more frames")
    mean, std = g[has].mean(0), g[has].std(0).clamp_min(MIN_STD)
    return torch.where(has[:, None], (g - mean) / std, torch.zeros_like(g)), has


def pretrain_towers(policy: Any, data: Frames, epochs: int, batch_size: int = 64, lr: float = 1e-3,
                    val_frac: float = 0.1, seed: int = 0, grounded: bool = False,
                    log: Callable[[int, float, float], None] | None = None) -> dict[str, Any]:
    """Train ``policy``'s vision backbone (in place) with a throw-away head to predict the frames' scene states,
    and with ``grounded`` (FiLM towers) also where each frame's words point, from the frame and its words (module
    doc). Returns the record: frames, targets (varying dims), the validation R^2 (mean and per target dim) before
    and after, the loss per epoch, wall seconds; grounded, also the grounding R^2 with the frames' own words and
    with other words. ``log(epoch, train_loss, val_r2)`` after each epoch."""
    check_supported(policy)
    t0 = time.time()
    backbone = policy.model.vision_backbone
    if grounded and not backbone.film:
        raise ValueError("grounded pretraining teaches the FiLM maps to read the words: build the policy with "
                         "+policy.arch.use_film=true (OFT+)")
    mean, std = data.states.mean(0), data.states.std(0)
    keep = std > MIN_STD
    if not bool(keep.any()):
        raise ValueError("every scene-state dim is constant over the frames: nothing to learn where things are")
    y = (data.states[:, keep] - mean[keep]) / std[keep]
    n_state = y.shape[1]
    if grounded:
        g, has = _grounding_targets(data)
        y = torch.cat([y, g], 1)
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(y), generator=gen)
    n_val = max(1, int(round(val_frac * len(y))))
    val, train = perm[:n_val], perm[n_val:]
    torch.manual_seed(seed)
    head = StateHead(backbone.num_patches, backbone.embed_dim, y.shape[1])
    # this stage trains the towers even where the policy's config freezes them for SFT and RL
    # (policy.freeze_vision=true: the pretrained features are then kept as they are)
    flags = [(p, p.requires_grad) for p in backbone.parameters()]
    film = backbone.film_parameters()
    with torch.no_grad():  # FiLM starts as the identity for any words
        for p in film:
            p.zero_()
    # plain: the maps stay the identity and SFT learns the modulation; grounded: they learn it here, and the input
    # embeddings learn with them: at their random start the two colour words move the prompt's average by a tenth
    # of its norm, too little for the maps to tell them apart (the rest of the language model is not trained)
    table = policy.model.language_model.get_input_embeddings().weight
    flags.append((table, table.requires_grad))
    trained = [p for p in backbone.parameters() if grounded or all(p is not f for f in film)]
    trained += [table] if grounded else []
    for p in trained:
        p.requires_grad_(True)
    opt = torch.optim.Adam([*trained, *head.parameters()], lr=lr)

    camera = policy.spec.image_keys[0]  # read through the policy's own image path (conventions, size, statistics)

    def language(words: list[str]) -> torch.Tensor:
        """FiLM's input for these instructions as the policy computes it (its prompt, its input embeddings)."""
        ids, mask = policy._text(words, len(words))
        return policy.model.film_language(policy.model.language_model.get_input_embeddings()(ids), mask)

    def predict(idx: torch.Tensor, words: list[str] | None = None) -> torch.Tensor:
        pixels = policy.pixel_inputs({"images": {camera: data.images[idx]}})
        if not backbone.film:
            lang = None
        elif grounded:
            lang = language(words if words is not None else [data.words[int(i)] for i in idx])
        else:  # any words: FiLM is zero
            lang = pixels.new_zeros(len(idx), backbone.film_dim)
        return head(backbone(pixels, lang).float())

    def loss_of(pred: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(pred[:, :n_state], y[idx, :n_state])
        if grounded and bool(has[idx].any()):  # the words' targets weigh as much as all the scene state together
            loss = loss + F.mse_loss(pred[has[idx], n_state:], y[idx][has[idx], n_state:])
        return loss

    def val_pred(words: list[str] | None = None) -> torch.Tensor:
        backbone.eval()
        with torch.no_grad():
            got = torch.cat([predict(val[i:i + 256], None if words is None else words[i:i + 256])
                             for i in range(0, len(val), 256)])
        backbone.train()
        return got

    def val_r2() -> torch.Tensor:
        return r2(val_pred()[:, :n_state], y[val, :n_state])

    def grounding_r2(words: list[str] | None = None) -> float:
        sel = has[val]
        return float(r2(val_pred(words)[sel, n_state:], y[val][sel, n_state:]).mean()) if bool(sel.any()) else math.nan

    before = after = val_r2()
    ground_before = grounding_r2() if grounded else None
    losses: list[float] = []
    backbone.train()
    for epoch in range(epochs):
        order = train[torch.randperm(len(train), generator=gen)]
        total, n = 0.0, 0
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            loss = loss_of(predict(idx), idx)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total, n = total + float(loss.detach()) * len(idx), n + len(idx)
        losses.append(total / max(n, 1))
        after = val_r2()
        if log is not None:
            log(epoch, losses[-1], float(after.mean()))
    record: dict[str, Any] = {}
    if grounded:
        # the same frames, each with another grounded frame's words that differ from its own (the language task:
        # the other goal's): a tower that reads them points the other way
        pool = sorted({data.words[int(i)] for i in torch.nonzero(has).flatten()})
        words = []
        for i, h in zip(val.tolist(), has[val].tolist(), strict=True):
            others = [w for w in pool if w != data.words[i]]
            words.append(others[int(torch.randint(len(others), (1,), generator=gen))] if h and others
                         else data.words[i])
        record = {"grounded": True, "grounding_dims": int(y.shape[1] - n_state),
                  "grounding_frames": int(has.sum()), "grounding_r2_before": ground_before,
                  "grounding_r2_after": grounding_r2(), "grounding_r2_other_words": grounding_r2(words)}
    backbone.eval()
    for p, flag in flags:
        p.requires_grad_(flag)
    if not all(math.isfinite(x) for x in losses):
        raise FloatingPointError(f"vision pretraining diverged (losses {losses[-3:]}); lower the lr")
    return {"frames": len(y), "episodes": data.episodes, "val_frames": n_val, "targets": n_state,
            "state_dims": int(keep.numel()), "target_dims": keep.nonzero().flatten().tolist(),
            "val_r2_before": float(before.mean()), "val_r2_after": float(after.mean()),
            "val_r2_per_dim": [round(float(v), 4) for v in after], "film_zeroed": len(film), "loss": losses,
            "epochs": epochs, "lr": lr, "batch_size": batch_size, "wall_s": time.time() - t0, **record}
