"""pi0 and pi0.5 against LeRobot 0.4.4 itself (fixtures: scripts/reference_fixtures/pi0.py).

Each fixture holds a tiny random-weight policy saved by LeRobot (its own layout, processors and
MEAN_STD (pi0) / QUANTILES (pi0.5) statistics), fixed observations and noise, and LeRobot's per-step
velocities, chunk and actions, computed on openpi's patched transformers 4.53.2.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from policies.flow_vla.interface import FlowInputs
from policies.flow_vla.pi0 import PI0, tiny_config
from policies.flow_vla.pi0_checkpoint import load_pi0
from tests.helpers.reference import (
    FIXTURES,
    TOL,
    assert_actions_match,
    assert_missing_and_unused_named,
    assert_velocities_and_chunk_match,
    edit_config,
    fixture_io,
    flow_model_inputs,
    one_line_error,
    raw_observation_inputs,
    set_feature_shape,
)

KINDS = ("pi0", "pi05")


def fixture_dir(kind: str) -> Path:
    return FIXTURES / kind / "checkpoint"


@pytest.fixture(scope="module", params=KINDS)
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def io(kind) -> dict[str, torch.Tensor]:
    return fixture_io(fixture_dir(kind))[0]


@pytest.fixture(scope="module")
def ckpt(kind):
    return load_pi0(fixture_dir(kind))


def test_fixture_loads_whole(ckpt, kind):
    assert ckpt.report.missing == [] and ckpt.report.unused == []
    cfg, model = ckpt.config, ckpt.model
    assert cfg.type == kind and ckpt.layout == "lerobot"
    expert = model.paligemma_with_expert.gemma_expert.model
    if kind == "pi0":
        assert (cfg.chunk_size, cfg.num_inference_steps, cfg.max_state_dim, cfg.empty_cameras) == (6, 4, 8, 1)
        assert ckpt.state_norm.mode == ckpt.action_norm.mode == "MEAN_STD"
        assert hasattr(model, "state_proj") and not hasattr(expert.norm, "dense")
        assert ckpt.image_keys[-1] == "observation.images.empty_camera_0"
    else:  # the published chunk / steps / padding / tokenizer length; adaRMS expert, no state token
        assert (cfg.chunk_size, cfg.num_inference_steps, cfg.max_state_dim, cfg.tokenizer_max_length) == (50, 10, 32, 200)
        assert ckpt.state_norm.mode == ckpt.action_norm.mode == "QUANTILES"
        assert not hasattr(model, "state_proj") and hasattr(expert.norm, "dense")
        assert all(hasattr(layer.input_layernorm, "dense") for layer in expert.layers)


def test_velocities_and_chunk_match_lerobot(ckpt, io):
    assert_velocities_and_chunk_match(ckpt, io)


def test_raw_observation_to_actions_match_lerobot(ckpt, io, kind):
    """vlarl's transforms (prompt + tokenizer, normalization, resize with pad, empty camera) + model + unnormalize."""
    inputs = raw_observation_inputs(ckpt, io, fixture_dir(kind))
    for ours, ref in zip(inputs.images, flow_model_inputs(io).images, strict=True):
        assert (ours - ref).abs().max().item() <= 1e-5
    assert_actions_match(ckpt, inputs, io, (2, 6, 5) if kind == "pi0" else (2, 50, 3))


def test_velocity_returns_the_expert_hidden_state(ckpt, io):
    """``return_hidden``: the action tokens' final-normed expert state, whose projection is the velocity."""
    inputs = flow_model_inputs(io)
    t = torch.full((2,), 0.5)
    with torch.no_grad():
        prefix = ckpt.model.encode_prefix(inputs)
        v, hidden = ckpt.model.velocity(prefix, inputs, io["noise"], t, return_hidden=True)
    assert hidden.shape == (2, ckpt.config.chunk_size, ckpt.model.expert_width)
    assert torch.equal(v, ckpt.model.action_out_proj(hidden))
    assert prefix.features.shape == (2, ckpt.model.vlm_width)


