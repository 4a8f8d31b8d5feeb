"""OpenVLA and OpenVLA-OFT against their own reference code (fixtures: scripts/reference_fixtures/openvla*.py).

Each fixture holds a tiny random-weight model saved by the reference's ``save_pretrained`` (bf16, HF layout;
OFT sharded, with its action-head and proprio-projector files), fixed inputs, and the reference's outputs:
OpenVLA's greedy action tokens, logits and ``predict_action``; OFT's action hidden states, L1-head chunk,
discrete-token chunk and logits, and ``normalize_proprio``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from policies.ar_vla.openvla import OpenVLA
from policies.ar_vla.openvla_checkpoint import load_openvla
from policies.ar_vla.openvla_oft import OpenVLAOFT
from tests.helpers.reference import FIXTURES, TOL, fixture_io, max_diff, one_line_error


def _io(name: str) -> tuple[dict[str, torch.Tensor], dict]:
    return fixture_io(FIXTURES / name)


@pytest.fixture(scope="module")
def openvla():
    io, meta = _io("openvla")
    return load_openvla(FIXTURES / "openvla" / "checkpoint", unnorm_key=meta["unnorm_keys"][0]), io, meta


@pytest.fixture(scope="module")
def oft():
    io, meta = _io("openvla_oft")
    return load_openvla(FIXTURES / "openvla_oft" / "checkpoint", unnorm_key=meta["unnorm_keys"][0]), io, meta


# ---- OpenVLA -------------------------------------------------------------------------------------------

def test_openvla_fixture_loads_whole(openvla):
    ckpt, _, _ = openvla
    assert ckpt.report.missing == [] and ckpt.report.unused == []
    assert type(ckpt.model) is OpenVLA and ckpt.model.vision_backbone.fused
    assert ckpt.model.vision_backbone.featurizer.spec.reg_tokens == 4  # DINOv2 with registers
    assert ckpt.model.vision_backbone.fused_featurizer.attn_pool is not None  # SigLIP's head, loaded
    assert (ckpt.config.action_dim, ckpt.config.base_vocab) == (7, 32000)


def test_openvla_pixel_values_match_its_processor(openvla):
    ckpt, io, _ = openvla
    assert max_diff(ckpt.pixel_values([io["raw_images"]]), io["pixel_values"]) <= 1e-6


def test_openvla_greedy_tokens_and_logits_match(openvla):
    ckpt, io, meta = openvla
    with torch.no_grad():
        tokens = ckpt.model.generate(io["input_ids"], io["pixel_values"], ckpt.config.action_dim)
        full = torch.cat([io["input_ids"], io["action_tokens"]], 1)
        logits = ckpt.model.logits(full, io["pixel_values"])[:, -ckpt.config.action_dim - 1 : -1]
    assert torch.equal(tokens, io["action_tokens"])
    assert max_diff(logits[..., meta["logits_tail_from"] :], io["action_logits_tail"]) <= TOL
    assert max_diff(logits.logsumexp(-1), io["action_logsumexp"]) <= TOL


@pytest.mark.parametrize("b", [0, 1])
def test_openvla_predict_action_matches_per_unnorm_key(b):
    io, meta = _io("openvla")
    ckpt = load_openvla(FIXTURES / "openvla" / "checkpoint", unnorm_key=meta["unnorm_keys"][b])
    actions = ckpt.predict_action(io["input_ids"][b : b + 1], io["pixel_values"][b : b + 1])
    assert max_diff(actions[0], io["actions"][b]) <= TOL


# ---- OpenVLA-OFT ---------------------------------------------------------------------------------------

def test_oft_fixture_loads_whole_from_shards(oft):
    ckpt, _, meta = oft
    assert (FIXTURES / "openvla_oft" / "checkpoint" / "model.safetensors.index.json").is_file()
    assert ckpt.report.missing == [] and ckpt.report.unused == []
    assert type(ckpt.model) is OpenVLAOFT and ckpt.model.action_head is not None
    c = ckpt.config
    k = meta["constants"]
    assert (c.chunk_size, c.action_dim, c.proprio_dim, c.num_images) == (
        k["NUM_ACTIONS_CHUNK"], k["ACTION_DIM"], k["PROPRIO_DIM"], meta["num_images"])


def test_oft_proprio_normalization_matches(oft):
    _, io, meta = oft
    for b, key in enumerate(meta["unnorm_keys"]):
        ckpt = load_openvla(FIXTURES / "openvla_oft" / "checkpoint", unnorm_key=key)
        assert max_diff(ckpt.normalize_proprio(io["proprio_raw"][b : b + 1])[0], io["proprio"][b]) <= 1e-6


def test_oft_pixel_values_of_two_cameras_match(oft):
    ckpt, io, _ = oft
    cams = [io["raw_images"][:, i] for i in range(ckpt.config.num_images)]
    assert max_diff(ckpt.pixel_values(cams), io["pixel_values"]) <= 1e-6


@pytest.mark.parametrize("b", [0, 1])
def test_oft_l1_head_matches(b):
    io, meta = _io("openvla_oft")
    ckpt = load_openvla(FIXTURES / "openvla_oft" / "checkpoint", unnorm_key=meta["unnorm_keys"][b])
    ids, pv, proprio = io["input_ids"][b : b + 1], io["pixel_values"][b : b + 1], io["proprio"][b : b + 1].float()
    with torch.no_grad():
        hidden, _ = ckpt.model.action_hidden(ids, pv, proprio)
    assert max_diff(hidden[0], io["l1_hidden"][b]) <= TOL
    actions = ckpt.predict_action(ids, pv, io["proprio_raw"][b : b + 1].float())  # env-unit proprio in
    assert actions.shape == (1, 8, 7)
    assert max_diff(actions[0], io["l1_actions"][b]) <= TOL


@pytest.fixture
def discrete_oft(tmp_path: Path) -> Path:
    """OFT's discrete-token variant: the same VLA and proprio projector, no L1 head file."""
    dst = tmp_path / "oft_tokens"
    shutil.copytree(FIXTURES / "openvla_oft" / "checkpoint", dst, ignore=shutil.ignore_patterns("action_head--*"))
    return dst


