"""The pixel RLPD knobs of the PushCube-RGB recipe: DrQ's random shift (``vlarl.algorithms.image_aug``,
``algorithm.image_shift``) and a critic encoder shared with the CNN actor whose gradient stops there
(``policy.critic_shares_encoder``). Each test fails if its knob does nothing."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from policies.cnn.modeling import CNNPolicy
from policies.mlp import MLPPolicy, MLPPolicyConfig
from tests.algorithms.test_sac_pixels import CAM, SMALL, SPEC, TINY, bandit_traj, right_sign_fraction
from vlarl.algorithms.image_aug import random_shift, shift_batch
from vlarl.algorithms.sac import (
    SACState,
    actor_problem,
    actor_step,
    critic_step,
    frozen,
    sac_update,
    soft_steps,
    validate_sac,
)

torch.set_num_threads(1)


def coordinate_frames(n: int, size: int) -> torch.Tensor:
    """uint8 [n, size, size, 3]: channel 0 the row's index, channel 1 the pixel's row, channel 2 its column, so a
    frame tells where each of its pixels came from."""
    ij = torch.stack(torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij"), -1)  # [S, S, 2]
    rows = torch.arange(n)[:, None, None, None].expand(n, size, size, 1)
    return torch.cat([rows, ij[None].expand(n, -1, -1, -1)], -1).to(torch.uint8)


def offsets(frames: torch.Tensor) -> torch.Tensor:
    """The (row, column) offset of each frame's centre pixel from where it came from: [n, 2]."""
    c = frames.shape[1] // 2
    return frames[:, c, c, 1:].long() - c


def test_random_shift_translates_each_frame_and_keeps_shape_and_dtype():
    x = coordinate_frames(64, 16)
    y = random_shift(x, 4, torch.Generator().manual_seed(0))
    assert y.shape == x.shape and y.dtype == torch.uint8
    assert torch.equal(y[..., 0], x[..., 0])  # every frame stays its own row
    d = offsets(y)
    assert d.abs().max() <= 4 and len({tuple(r) for r in d.tolist()}) > 20  # many different shifts in [-4, 4]
    # each frame is its source translated by its offset, the border pixels repeated (replicate padding)
    i = torch.arange(16)
    for k in range(64):
        rows, cols = (i + d[k, 0]).clamp(0, 15), (i + d[k, 1]).clamp(0, 15)
        assert torch.equal(y[k], x[k][rows][:, cols])
    assert random_shift(x, 0) is x
    assert not torch.equal(random_shift(x, 4, torch.Generator().manual_seed(1)), y)  # a fresh draw per call


def test_shift_batch_shifts_frames_and_next_frames_independently():
    from tensordict import TensorDict

    n, S = 32, 16
    frames = coordinate_frames(n, S)
    batch = TensorDict({"state": torch.randn(n, 2), "images": TensorDict({CAM: frames}, batch_size=[n]),
                        "next_images": TensorDict({CAM: frames.clone()}, batch_size=[n])}, batch_size=[n])
    out = shift_batch(batch, [CAM], 4, torch.Generator().manual_seed(0))
    assert torch.equal(out["state"], batch["state"]) and torch.equal(batch["images", CAM], frames)  # input kept
    a, b = offsets(out["images", CAM]), offsets(out["next_images", CAM])
    assert (a != 0).any() and (b != 0).any() and not torch.equal(a, b)
    assert shift_batch(batch, [CAM], 0) is batch and shift_batch(batch, [], 4) is batch


