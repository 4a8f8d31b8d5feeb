"""Qwen2.5-VL backbone on the real HF classes built tiny: Qwen's own processing and positions, RL consistency
for the autoregressive and flow families, checkpoints, local HF folders, LoRA and freezing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vla_helpers import assert_ppo_changes_weights, make_obs

from policies import Policy, make_policy
from policies.ar_vla import ARVLAConfig, ARVLAPolicy
from policies.flow_vla import FlowVLAConfig
from policies.vlm import BackboneConfig, LoRAConfig, build_backbone
from tests.helpers.recipes import PPO
from tests.helpers.vla_checks import assert_lora_adapters_train, assert_vision_frozen_language_trainable
from vlarl.config.loader import load_train_config

KIND = "qwen2_5_vl"


def _ar(spec, **kw) -> ARVLAPolicy:
    kw.setdefault("backbone", BackboneConfig(kind=KIND))
    return make_policy(ARVLAConfig(n_action_bins=32, chunk_size=2, **kw), spec)


def test_patches_and_hidden_states_match_the_hf_processor_and_model():
    """Our tensor patchify == Qwen's image processor; our [image | text] forward (3-D M-RoPE positions) ==
    the HF model run on input_ids with image placeholder tokens + pixel_values + image_grid_thw."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    bb = build_backbone(BackboneConfig(kind=KIND, image_size=32)).eval()
    img = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    proc = Qwen2VLImageProcessorPil(do_resize=False, image_mean=[0.5] * 3, image_std=[0.5] * 3, patch_size=8,
                                    merge_size=2, temporal_patch_size=2)
    ref = proc(images=[img], return_tensors="pt")
    pix = (torch.from_numpy(img).permute(2, 0, 1).float() / 255.0 - 0.5) / 0.5
    patches, grid = bb.patchify(pix[None])
    torch.testing.assert_close(patches, ref["pixel_values"].float(), atol=1e-6, rtol=0)
    assert grid.tolist() == ref["image_grid_thw"].tolist() == [[1, 4, 4]]

    text = torch.tensor([bb.tokenizer("push the cube", add_special_tokens=False)["input_ids"]])
    n_img = 4  # (4 / 2) ** 2 merged tokens
    vlm = bb.hf_models()[""]
    ids = torch.cat([torch.full((1, n_img), vlm.config.image_token_id), text], 1)
    types = torch.cat([torch.ones(1, n_img, dtype=torch.int), torch.zeros_like(text, dtype=torch.int)], 1)
    with torch.no_grad():
        want = vlm.model(input_ids=ids, pixel_values=ref["pixel_values"], image_grid_thw=ref["image_grid_thw"],
                         mm_token_type_ids=types).last_hidden_state
        emb = torch.cat([bb.embed_images(pix[None, None]), bb.embed_tokens(text)], 1)
        got, _ = bb(emb, torch.ones(ids.shape, dtype=torch.long))
        hf_pos, _ = vlm.model.get_rope_index(ids, types, image_grid_thw=ref["image_grid_thw"])
    assert torch.equal(bb.position_ids(1, ids.shape[1], 0, ids.device), hf_pos)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family,kw", [("ar_vla", {"decoding": "parallel"}), ("ar_vla", {"decoding": "sequential"}),
                                       ("flow_vla", {"likelihood": "flow_sde"})])