def test_oft_discrete_tokens_match(discrete_oft):
    io, meta = _io("openvla_oft")
    for b, key in enumerate(meta["unnorm_keys"]):
        ckpt = load_openvla(discrete_oft, unnorm_key=key, variant="openvla_oft")
        assert ckpt.model.action_head is None and ckpt.report.unused == []
        ids, pv, proprio = io["input_ids"][b : b + 1], io["pixel_values"][b : b + 1], io["proprio"][b : b + 1]
        with torch.no_grad():
            logits = ckpt.model.token_logits(ckpt.model.action_hidden(ids, pv, proprio.float())[0])
        assert max_diff(logits[0, :, meta["logits_tail_from"] :], io["action_logits_tail"][b]) <= TOL
        assert max_diff(logits[0].logsumexp(-1), io["action_logsumexp"][b]) <= TOL
        actions = ckpt.predict_action(ids, pv, io["proprio_raw"][b : b + 1].float())
        assert max_diff(actions[0], io["token_actions"][b]) <= TOL


def test_oft_attention_is_bidirectional(oft):
    """The stop token after the action positions changes their hidden states only if attention looks ahead."""
    ckpt, io, _ = oft
    ids, pv, proprio = io["input_ids"][:1], io["pixel_values"][:1], io["proprio"][:1].float()
    emb = ckpt.model.language_model.get_input_embeddings()
    with torch.no_grad():
        before, _ = ckpt.model.action_hidden(ids, pv, proprio)
        emb.weight[2] += 1.0
        try:
            after, _ = ckpt.model.action_hidden(ids, pv, proprio)
        finally:
            emb.weight[2] -= 1.0
    assert max_diff(before, after) > 1e-3


# ---- bad input: one line naming the fix ------------------------------------------------------------------

@pytest.fixture
def copy_oft(tmp_path: Path) -> Path:
    dst = tmp_path / "oft"
    shutil.copytree(FIXTURES / "openvla_oft" / "checkpoint", dst)
    return dst


def _one_line(path: Path, *must_contain: str, **kw) -> str:
    return one_line_error(load_openvla, path, *must_contain, **kw)


def test_checkpoint_of_another_architecture(copy_oft):
    cfg = json.loads((copy_oft / "config.json").read_text())
    cfg.update(architectures=["LlavaForConditionalGeneration"], model_type="llava")
    (copy_oft / "config.json").write_text(json.dumps(cfg))
    _one_line(copy_oft, "'LlavaForConditionalGeneration'", "not OpenVLA's", unnorm_key="fixture_sim")


def test_unnorm_key_missing_from_statistics(copy_oft):
    _one_line(copy_oft, "unnorm_key 'libero_spatial'", "dataset_statistics.json", "fixture_real", "fixture_sim",
              unnorm_key="libero_spatial")
    _one_line(copy_oft, "trained on 2 datasets", "pass unnorm_key=")


def test_wrong_number_of_images(oft):
    ckpt, io, _ = oft
    with pytest.raises(ValueError) as err:
        ckpt.pixel_values([io["raw_images"][:, 0]])
    assert "got 1 camera image(s)" in str(err.value) and "takes 2" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="6 channels; 2 image"):
        ckpt.model.action_hidden(io["input_ids"][:1], io["pixel_values"][:1, :6], io["proprio"][:1].float())


def test_unused_and_missing_keys_are_named(copy_oft):
    index = json.loads((copy_oft / "model.safetensors.index.json").read_text())
    shard = copy_oft / index["weight_map"]["projector.fc3.bias"]
    weights = load_file(str(shard))
    del weights["projector.fc3.bias"]
    weights["projector.fc4.weight"] = torch.zeros(2)
    save_file(weights, str(shard), metadata={"format": "pt"})
    _one_line(copy_oft, "1 missing keys ['projector.fc3.bias']", "1 unused keys ['projector.fc4.weight']",
              unnorm_key="fixture_sim")
    report = load_openvla(copy_oft, unnorm_key="fixture_sim", strict=False).report
    assert (report.missing, report.unused) == (["projector.fc3.bias"], ["projector.fc4.weight"])


def test_action_head_of_another_action_dim_is_named(copy_oft):
    stats = json.loads((copy_oft / "dataset_statistics.json").read_text())
    for part in ("q01", "q99", "mask"):
        stats["fixture_sim"]["action"][part] = stats["fixture_sim"]["action"][part][:6]
    (copy_oft / "dataset_statistics.json").write_text(json.dumps(stats))
    _one_line(copy_oft, "action_head.model", "action dim 6", unnorm_key="fixture_sim")
