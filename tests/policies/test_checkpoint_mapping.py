"""Weights of pi0 (openpi / LeRobot) and OpenVLA checkpoints, written by the test under those projects'
parameter names from a tiny source policy, load into fresh flow_vla / ar_vla policies."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from policies import make_policy
from policies.ar_vla import ARVLAConfig
from policies.flow_vla import FlowVLAConfig
from policies.vlm import BackboneConfig
from policies.vlm.checkpoint_mapping import load_foreign_checkpoint

PI0_EXTRA = {  # pi0's action expert and projections: no counterpart in our cross-attending expert
    "paligemma_with_expert.gemma_expert.model.layers.0.mlp.up_proj.weight": torch.zeros(8, 4),
    "action_in_proj.weight": torch.zeros(16, 32),
    "action_time_mlp_in.weight": torch.zeros(16, 32),
}


def _flow(spec, seed: int):
    torch.manual_seed(seed)
    return make_policy(FlowVLAConfig(backbone=BackboneConfig(kind="paligemma"), chunk_size=2, use_state=False), spec)


def _pi0_names(vlm_state: dict, layout: str) -> dict:
    """Our PaliGemma keys -> pi0 checkpoint keys, as LeRobot (current HF layout) / openpi (older) name them."""
    out = {}
    for k, v in vlm_state.items():
        if layout == "lerobot":
            out["model.paligemma_with_expert.paligemma." + k] = v
            continue
        old = (k.replace("model.language_model.", "language_model.model.")
               .replace("model.vision_tower.", "vision_tower.")
               .replace("model.multi_modal_projector.", "multi_modal_projector.")
               .replace("lm_head.", "language_model.lm_head."))
        out["paligemma_with_expert.paligemma." + old] = v
    prefix = "model." if layout == "lerobot" else ""
    return {**out, **{prefix + k: v for k, v in PI0_EXTRA.items()}}


@pytest.mark.parametrize("layout", ["lerobot", "openpi"])
def test_pi0_checkpoint_loads_the_paligemma_into_flow_vla(vla_spec, obs, tmp_path, layout):
    src, dst = _flow(vla_spec, 0), _flow(vla_spec, 1)
    state = {k: v.clone() for k, v in src.backbone.vlm.state_dict().items()}
    tied = layout == "openpi"  # a checkpoint without an LM head (Gemma ties it to the embedding)
    if tied:
        state.pop("lm_head.weight")
    save_file({k: v.contiguous() for k, v in _pi0_names(state, layout).items()}, str(tmp_path / "model.safetensors"))
    report = load_foreign_checkpoint(dst, tmp_path, "pi0")
    prefix = "model." if layout == "lerobot" else ""
    assert report.unused == sorted(prefix + k for k in PI0_EXTRA)
    want = src.backbone.vlm.state_dict()
    if tied:
        want["lm_head.weight"] = want["model.language_model.embed_tokens.weight"]
        assert report.notes and "tied" in report.notes[0]
    for k, v in dst.backbone.vlm.state_dict().items():
        torch.testing.assert_close(v, want[k], msg=k)
    with torch.no_grad():
        h_src = src.backbone(*src.prefix(obs))[0]
        h_dst = dst.backbone(*dst.prefix(obs))[0]
    torch.testing.assert_close(h_dst, h_src)
    assert not torch.equal(dst.expert.out.weight, src.expert.out.weight), "the expert is not in the checkpoint"
    s = dst.sample(obs)
    torch.testing.assert_close(dst.evaluate(obs, s.replay)[0], s.logprob, atol=1e-5, rtol=0)


def _openvla_names(pol) -> dict:
    """Our SigLIP + Llama weights under OpenVLA's names (timm SigLIP with fused qkv, HF Llama)."""
    bb = pol.backbone
    out = {"language_model.model." + k: v for k, v in bb.language_model.state_dict().items()}
    out["language_model.lm_head.weight"] = bb.lm_head.weight.detach()
    vm = bb.vision
    sig = "vision_backbone.fused_featurizer."
    out[sig + "patch_embed.proj.weight"] = vm.embeddings.patch_embedding.weight.detach()
    out[sig + "patch_embed.proj.bias"] = vm.embeddings.patch_embedding.bias.detach()
    out[sig + "pos_embed"] = vm.embeddings.position_embedding.weight.detach()[None]
    out[sig + "norm.weight"], out[sig + "norm.bias"] = vm.post_layernorm.weight.detach(), vm.post_layernorm.bias.detach()
    for i, layer in enumerate(vm.encoder.layers):
        a, b = f"{sig}blocks.{i}.", layer
        for p in ("weight", "bias"):
            qkv = [getattr(b.self_attn, f"{n}_proj") for n in "qkv"]
            out[a + f"attn.qkv.{p}"] = torch.cat([getattr(m, p).detach() for m in qkv])
            out[a + f"attn.proj.{p}"] = getattr(b.self_attn.out_proj, p).detach()
            out[a + f"norm1.{p}"], out[a + f"norm2.{p}"] = getattr(b.layer_norm1, p).detach(), getattr(b.layer_norm2, p).detach()
            out[a + f"mlp.fc1.{p}"], out[a + f"mlp.fc2.{p}"] = getattr(b.mlp.fc1, p).detach(), getattr(b.mlp.fc2, p).detach()
    out["vision_backbone.featurizer.blocks.0.attn.qkv.weight"] = torch.zeros(12, 4)  # DINOv2: no counterpart
    out["projector.fc1.weight"] = torch.zeros(8, 8)
    return out


