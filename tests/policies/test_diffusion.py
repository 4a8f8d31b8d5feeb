"""Diffusion policy with diffusers DDIM/DDPM: DPPO step likelihoods, deterministic DDIM, I/O, SFT, PPO."""

from __future__ import annotations

import pytest
import torch
from vla_helpers import assert_ppo_changes_weights

from policies import make_policy
from policies.diffusion import DiffusionPolicy, DiffusionPolicyConfig
from policies.vlm import BackboneConfig
from tests.helpers.vla_checks import assert_noise_sft_loss_halves, assert_rescored_with_gradients


def _policy(spec, scheduler="ddim", **kw) -> DiffusionPolicy:
    kw.setdefault("backbone", BackboneConfig(kind="siglip_llama"))
    return make_policy(DiffusionPolicyConfig(scheduler=scheduler, chunk_size=2, **kw), spec)


@pytest.mark.parametrize("scheduler,rl_steps", [("ddim", 0), ("ddpm", 2)])
def test_sample_evaluate_consistency_and_gradients(vla_spec, obs, scheduler, rl_steps):
    pol = _policy(vla_spec, scheduler, rl_steps=rl_steps)
    s = pol.sample(obs)
    K = pol.config.num_inference_steps
    assert s.actions.shape == s.logprob.shape == (3, 2, 3) and s.replay["chain"].shape == (3, K + 1, 2, 3)
    assert_rescored_with_gradients(pol, obs, s)


def test_step_likelihood_is_the_schedulers_gaussian_with_a_std_floor(vla_spec, obs):
    pol = _policy(vla_spec, "ddpm", rl_steps=1, min_std=0.1)
    s = pol.sample(obs)
    chain = s.replay["chain"]
    t = pol.timesteps[-1]
    memory, pad, _ = pol.context(obs)
    with torch.no_grad():
        eps, _ = pol.expert(chain[:, -2], torch.full((3,), float(t)), memory, pad)
        mean, std = pol._step(eps, t, chain[:, -2], True)
    sch_std = pol.noise_scheduler._get_variance(t) ** 0.5
    torch.testing.assert_close(std, torch.clamp(sch_std, min=0.1).float())
    ref = torch.distributions.Normal(mean, std).log_prob(chain[:, -1])
    torch.testing.assert_close(s.logprob, ref, atol=1e-5, rtol=0)
    # earlier steps were the deterministic posterior mean
    with torch.no_grad():
        t0 = pol.timesteps[0]
        eps0, _ = pol.expert(chain[:, 0], torch.full((3,), float(t0)), memory, pad)
        torch.testing.assert_close(pol._step(eps0, t0, chain[:, 0], False)[0], chain[:, 1], atol=1e-5, rtol=0)


def test_deterministic_ddim_matches_diffusers_eta0_and_round_trips(vla_spec, obs, tmp_path):
    pol = _policy(vla_spec, "ddim")
    a = pol.act(obs)
    assert torch.equal(a, pol.act(obs))
    x = torch.zeros(3, 2, 3)  # the same chain through diffusers' own DDIM step (eta = 0)
    memory, pad, _ = pol.context(obs)
    with torch.no_grad():
        for t in pol.timesteps:
            eps, _ = pol.expert(x, torch.full((3,), float(t)), memory, pad)
            x = pol.noise_scheduler.step(eps, t, x, eta=0.0).prev_sample
    torch.testing.assert_close(pol.unnormalize_actions(x), a, atol=1e-6, rtol=0)
    loaded = DiffusionPolicy.from_pretrained(pol.save_pretrained(tmp_path / "ckpt"))
    assert torch.equal(loaded.act(obs), a)


def test_sft_denoising_loss_decreases(vla_spec, obs):
    pol = _policy(vla_spec)
    target = torch.tensor([[0.5, -1.0, 0.8]]).expand(3, 2, 3)
    assert_noise_sft_loss_halves(pol, obs, target)


def test_ppo_update_changes_weights(vla_spec):
    assert_ppo_changes_weights(_policy(vla_spec, "ddpm", rl_steps=2, num_inference_steps=4), logprob_level="action")


def test_bad_config_names_the_key(vla_spec):
    with pytest.raises(ValueError, match="policy.scheduler"):
        _policy(vla_spec, "euler")
    with pytest.raises(ValueError, match="policy.min_std"):
        _policy(vla_spec, min_std=0.0)


def test_state_only_env_and_value_for_bootstrapping(obs):
    """ManiSkill state envs have no cameras: the prefix is text + state; value() matches sample's value."""
    from policies import PolicySpec

    spec = PolicySpec(state_dim=5, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3)
    pol = _policy(spec)
    o = {**obs, "images": {}}
    s = pol.sample(o)
    torch.testing.assert_close(pol.evaluate(o, s.replay)[0], s.logprob, atol=1e-5, rtol=0)
    torch.testing.assert_close(pol.value(o), s.value, atol=1e-6, rtol=0)


@pytest.mark.parametrize("scheduler", ["ddim", "ddpm"])
@pytest.mark.parametrize("train_steps,inference_steps,beta_schedule",
                         [(100, 5, "squaredcos_cap_v2"), (1000, 10, "linear"), (100, 100, "squaredcos_cap_v2")])
def test_precomputed_chain_equals_diffusers_step_loop(scheduler, train_steps, inference_steps, beta_schedule):
    """act()'s traceable chain is diffusers' deterministic step (DDIM eta = 0 / DDPM posterior mean) on random inputs."""
    from diffusers import DDIMScheduler, DDPMScheduler

    from policies.diffusion.deterministic import denoising_table, deterministic_step

    cls = {"ddim": DDIMScheduler, "ddpm": DDPMScheduler}[scheduler]
    sch = cls(num_train_timesteps=train_steps, beta_schedule=beta_schedule, clip_sample=True, prediction_type="epsilon")
    sch.set_timesteps(inference_steps)
    table = denoising_table(sch)
    coef = table.tensors()
    assert table.timesteps == [int(t) for t in sch.timesteps] and coef["c_x0"].shape == (inference_steps,)
    g = torch.Generator().manual_seed(0)
    ours = ref = torch.randn(6, 4, 3, generator=g) * 2
    for k, t in enumerate(table.timesteps):
        eps = torch.randn(6, 4, 3, generator=g) * 1.5  # random "model outputs" (large enough that x0 clipping bites)
        if scheduler == "ddim":
            ref = sch.step(eps, t, ref, eta=0.0).prev_sample
        else:  # diffusers' DDPM step adds posterior noise when t > 0: take it back out to get the mean
            noisy = sch.step(eps, t, ref, generator=torch.Generator().manual_seed(k)).prev_sample
            noise = torch.randn(ref.shape, generator=torch.Generator().manual_seed(k))
            ref = noisy - (sch._get_variance(t) ** 0.5 * noise if t > 0 else 0.0)
        ours = deterministic_step(coef, k, eps, ours, table.clip_range)
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)
    assert ours.abs().max() > 0.1  # a real chain, not all-zeros


def test_unsupported_scheduler_settings_are_refused():
    from diffusers import DDIMScheduler

    from policies.diffusion.deterministic import denoising_table

    sch = DDIMScheduler(num_train_timesteps=100, prediction_type="v_prediction")
    sch.set_timesteps(5)
    with pytest.raises(ValueError, match="prediction_type='epsilon'"):
        denoising_table(sch)