def test_image_shift_reaches_the_frames_the_critic_reads():
    seen = {}

    def frames_read(shift: int) -> torch.Tensor:
        torch.manual_seed(0)
        policy = CNNPolicy(TINY, SPEC)
        st = SACState(policy, replace(SMALL, image_shift=shift), SPEC)
        traj = bandit_traj(policy, torch.Generator().manual_seed(0))
        traj.obs["images"][CAM] = coordinate_frames(traj.num_envs, 16)[None]
        sac_update(policy, torch.optim.Adam(policy.parameters()), traj, replace(SMALL, learning_starts=10_000),
                   state=st)  # fill only

        def critic(batch):
            seen[shift] = batch["images", CAM]
            return {}

        soft_steps(policy, torch.optim.Adam(policy.parameters()), st, SMALL, 1, critic, actor_ready=lambda: False)
        return seen[shift]

    assert (offsets(frames_read(0)) == 0).all()
    d = offsets(frames_read(4))
    assert (d != 0).any(dim=1).float().mean() > 0.8 and d.abs().max() <= 4
    assert validate_sac(replace(SMALL, image_shift=-1), 4) == ("algorithm.image_shift=-1 must be >= 0 (pixels; "
                                                               "0 = no shift)")
    state_actor = MLPPolicy(MLPPolicyConfig(chunk_size=2, squash=True), replace(SPEC, image_keys=[], image_size=None))
    msg = actor_problem(state_actor, replace(SMALL, image_shift=4))
    assert msg == ("algorithm.image_shift=4 shifts camera frames but policy=mlp's critics read none: set "
                   "algorithm.image_shift=0, or use a pixel actor (policy=cnn)")
    assert actor_problem(state_actor, SMALL) is None


def test_shared_encoder_is_trained_by_the_critic_and_stopped_for_the_actor():
    torch.manual_seed(0)
    policy = CNNPolicy(replace(TINY, critic_shares_encoder=True), SPEC)
    st = SACState(policy, SMALL, SPEC)
    assert st.encoder.vision is policy.vision and st.encoder_target.vision is not policy.vision
    assert {id(p) for p in st.shared_params} == {id(p) for p in policy.vision.parameters()}
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    traj = bandit_traj(policy, g)
    sac_update(policy, opt, traj, replace(SMALL, learning_starts=10_000), state=st)  # fill only
    batch = st.replay.sample(16)
    vision = [p.detach().clone() for p in policy.vision.parameters()]
    head = [p.detach().clone() for p in policy.parameters() if all(p is not v for v in policy.vision.parameters())]
    actor_step(policy, opt, st, batch, SMALL)
    assert all(torch.equal(a, b) for a, b in zip(vision, policy.vision.parameters(), strict=True))
    moved = [not torch.equal(a, b) for a, b in zip(head, [p for p in policy.parameters() if all(
        p is not v for v in policy.vision.parameters())], strict=True)]
    assert any(moved)  # the actor's own layers learned
    assert all(p.requires_grad for p in policy.vision.parameters())  # put back after the actor step
    critic_step(policy, st, batch, SMALL, g)
    assert any(not torch.equal(a, b) for a, b in zip(vision, policy.vision.parameters(), strict=True))

    # without sharing the critic's encoder is its own: the critic step leaves the policy's vision as it was
    alone = CNNPolicy(TINY, SPEC)
    st2 = SACState(alone, SMALL, SPEC)
    assert st2.shared_params == [] and st2.encoder.vision is not alone.vision
    before = [p.detach().clone() for p in alone.vision.parameters()]
    critic_step(alone, st2, batch, SMALL, g)
    assert all(torch.equal(a, b) for a, b in zip(before, alone.vision.parameters(), strict=True))


def test_frozen_puts_requires_grad_back_after_an_error():
    p = torch.nn.Parameter(torch.ones(2))
    try:
        with frozen([p]):
            assert not p.requires_grad
            raise RuntimeError("inside")
    except RuntimeError:
        pass
    assert p.requires_grad


def test_pixel_sac_with_a_shared_shifted_encoder_learns_the_image_colour_bandit():
    """The bandit of test_sac_pixels (the best action's sign is the image's colour) learned through one encoder that
    only the critic loss trains, on shifted frames."""
    torch.manual_seed(0)
    policy = CNNPolicy(replace(TINY, critic_shares_encoder=True), SPEC)
    cfg = replace(SMALL, image_shift=2)
    st = SACState(policy, cfg, SPEC)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    g = torch.Generator().manual_seed(0)
    before = right_sign_fraction(policy, torch.Generator().manual_seed(1))
    for _ in range(15):
        metrics = sac_update(policy, opt, bandit_traj(policy, g), cfg, g, state=st)
    after = right_sign_fraction(policy, torch.Generator().manual_seed(1))
    assert math.isfinite(metrics["critic_loss"]) and after >= 0.9 > before, (before, after)