def test_evaluate_reproduces_sample_and_gradients_flow(vla_spec, obs, family, kw):
    cfg_cls = ARVLAConfig if family == "ar_vla" else FlowVLAConfig
    extra = {"n_action_bins": 32} if family == "ar_vla" else {}
    pol = make_policy(cfg_cls(backbone=BackboneConfig(kind=KIND), chunk_size=2, **extra, **kw), vla_spec)
    s = pol.sample(obs)
    assert s.actions.shape == s.logprob.shape == (3, 2, 3)
    lp, ent, v = pol.evaluate(obs, s.replay)
    torch.testing.assert_close(lp, s.logprob, atol=1e-5, rtol=0)
    torch.testing.assert_close(v, s.value, atol=1e-5, rtol=0)
    (lp.sum() + v.sum()).backward()
    grads = {n for n, p in pol.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert any(n.startswith("backbone.language_model.layers.0.") for n in grads), "no gradient reached the LM"
    assert any(n.startswith("backbone.visual.blocks.") for n in grads), "no gradient reached the Qwen ViT"
    assert any(n.startswith("value_head.") for n in grads)


def test_cached_decoding_positions_continue_after_the_prefix(vla_spec, obs):
    """Sequential generation (KV cache, positions from past length) == one teacher-forced pass."""
    pol = _ar(vla_spec, decoding="sequential")
    bins, logp, _ = pol._generate(obs, greedy=True)
    forced, _ = pol._forward_tokens(obs, bins)
    torch.testing.assert_close(forced, logp, atol=1e-5, rtol=0)


def test_save_from_pretrained_and_local_hf_folder(vla_spec, obs, tmp_path):
    pol = _ar(vla_spec)
    pol.update_normalization(make_obs(8, seed=5))
    d = pol.save_pretrained(tmp_path / "ckpt")
    for loaded in (ARVLAPolicy.from_pretrained(d), Policy.from_pretrained(d)):
        assert torch.equal(loaded.act(obs), pol.act(obs))
    folder = tmp_path / "hf"  # HF layout: Qwen2_5_VLForConditionalGeneration.save_pretrained + tokenizer
    pol.backbone.hf_models()[""].save_pretrained(folder)
    pol.backbone.tokenizer.save_pretrained(folder)
    fresh = _ar(vla_spec, backbone=BackboneConfig(kind=KIND, pretrained_path=str(folder)))
    ref = pol.backbone.hf_models()[""].state_dict()
    got = fresh.backbone.hf_models()[""].state_dict()
    assert set(got) == set(ref)
    for k, v in got.items():
        torch.testing.assert_close(v, ref[k])


def test_lora_targets_and_freezing_by_config(vla_spec, obs):
    lora = _ar(vla_spec, lora=LoRAConfig(rank=4, target_modules=["q_proj", "o_proj"]))
    assert_lora_adapters_train(lora, obs, targeted="o_proj", untargeted="v_proj")
    assert_vision_frozen_language_trainable(_ar(vla_spec, freeze_vision=True), "visual.")


def test_ppo_update_changes_weights(vla_spec):
    assert_ppo_changes_weights(_ar(vla_spec), logprob_level="token")


@pytest.mark.parametrize("name", ["ar_vla_qwen25vl", "flow_vla_qwen25vl"])
def test_yaml_composes_and_builds(name, vla_spec, obs):
    cfg = load_train_config([PPO, f"policy={name}", "policy.chunk_size=2"]).policy
    assert cfg.backbone.kind == KIND
    assert make_policy(cfg, vla_spec).act(obs).shape == (3, 2, 3)


def test_image_size_not_a_multiple_of_the_merged_patch_is_refused(vla_spec):
    with pytest.raises(ValueError, match=r"policy.backbone.image_size=30 must be a multiple of .* = 16"):
        _ar(vla_spec, backbone=BackboneConfig(kind=KIND, image_size=30))


def test_bf16_and_gradient_checkpointing(vla_spec, obs):
    pol = _ar(vla_spec, dtype="bfloat16", backbone=BackboneConfig(kind=KIND, gradient_checkpointing=True))
    assert next(pol.backbone.visual.parameters()).dtype == torch.bfloat16
    assert pol.backbone.hf_models()[""].is_activation_checkpointing
    s = pol.sample(obs)
    assert s.logprob.dtype == torch.float32
    pol.train()
    lp = pol.evaluate(obs, s.replay)[0]
    torch.testing.assert_close(lp, s.logprob, atol=1e-5, rtol=0)
    lp.sum().backward()
    assert pol.backbone.language_model.layers[0].mlp.up_proj.weight.grad is not None
