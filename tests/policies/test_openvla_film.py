"""OpenVLA-OFT+ (FiLM language conditioning of the vision towers) against OFT's own code.

The fixture (``scripts/reference_fixtures/openvla_oft.py``, folder ``openvla_oft_film``) is the folder a LoRA +
FiLM run of OFT's ``finetune.py`` leaves: bf16 shards, action head, proprio projector and
``vision_backbone--100_checkpoint.pt`` (OFT's ``FiLMedPrismaticVisionBackbone`` around the LoRA'd towers, rank 32),
reloaded by OFT's ``_apply_film_to_vla`` for the reference outputs of ``predict_action(use_film=True)``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from policies import Policy, PolicySpec, make_policy
from policies.ar_vla import OpenVLAOFTPolicyConfig
from policies.ar_vla.openvla import OpenVLAConfig, tiny_config
from policies.ar_vla.openvla_checkpoint import load_openvla
from policies.ar_vla.openvla_oft import OpenVLAOFT
from policies.ar_vla.openvla_policy import OpenVLAPolicy
from tests.helpers.reference import (
    FIXTURES,
    TOL,
    fixture_io,
    holds_reference_weights,
    max_diff,
    oft_spec,
    one_line_error,
    spec_obs,
)

FILM = FIXTURES / "openvla_oft_film"
VISION_FILE = "vision_backbone--100_checkpoint.pt"


def _io() -> tuple[dict[str, torch.Tensor], dict]:
    return fixture_io(FILM)


@pytest.fixture(scope="module")
def film():
    io, meta = _io()
    return load_openvla(FILM / "checkpoint", unnorm_key=meta["unnorm_keys"][0]), io, meta


def test_film_fixture_loads_whole(film):
    ckpt, _, meta = film
    assert ckpt.report.missing == [] and ckpt.report.unused == []
    assert type(ckpt.model) is OpenVLAOFT and ckpt.config.use_film and ckpt.model.action_head is not None
    shards = json.loads((FILM / "checkpoint" / "model.safetensors.index.json").read_text())["weight_map"]
    film_keys = [k for k in ckpt.model.state_dict() if ".scale." in k or ".shift." in k]
    # 3 blocks x 2 towers x (scale, shift) x (weight, bias); none of them is in the shards: all from the FiLM file
    assert len(film_keys) == 24 and not set(film_keys) & set(shards)
    block = ckpt.model.vision_backbone.fused_featurizer.blocks[0]
    assert block.scale.weight.shape == (block.norm1.normalized_shape[0], ckpt.config.llm_dim)
    assert meta["lora"]["rank"] == 32  # OFT's LoRA scaling min(r, 16) / r = 0.5 was merged


@pytest.mark.parametrize("b", [0, 1])
def test_film_l1_head_matches_the_reference(b):
    io, meta = _io()
    ckpt = load_openvla(FILM / "checkpoint", unnorm_key=meta["unnorm_keys"][b])
    ids, pv, proprio = io["input_ids"][b : b + 1], io["pixel_values"][b : b + 1], io["proprio"][b : b + 1].float()
    with torch.no_grad():
        hidden, _ = ckpt.model.action_hidden(ids, pv, proprio)
    assert max_diff(hidden[0], io["l1_hidden"][b]) <= TOL
    actions = ckpt.predict_action(ids, pv, io["proprio_raw"][b : b + 1].float())
    assert actions.shape == (1, 8, 7)
    assert max_diff(actions[0], io["l1_actions"][b]) <= TOL


def test_film_batch_from_raw_images_matches(film):
    """Both samples in one call, pixel values made here from the raw camera images."""
    ckpt, io, _ = film
    pv = ckpt.pixel_values([io["raw_images"][:, i] for i in range(ckpt.config.num_images)])
    mask = torch.ones_like(io["input_ids"])
    with torch.no_grad():
        hidden, _ = ckpt.model.action_hidden(io["input_ids"], pv, io["proprio"].float(), mask)
    assert max_diff(hidden, io["l1_hidden"]) <= TOL


def test_film_conditions_the_towers_on_the_prompt(film):
    """With FiLM the patch features depend on the instruction; without it (the plain OFT fixture) they do not;
    zero FiLM projections are the identity (OFT's ``1 + gamma``)."""
    ckpt, io, _ = film
    model = ckpt.model
    ids, pv = io["input_ids"][:1], io["pixel_values"][:1]
    other = io["input_ids"][1:]  # another instruction (the average is blind to word order)
    embed = model.language_model.get_input_embeddings()
    with torch.no_grad():
        a = model.vision_features(pv, embed(ids), None)
        b = model.vision_features(pv, embed(other), None)
        assert max_diff(a, b) > 1e-3
        plain = load_openvla(FIXTURES / "openvla_oft" / "checkpoint", unnorm_key="fixture_sim").model
        assert max_diff(plain.vision_features(pv, embed(ids), None), plain.vision_features(pv, embed(other), None)) == 0
        saved = {k: v.clone() for k, v in model.state_dict().items() if ".scale." in k or ".shift." in k}
        try:
            for k in saved:
                model.get_parameter(k).zero_()
            identity = model.vision_features(pv, embed(ids), None)
            plain.load_state_dict({k: v for k, v in model.state_dict().items() if k in plain.state_dict()})
            assert max_diff(identity, plain.vision_features(pv, embed(other), None)) <= 1e-6
        finally:
            model.load_state_dict(saved, strict=False)


def test_film_language_average_leaves_out_padding(film):
    """The language average is over the prompt and </s>; pad tokens (mask 0) do not enter it."""
    ckpt, io, _ = film
    model = ckpt.model
    ids = io["input_ids"][:1]
    embed = model.language_model.get_input_embeddings()
    padded = torch.cat([ids[:, :1], torch.full((1, 3), 32000), ids[:, 1:]], 1)
    mask = torch.cat([torch.ones(1, 1), torch.zeros(1, 3), torch.ones(1, ids.shape[1] - 1)], 1).long()
    with torch.no_grad():
        plain = model.film_language(embed(ids), None)
        expected = torch.cat([embed(ids), embed(torch.tensor([[2]]))], 1).mean(1)
        assert max_diff(plain, expected) <= 1e-7
        assert max_diff(model.film_language(embed(padded), mask), plain) <= 1e-6


# ---- the policy: policy.arch.use_film (built here) and an OFT+ folder as pretrained_path -------------------

def test_policy_with_film_rescores_and_trains_film(vla_spec, obs, tmp_path):
    torch.manual_seed(0)
    pol = make_policy(OpenVLAOFTPolicyConfig(action_head="l1", chunk_size=2,
                                  arch={"use_film": True}), vla_spec)
    assert isinstance(pol, OpenVLAPolicy) and pol.cfg.use_film
    s = pol.sample(obs)
    lp, _, v = pol.evaluate(obs, s.replay)
    torch.testing.assert_close(lp, s.logprob, atol=1e-5, rtol=0)
    (lp.sum() + v.sum()).backward()
    grads = {n for n, p in pol.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert "model.vision_backbone.featurizer.blocks.0.scale.weight" in grads
    assert "model.vision_backbone.fused_featurizer.blocks.1.shift.bias" in grads
    pol.save_pretrained(tmp_path / "ckpt")
    back = Policy.from_pretrained(tmp_path / "ckpt")
    assert back.cfg.use_film and torch.equal(back.act(obs), pol.act(obs))


def test_oft_plus_folder_drives_the_policy():
    spec = oft_spec()
    pol = make_policy(OpenVLAOFTPolicyConfig(action_head="l1", chunk_size=8,
                                  pretrained_path=str(FILM / "checkpoint"), unnorm_key="fixture_sim"), spec)
    ref = load_openvla(FILM / "checkpoint", unnorm_key="fixture_sim")
    assert pol.cfg.use_film
    assert holds_reference_weights(pol, ref.model)
    obs = spec_obs(spec)
    assert pol.act(obs).shape == (2, 8, 7)


# ---- bad input: one line naming the fix ------------------------------------------------------------------

def _one_line(path: Path, *must_contain: str, **kw) -> str:
    return one_line_error(load_openvla, path, *must_contain, unnorm_key="fixture_sim", **kw)


def test_film_folder_with_use_film_off_names_the_fix():
    _one_line(FILM / "checkpoint", VISION_FILE, "FiLM", "use_film=True", use_film=False)
    _one_line(FILM / "checkpoint", "variant='openvla_oft'", variant="openvla")


def test_plain_oft_folder_with_use_film_on_names_the_fix():
    _one_line(FIXTURES / "openvla_oft" / "checkpoint", "no FiLM tensors", "use_film=False", use_film=True)


def test_film_config_outside_oft_is_refused():
    with pytest.raises(ValueError, match="only in OpenVLA-OFT: set parallel=True"):
        OpenVLAConfig(use_film=True)
    cfg = tiny_config("openvla_oft")
    cfg.use_film = True
    assert OpenVLAOFT(cfg).vision_backbone.film


@pytest.fixture
def copy_film(tmp_path: Path) -> Path:
    dst = tmp_path / "film"
    shutil.copytree(FILM / "checkpoint", dst)
    return dst


def test_film_file_with_a_missing_tensor_or_half_a_lora_pair_is_named(copy_film):
    f = copy_film / VISION_FILE
    state = torch.load(f, weights_only=True)
    del state["vision_backbone.featurizer.blocks.1.shift.bias"]
    torch.save(state, f)
    _one_line(copy_film, "1 missing keys ['vision_backbone.featurizer.blocks.1.shift.bias']")
    del state["vision_backbone.featurizer.blocks.0.block.mlp.fc2.lora_B.default.weight"]
    torch.save(state, f)
    _one_line(copy_film, "LoRA layer 'vision_backbone.featurizer.blocks.0.mlp.fc2'")


@pytest.mark.slow
def test_film_policy_exports_match_eager(tmp_path):
    """vlarl-export's three formats carry the in-graph language average and FiLM (within 1e-4 of eager)."""
    from vlarl.export import export_checkpoint

    spec = PolicySpec(state_dim=5, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3, image_keys=["base"],
                      image_size=[32, 32], instruction="push the cube")
    make_policy(OpenVLAOFTPolicyConfig(action_head="l1", chunk_size=2, arch={"use_film": True}),
                spec).save_pretrained(tmp_path / "ckpt")
    manifest = export_checkpoint(tmp_path / "ckpt", tmp_path / "export", instruction="push the cube", atol=1e-4)
    for fmt in ("onnx", "torch_export", "hf"):
        assert max(manifest["formats"][fmt]["max_abs_err"].values()) <= 1e-4


def test_freeze_vision_keeps_film_maps_trainable(vla_spec):
    """OFT+ trains FiLM with the towers frozen: ``freeze_vision`` freezes the towers' own weights only."""
    pol = make_policy(OpenVLAOFTPolicyConfig(action_head="l1", chunk_size=2, freeze_vision=True,
                                  arch={"use_film": True}), vla_spec)
    trainable = {n for n, p in pol.named_parameters() if p.requires_grad}
    assert "model.vision_backbone.featurizer.blocks.0.scale.weight" in trainable
    assert "model.vision_backbone.fused_featurizer.blocks.1.shift.bias" in trainable
    assert not any(n.startswith("model.vision_backbone.") and ".attn." in n for n in trainable)
