"""Checks several VLA policy families share (SFT loss, LoRA/freezing, bad observations), each written once so the
family's test module states only what differs: its config, the module names, the error wording."""

from __future__ import annotations

from typing import Any

import pytest
import torch


def assert_noise_sft_loss_halves(policy: Any, obs: dict, target: torch.Tensor, steps: int = 30) -> None:
    """``policy.sft_loss(obs, target, generator=...)`` (a denoising / flow-matching loss over sampled noise and
    times) falls below half its start within ``steps`` Adam steps, measured on 4 fixed held-out draws."""
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)

    def held_out() -> float:  # same noise and times before and after training
        with torch.no_grad():
            return sum(policy.sft_loss(obs, target, generator=torch.Generator().manual_seed(100 + i)).item()
                       for i in range(4))

    before = held_out()
    for i in range(steps):
        loss = policy.sft_loss(obs, target, generator=torch.Generator().manual_seed(i))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert held_out() < 0.5 * before


def assert_lora_adapters_train(policy: Any, obs: dict, targeted: str, untargeted: str) -> None:
    """With LoRA on the language model, only adapters train there: ``targeted`` modules carry ``lora_A``,
    ``untargeted`` ones none, and a PPO-style backward reaches the ``lora_B`` weights."""
    lm_train = [n for n, p in policy.backbone.language_model.named_parameters() if p.requires_grad]
    assert lm_train and all("lora_" in n for n in lm_train)
    assert any(f"{targeted}.lora_A" in n for n in lm_train) and not any(untargeted in n for n in lm_train)
    s = policy.sample(obs)
    policy.evaluate(obs, s.replay)[0].sum().backward()
    assert any(p.grad is not None for n, p in policy.named_parameters() if "lora_B" in n)


def assert_vision_frozen_language_trainable(policy: Any, vision_prefix: str) -> None:
    """``freeze_vision``: every backbone parameter under ``vision_prefix`` frozen, the language model trainable."""
    assert not any(p.requires_grad for n, p in policy.backbone.named_parameters() if n.startswith(vision_prefix))
    assert all(p.requires_grad for p in policy.backbone.language_model.parameters())


def assert_bad_observations_named(policy: Any, obs: dict, state_message: str) -> None:
    """A ``[3, 4]`` state where the spec says 5 raises ValueError matching ``state_message``; an observation
    without the ``wrist`` camera raises KeyError naming it."""
    with pytest.raises(ValueError, match=state_message):
        policy.act({**obs, "state": torch.zeros(3, 4)})
    with pytest.raises(KeyError, match="wrist"):
        policy.act({**obs, "images": {"base": obs["images"]["base"]}})


def assert_rescored_with_gradients(policy: Any, obs: dict, sample: Any) -> set[str]:
    """``evaluate`` on a sample's replay gives back its logprob and value (1e-5), and their backward reaches the
    action expert and the trunk's first layer; returns the names of the parameters with a nonzero gradient."""
    lp, _, v = policy.evaluate(obs, sample.replay)
    torch.testing.assert_close(lp, sample.logprob, atol=1e-5, rtol=0)
    torch.testing.assert_close(v, sample.value, atol=1e-5, rtol=0)
    (lp.sum() + v.sum()).backward()
    grads = {n for n, p in policy.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert any(n.startswith("expert.") for n in grads) and any(".layers.0." in n for n in grads)
    return grads