def test_openpi_layout_loads_and_matches(tmp_path, ckpt, io, kind):
    """openpi's PyTorch layout: LeRobot's mapping from openpi keys is the ``model.`` prefix, so the inverse
    rename of the fixture's weights plus openpi's config.json must give the same network."""
    src = fixture_dir(kind)
    dst = tmp_path / "openpi"
    dst.mkdir()
    weights = {k.removeprefix("model."): v for k, v in load_file(str(src / "model.safetensors")).items()}
    save_file(weights, str(dst / "model.safetensors"))
    cfg = ckpt.config
    (dst / "config.json").write_text(json.dumps({
        "action_dim": cfg.max_action_dim, "action_horizon": cfg.chunk_size, "paligemma_variant": "gemma_2b",
        "action_expert_variant": "gemma_300m", "precision": "float32"}))
    shutil.copy(src / "tiny_dims.json", dst / "tiny_dims.json")
    loaded = load_pi0(dst)
    assert loaded.layout == "openpi" and loaded.config.type == kind
    assert loaded.report.missing == [] and loaded.report.unused == []
    loaded.model.num_steps = ckpt.model.num_steps  # openpi's config.json does not record the step count
    inputs = flow_model_inputs(io)
    if kind == "pi0":  # openpi pads the state to action_dim
        inputs.state = torch.nn.functional.pad(inputs.state, (0, cfg.max_action_dim - inputs.state.shape[-1]))
    with torch.no_grad():
        chunk = loaded.model.sample_actions(inputs, io["noise"])
    assert (chunk - io["chunk"]).abs().max().item() <= TOL


def test_tiny_configs_build_and_sample():
    """The tiny configs (no checkpoint) run the whole protocol: both kinds, chunk of the configured size."""
    torch.manual_seed(0)
    for name in KINDS:
        model = PI0(tiny_config(name)).eval()
        inputs = FlowInputs(images=[torch.rand(2, 3, 32, 32) * 2 - 1], image_masks=[torch.ones(2, dtype=torch.bool)],
                            tokens=torch.randint(0, 264, (2, 7)), token_masks=torch.ones(2, 7, dtype=torch.bool),
                            state=torch.randn(2, 8))
        with torch.no_grad():
            out = model.sample_actions(inputs, torch.randn(2, 4, 8))
        assert out.shape == (2, 4, 8) and torch.isfinite(out).all()


# ---- bad input: one line naming the fix -----------------------------------------------------------
@pytest.fixture
def copy(tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(fixture_dir("pi0"), dst, ignore=shutil.ignore_patterns("io.*"))
    return dst


def _one_line_error(path: Path, *must_contain: str, **kw) -> str:
    return one_line_error(load_pi0, path, *must_contain, **kw)


def test_checkpoint_of_another_architecture(copy):
    edit_config(copy, type="smolvla")
    _one_line_error(copy, "'smolvla'", "not 'pi0' or 'pi05'")


def test_missing_processor_files(copy):
    (copy / "policy_postprocessor_step_0_unnormalizer_processor.safetensors").unlink()
    _one_line_error(copy, "policy_postprocessor_step_0_unnormalizer_processor.safetensors")
    (copy / "policy_preprocessor.json").unlink()
    _one_line_error(copy, "policy_preprocessor.json")


def test_tokenizer_must_be_a_local_folder(copy):
    shutil.rmtree(copy / "tokenizer")
    _one_line_error(copy, "tokenizer 'tokenizer' is not a local folder", "vlm_path=", "policy.vlm_path=")
    _one_line_error(copy, "'google/paligemma-3b-pt-224'", vlm_path="google/paligemma-3b-pt-224")


def test_dims_that_do_not_fit_the_padding(copy):
    set_feature_shape(copy, "input_features", "observation.state", [9])
    _one_line_error(copy, "state dim 9", "max_state_dim=8")


def test_unused_and_missing_keys_are_named(copy):
    assert_missing_and_unused_named(load_pi0, copy)


def test_wrong_sizes_are_named(copy):
    dims = json.loads((copy / "tiny_dims.json").read_text())
    dims["expert"]["mlp_dim"] = 96  # sizes that do not match the saved weights
    (copy / "tiny_dims.json").write_text(json.dumps(dims))
    _one_line_error(copy, "differ in shape", "mlp.down_proj.weight", "tiny_dims.json")
