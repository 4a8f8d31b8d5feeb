"""Autoregressive token VLA on real HF classes built tiny: consistency, tokenizer, I/O, LoRA, PPO."""

from __future__ import annotations

import pytest
import torch
from vla_helpers import assert_ppo_changes_weights, make_obs

from policies import Policy, make_policy
from policies.ar_vla import ARVLAConfig, ARVLAPolicy
from policies.vlm import BackboneConfig, LoRAConfig
from policies.vlm.tokenizer import ACTION_TOKEN
from tests.helpers.vla_checks import (
    assert_bad_observations_named,
    assert_lora_adapters_train,
    assert_vision_frozen_language_trainable,
)


def _policy(spec, kind="siglip_llama", **kw) -> ARVLAPolicy:
    kw.setdefault("n_action_bins", 32)
    kw.setdefault("chunk_size", 2)
    kw.setdefault("backbone", BackboneConfig(kind=kind))
    return make_policy(ARVLAConfig(**kw), spec)


@pytest.mark.parametrize(
    "kind,decoding",
    [("siglip_llama", "parallel"), ("siglip_qwen2", "sequential"), ("paligemma", "parallel"), ("idefics3", "sequential")],
)
def test_sample_evaluate_consistency_and_gradients(vla_spec, obs, kind, decoding):
    pol = _policy(vla_spec, kind, decoding=decoding)
    s = pol.sample(obs)
    assert s.actions.shape == s.logprob.shape == (3, 2, 3) and s.value.shape == (3,)
    assert s.replay["action_tokens"].shape == (3, 2, 3)
    low, high = torch.tensor(vla_spec.action_low), torch.tensor(vla_spec.action_high)
    assert (s.actions >= low).all() and (s.actions <= high).all()
    lp, ent, v = pol.evaluate(obs, s.replay)
    torch.testing.assert_close(lp, s.logprob, atol=1e-5, rtol=0)
    torch.testing.assert_close(v, s.value, atol=1e-5, rtol=0)
    assert (lp <= 0).all() and (ent >= 0).all() and ent.shape == (3, 2, 3)
    (lp.sum() + v.sum()).backward()
    grads = {n for n, p in pol.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert any(".layers.0." in n for n in grads), "no gradient reached the language model"
    assert any(n.startswith("backbone.") and "vision" in n for n in grads), "no gradient reached the vision tower"
    assert any(n.startswith("value_head.") for n in grads) and "state_proj.weight" in grads


def test_token_distribution_is_a_proper_categorical(vla_spec, obs):
    pol = _policy(vla_spec, temperature=0.7, top_k=5)
    with torch.no_grad():
        logp, _ = pol._forward_tokens(obs, None)
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(logp.shape[:2]), atol=1e-5, rtol=0)
    assert ((logp.exp() > 1e-12).sum(-1) == 5).all(), "top_k=5 must leave exactly 5 bins with mass"
    s = pol.sample(obs)
    torch.testing.assert_close(pol.evaluate(obs, s.replay)[0], s.logprob, atol=1e-5, rtol=0)


def test_action_tokens_are_reserved_vocab_ids_found_through_the_tokenizer(vla_spec, obs):
    pol = _policy(vla_spec)
    tok = pol.backbone.tokenizer
    ids = tok.convert_tokens_to_ids([ACTION_TOKEN.format(i) for i in range(32)])
    assert pol.action_tokenizer.token_ids.tolist() == ids
    assert pol.backbone.lm_head.out_features >= len(tok) > max(ids)
    tail = _policy(vla_spec, action_token_strategy="tail")
    vocab = len(tail.backbone.tokenizer)
    assert tail.action_tokenizer.token_ids.tolist() == list(range(vocab - 32, vocab))
    x = torch.linspace(-1, 1, 101)
    err = (pol.action_tokenizer.decode(pol.action_tokenizer.encode(x)) - x).abs().max()
    assert err <= 1.0 / 32 + 1e-6  # half a bin width (2 / 32 / 2)
    s = pol.sample(obs)  # sampled tokens decode to the returned actions
    x_norm = pol.action_tokenizer.decode(s.replay["action_tokens"])
    torch.testing.assert_close(pol.unnormalize_actions(x_norm), s.actions)


@pytest.mark.parametrize("kind", ["siglip_llama", "idefics3"])
def test_save_from_pretrained_round_trip(vla_spec, obs, tmp_path, kind):
    pol = _policy(vla_spec, kind)
    pol.update_normalization(make_obs(8, seed=5))
    d = pol.save_pretrained(tmp_path / "ckpt")
    assert all((d / f).is_file() for f in ("tokenizer_config.json", "backbone_config.json", "processor_config.json"))
    assert all(f.is_file() for f in d.iterdir()), "checkpoint files must be flat"
    for loaded in (ARVLAPolicy.from_pretrained(d), Policy.from_pretrained(d)):
        assert torch.equal(loaded.act(obs), pol.act(obs))
        torch.testing.assert_close(loaded.state_norm.mean, pol.state_norm.mean)


