"""Residual steering (``policy=noise_steering policy.steer=residual``, ``algorithm=dsrl``): the actor's latent is an
additive correction to the frozen base's own chunk (from the zero noise), clamped to the env's box. The decode, the
untrained policy equal to the base, the refusals, and through the real ActorWorker a bandit whose best chunk lies
outside what the base's noise can reach but inside the residual box."""

from dataclasses import replace

import pytest
import torch

from policies.base import Policy
from policies.registry import make_policy
from tests.algorithms import test_dsrl
from tests.algorithms.test_dsrl import SMALL, SPEC, B, D, T, _cfg, _obs
from tests.helpers.chunk_bandit import one_step_trajectory
from vlarl.workers.actor_worker import ActorWorker

torch.set_num_threads(1)


base_dir = test_dsrl.base_dir  # the same saved tiny diffusion base (a module-scoped fixture)


def _residual(base_dir, **kw):
    return replace(_cfg(base_dir), steer="residual", **kw)


def test_the_residual_is_added_to_the_base_s_chunk_and_clamped(base_dir):
    torch.manual_seed(0)
    policy = make_policy(_residual(base_dir, residual_bound=0.5), SPEC)
    assert policy.noise_spec.action_dim == SPEC.action_dim and policy.noise_spec.action_high == [0.5]
    state = torch.rand(6, D) * 2 - 1
    base = Policy.from_pretrained(base_dir)
    own = base.act(_obs(state), noise=torch.zeros(6, *policy.noise_shape))
    w = torch.full((6, T, SPEC.action_dim), 0.3)
    assert torch.allclose(policy.decode(_obs(state), w), (own + 0.3).clamp(-1, 1), atol=1e-6)
    assert policy.decode(_obs(state), torch.full_like(w, 5.0)).max() <= 1.0  # the env's box, whatever the latent
    # untrained: zero mean residual, so act() is the base's own
    assert torch.allclose(policy.act(_obs(state)), base.act(_obs(state)), atol=1e-5)
    s = policy.sample(_obs(state))
    assert s.replay["noise"].abs().max() <= 0.5
    assert torch.allclose(s.actions, policy.decode(_obs(state), s.replay["noise"]), atol=1e-6)


def test_bad_settings_are_refused(base_dir):
    with pytest.raises(ValueError, match="policy.steer='sideways' is unknown"):
        make_policy(replace(_cfg(base_dir), steer="sideways"), SPEC)
    with pytest.raises(ValueError, match="policy.residual_bound=0"):
        make_policy(_residual(base_dir, residual_bound=0.0), SPEC)


def test_dsrl_learns_the_residual_that_moves_the_base_to_the_best_chunk(base_dir):
    """The best chunk is the base's own moved 0.4 towards the centre of the box on every action (no clamping):
    SAC on the residual, through the real ActorWorker, closes most of that gap; the base stays bit-identical."""
    torch.manual_seed(0)
    state = torch.linspace(-1, 1, 21)[:, None].expand(-1, D).contiguous()
    base = Policy.from_pretrained(base_dir)

    def reward(obs_state, actions):
        own = base.act(_obs(obs_state), noise=torch.zeros(actions.shape[0], T, SPEC.action_dim))
        return 1 - ((actions - (own - 0.4 * own.sign())) ** 2).sum(-1)  # [B, T]

    actor = ActorWorker(_residual(base_dir), replace(SMALL, utd_ratio=0.5), SPEC, seed=0)
    policy = actor.policy
    frozen = policy.base_state_dict()
    start = float(reward(state, policy.act(_obs(state))).mean())
    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        s = torch.rand(B, D, generator=g) * 2 - 1
        sample = policy.sample(_obs(s))
        actor.train(one_step_trajectory(s, sample, reward(s, sample.actions), ["push"]))
    end = float(reward(state, policy.act(_obs(state))).mean())
    assert start < 0.86 and end > start + 0.7 * (1 - start), (start, end)
    assert all(torch.equal(v, policy.base.state_dict()[k]) for k, v in frozen.items())