def test_openvla_checkpoint_loads_llama_and_siglip_into_ar_vla(vla_spec, obs, tmp_path):
    torch.manual_seed(0)
    src = make_policy(ARVLAConfig(n_action_bins=32, chunk_size=2), vla_spec)
    save_file({k: v.contiguous() for k, v in _openvla_names(src).items()}, str(tmp_path / "model.safetensors"))
    torch.manual_seed(1)
    dst = make_policy(ARVLAConfig(n_action_bins=48, chunk_size=2), vla_spec)  # 16 more action tokens
    report = load_foreign_checkpoint(dst, tmp_path, "openvla")
    assert report.unused == ["projector.fc1.weight", "vision_backbone.featurizer.blocks.0.attn.qkv.weight"]
    assert sorted(report.resized) == ["backbone.language_model.embed_tokens.weight", "backbone.lm_head.weight"]
    pix = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(dst.backbone.vision(pixel_values=pix).last_hidden_state,
                                   src.backbone.vision(pixel_values=pix).last_hidden_state)
        ids = torch.tensor([[1, 40, 50, 60, 70]])
        torch.testing.assert_close(dst.backbone(dst.backbone.embed_tokens(ids))[0],
                                   src.backbone(src.backbone.embed_tokens(ids))[0])
    n = src.backbone.lm_head.weight.shape[0]
    torch.testing.assert_close(dst.backbone.lm_head.weight[:n], src.backbone.lm_head.weight)


def test_wrong_targets_name_the_fix(vla_spec, tmp_path):
    save_file({"model.paligemma_with_expert.paligemma.model.language_model.norm.weight": torch.ones(32)},
              str(tmp_path / "model.safetensors"))
    llama = make_policy(ARVLAConfig(n_action_bins=32, chunk_size=2), vla_spec)
    with pytest.raises(ValueError, match="backbone.kind=paligemma"):
        load_foreign_checkpoint(llama, tmp_path, "pi0")
    with pytest.raises(ValueError, match="layout 'octo' is unknown"):
        load_foreign_checkpoint(llama, tmp_path, "octo")
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        load_foreign_checkpoint(llama, tmp_path / "empty", "pi0")
    save_file({"language_model.model.norm.weight": torch.ones(7)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"'backbone.language_model.norm.weight' is \(7,\)"):
        load_foreign_checkpoint(llama, tmp_path, "openvla")