@pytest.mark.parametrize("kind", ["paligemma", "siglip_llama"])
def test_loads_a_local_hf_checkpoint_without_a_hub(vla_spec, obs, tmp_path, kind):
    """A real-layout checkpoint (HF weights + tokenizer written by save_pretrained) loads from a local path:
    PaliGemma as one model folder; the SigLIP + Llama composition as vision/ and language/ folders."""
    src = _policy(vla_spec, kind)
    folder = tmp_path / "hf"
    for sub, model in src.backbone.hf_models().items():
        model.save_pretrained(folder / sub if sub else folder)
    src.backbone.tokenizer.save_pretrained(folder)
    cfg = ARVLAConfig(backbone=BackboneConfig(kind=kind, pretrained_path=str(folder)), n_action_bins=32, chunk_size=2)
    pol = make_policy(cfg, vla_spec)
    for sub, model in src.backbone.hf_models().items():
        ref = model.state_dict()
        for k, v in pol.backbone.hf_models()[sub].state_dict().items():
            torch.testing.assert_close(v, ref[k])
    with pytest.raises(FileNotFoundError, match="pretrained_path"):
        make_policy(ARVLAConfig(backbone=BackboneConfig(pretrained_path=str(tmp_path / "missing"))), vla_spec)


def test_bf16_backbone_keeps_fp32_log_probs_and_gradient_checkpointing_switch(vla_spec, obs):
    pol = _policy(vla_spec, dtype="bfloat16")
    assert next(pol.backbone.parameters()).dtype == torch.bfloat16
    s = pol.sample(obs)
    assert s.logprob.dtype == torch.float32
    torch.testing.assert_close(pol.evaluate(obs, s.replay)[0], s.logprob, atol=1e-5, rtol=0)
    ckpt = _policy(vla_spec, backbone=BackboneConfig(gradient_checkpointing=True))
    assert all(m.is_activation_checkpointing for m in ckpt.backbone.hf_models().values())
    plain = _policy(vla_spec)
    plain.load_state_dict(ckpt.state_dict())
    ckpt.train(), plain.train()
    s = plain.sample(obs)
    for p in (ckpt, plain):
        p.evaluate(obs, s.replay)[0].sum().backward()
    g1 = ckpt.backbone.language_model.layers[0].mlp.up_proj.weight.grad
    g2 = plain.backbone.language_model.layers[0].mlp.up_proj.weight.grad
    torch.testing.assert_close(g1, g2, atol=1e-6, rtol=1e-4)


def test_freezing_and_lora_select_the_trainable_parameters(vla_spec, obs, tmp_path):
    frozen = _policy(vla_spec, freeze_vlm=True)
    assert not any(p.requires_grad for p in frozen.backbone.parameters())
    assert frozen.action_queries.requires_grad and frozen.value_head[0].weight.requires_grad
    assert_vision_frozen_language_trainable(_policy(vla_spec, freeze_vision=True), "vision.")
    lora = _policy(vla_spec, lora=LoRAConfig(rank=4, target_modules=["q_proj", "v_proj"]))
    assert_lora_adapters_train(lora, obs, targeted="q_proj", untargeted="k_proj")
    with torch.no_grad():  # make the adapters matter, then round-trip them through a checkpoint
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    loaded = ARVLAPolicy.from_pretrained(lora.save_pretrained(tmp_path / "lora"))
    assert torch.equal(loaded.act(obs), lora.act(obs))


def test_ppo_update_changes_weights(vla_spec):
    assert_ppo_changes_weights(_policy(vla_spec, decoding="sequential"), logprob_level="token")


def test_bad_input_names_the_problem(vla_spec, obs):
    assert_bad_observations_named(_policy(vla_spec), obs, r"obs\['state'\] must be \[B, 5\]")
    with pytest.raises(ValueError, match="backbone.kind"):
        _policy(vla_spec, "nope")
    with pytest.raises(ValueError, match="policy.decoding"):
        _policy(vla_spec, decoding="beam")


@pytest.mark.parametrize("kind", ["paligemma", "idefics3"])
def test_freeze_vision_keeps_the_language_model_of_native_vlms_trainable(vla_spec, kind):
    """Native HF VLMs nest the LM under ``vlm.model.*``: freezing the vision side must not freeze it."""
    pol = _policy(vla_spec, kind, freeze_vision=True)
    lm = list(pol.backbone.language_model.parameters())
    assert lm and all(p.requires_grad for p in lm)
    lm_ids = {id(p) for p in lm} | {id(p) for p in pol.backbone.lm_head.parameters()}
    others = [p for p in pol.backbone.parameters() if id(p) not in lm_ids]
    assert others and not any(p.requires_grad for p in others)


def test_openvla_token_convention_matches_its_digitize_decode(vla_spec):
    """OpenVLA: token = vocab_size - digitize(x, linspace(-1, 1, 256)); action = centers[clip(vocab - token - 1)]."""
    import numpy as np

    with pytest.raises(ValueError, match="n_action_bins=255"):
        _policy(vla_spec, action_token_strategy="openvla", n_action_bins=256)
    pol = _policy(vla_spec, action_token_strategy="openvla", n_action_bins=255)
    at, vocab = pol.action_tokenizer, pol.backbone.tokenizer.vocab_size
    assert at.token_ids[0] == vocab - 1 and at.token_ids[-1] == vocab - 255  # ids count down
    x = torch.linspace(-0.999, 0.999, 401)
    edges = np.linspace(-1.0, 1.0, 256)
    centers = (edges[:-1] + edges[1:]) / 2.0
    openvla_tokens = vocab - np.digitize(x.numpy(), edges)  # OpenVLA's encoding, written out
    ours = at.token_ids[at.encode(x)].numpy()
    np.testing.assert_array_equal(ours, openvla_tokens)
    openvla_actions = centers[np.clip(vocab - openvla_tokens - 1, 0, 254)]  # OpenVLA's decoding
    np.testing.assert_allclose(at.decode(at.encode(x)).numpy(), openvla_actions, atol=1e-6)
