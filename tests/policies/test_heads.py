"""RL heads (policies/heads): each samples, re-scores its own samples exactly and gives the entropy, from network
outputs a test makes up (the families' own tests drive them through their networks)."""

from __future__ import annotations

import math

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler

from policies.heads.categorical import MASKED, TokenCategoricalHead
from policies.heads.diffusion import DiffusionChainHead
from policies.heads.gaussian import GaussianChunkHead, gaussian_entropy, gaussian_logprob


@pytest.mark.parametrize("squash", [False, True])
def test_gaussian_head_rescores_its_samples_and_squashes_into_the_box(squash):
    torch.manual_seed(0)
    mean, log_std = torch.randn(4, 3, 2), torch.full((3, 2), -0.5)
    low, high = torch.tensor([-1.0, 0.0]), torch.tensor([1.0, 2.0])
    head = GaussianChunkHead(squash=squash)
    actions, logprob, replay = head.sample(mean, log_std, low, high)
    lp, ent = head.evaluate(mean, log_std, replay, low, high)
    torch.testing.assert_close(lp, logprob)
    torch.testing.assert_close(ent, 0.5 + 0.5 * math.log(2 * math.pi) + log_std.expand_as(mean))
    if squash:  # tanh into the box; the log-prob carries the change of variables
        assert ((actions > low) & (actions < high)).all() and set(replay) == {"actions", "pre_tanh"}
        u = replay["pre_tanh"]
        plain = torch.distributions.Normal(mean, log_std.exp()).log_prob(u)
        jac = torch.log((high - low) / 2 * (1 - torch.tanh(u) ** 2))
        torch.testing.assert_close(lp, plain - jac, atol=1e-4, rtol=1e-4)
    else:
        assert torch.equal(actions, replay["actions"])
    mean.requires_grad_(True)
    a, lp = head.rsample(mean, log_std, low, high)
    (a.sum() + lp.sum()).backward()
    assert mean.grad is not None and mean.grad.abs().sum() > 0
    assert torch.equal(head.mode(mean.detach(), low, high), actions.new_tensor(
        low + (high - low) / 2 * (torch.tanh(mean.detach()) + 1) if squash else mean.detach()))
    floored = GaussianChunkHead(min_log_std=-1.0).dist(mean, torch.full((3, 2), -9.0))
    assert torch.allclose(floored.stddev, torch.full_like(floored.stddev, math.exp(-1.0)))


def test_gaussian_helpers_match_torch():
    x, mean, std = torch.randn(5), torch.randn(5), torch.rand(5) + 0.1
    dist = torch.distributions.Normal(mean, std)
    torch.testing.assert_close(gaussian_logprob(x, mean, std), dist.log_prob(x))
    torch.testing.assert_close(gaussian_entropy(std), dist.entropy())


def test_token_head_tempers_cuts_to_top_k_and_rescores():
    torch.manual_seed(1)
    logits = torch.randn(2, 6, 10)
    head = TokenCategoricalHead(temperature=0.5, top_k=3)
    logp = head.log_probs(logits)
    kept = logp > MASKED / 2
    assert (kept.sum(-1) == 3).all()
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(2, 6))
    torch.testing.assert_close(logp[kept], (logits / 0.5).masked_fill(~kept, -math.inf).log_softmax(-1)[kept])
    tokens = head.draw(logp)
    assert tokens.shape == (2, 6) and kept.gather(-1, tokens[..., None]).all()  # never a masked token
    lp, ent = head.score(logp, tokens)
    torch.testing.assert_close(lp, logp.gather(-1, tokens[..., None]).squeeze(-1))
    assert (ent >= 0).all() and (ent <= math.log(3) + 1e-5).all()
    assert torch.equal(head.draw(logp, greedy=True), logits.argmax(-1))


@pytest.mark.parametrize("scheduler", [DDIMScheduler, DDPMScheduler])
def test_diffusion_head_rescores_its_chain(scheduler):
    torch.manual_seed(2)
    sch = scheduler(num_train_timesteps=50, beta_schedule="squaredcos_cap_v2", clip_sample=True)
    sch.set_timesteps(5)
    head = DiffusionChainHead(sch, rl_steps=2, ddim_eta=1.0, min_std=0.1)
    assert head.flags() == [False, False, False, True, True] and head.n_rl == 2
    w = torch.randn(2, 2) * 0.1

    def denoise(x, t):
        return x @ w + t / 50.0

    x, logprob, chain = head.sample(denoise, torch.randn(3, 4, 2))
    assert chain.shape == (3, 6, 4, 2) and torch.equal(chain[:, -1], x)
    lp, ent = head.evaluate(denoise, chain)
    torch.testing.assert_close(lp, logprob, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(ent).all()
    mean, std = head.step(denoise(chain[:, 0], head.timesteps[0]), head.timesteps[0], chain[:, 0], False)
    assert torch.equal(mean, chain[:, 1]) and float(std) == 0.0  # the deterministic steps follow the mean
