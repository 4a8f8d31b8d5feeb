"""SmolVLA against LeRobot 0.4.4 itself (fixture: scripts/reference_fixtures/smolvla.py).

The fixture holds a tiny random-weight SmolVLA saved by LeRobot (its own layout, processors and
MEAN_STD statistics), fixed observations and noise, and LeRobot's per-step velocities and actions.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from policies.flow_vla.smolvla_checkpoint import load_smolvla
from tests.helpers.reference import (
    FIXTURES,
    assert_actions_match,
    assert_missing_and_unused_named,
    assert_velocities_and_chunk_match,
    edit_config,
    fixture_io,
    one_line_error,
    raw_observation_inputs,
    set_feature_shape,
)

FIXTURE = FIXTURES / "smolvla"


VARIANTS = ("checkpoint", "variant")  # published settings; special tokens, shallow expert, empty camera, ...


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def io(variant) -> dict[str, torch.Tensor]:
    return fixture_io(FIXTURE / variant)[0]


@pytest.fixture(scope="module")
def ckpt(variant):
    return load_smolvla(FIXTURE / variant)


def test_fixture_loads_whole(ckpt, variant):
    assert ckpt.report.missing == [] and ckpt.report.unused == []
    cfg = ckpt.config
    if variant == "variant":
        assert cfg.add_image_special_tokens and cfg.empty_cameras == 1 and cfg.prefix_length == 48
        assert len(ckpt.model.vlm_with_expert.lm_expert.layers) == 2
        return
    assert (cfg.chunk_size, cfg.num_steps, cfg.max_state_dim, cfg.max_action_dim) == (50, 10, 32, 32)
    assert (cfg.num_vlm_layers, cfg.self_attn_every_n_layers, cfg.expert_width_multiplier) == (4, 2, 0.75)
    assert len(ckpt.model.vlm_with_expert.vlm.model.text_model.layers) == 4  # the 6-layer VLM cut to 4
    assert (ckpt.state_dim, ckpt.action_dim) == (6, 5)


def test_velocities_and_chunk_match_lerobot(ckpt, io):
    assert_velocities_and_chunk_match(ckpt, io)


def test_raw_observation_to_actions_match_lerobot(ckpt, io, variant):
    """vlarl's transforms (newline + tokenizer, MEAN_STD, resize with padding) + model + unnormalize."""
    inputs = raw_observation_inputs(ckpt, io, FIXTURE / variant)
    assert_actions_match(ckpt, inputs, io, (2, 50, 5) if variant == "checkpoint" else (2, 8, 3))


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(FIXTURE / "checkpoint", dst, ignore=shutil.ignore_patterns("io.*"))
    return dst


def _one_line_error(path: Path, *must_contain: str) -> str:
    return one_line_error(load_smolvla, path, *must_contain)


def test_checkpoint_of_another_architecture(copy):
    edit_config(copy, type="pi0")
    _one_line_error(copy, "'pi0'", "not 'smolvla'")


def test_missing_processor_file(copy):
    (copy / "vlm" / "preprocessor_config.json").unlink()
    _one_line_error(copy, "preprocessor_config.json")
    (copy / "policy_postprocessor.json").unlink()
    _one_line_error(copy, "policy_postprocessor.json")


def test_dims_that_do_not_fit_the_padding(copy):
    set_feature_shape(copy, "output_features", "action", [33])
    _one_line_error(copy, "action dim 33", "max_action_dim=32")


def test_unused_and_missing_keys_are_named(copy):
    assert_missing_and_unused_named(load_smolvla, copy)
