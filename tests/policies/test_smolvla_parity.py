"""SmolVLA against LeRobot 0.4.4 itself (fixture: scripts/reference_fixtures/smolvla.py).

The fixture holds a tiny random-weight SmolVLA saved by LeRobot (its own layout, processors and
MEAN_STD statistics), fixed observations and noise, and LeRobot's per-step velocities and actions.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from policies.base import CheckpointError
from policies.flow_vla.interface import FlowInputs
from policies.flow_vla.smolvla_checkpoint import load_smolvla

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "smolvla"
TOL = 1e-4


VARIANTS = ("checkpoint", "variant")  # published settings; special tokens, shallow expert, empty camera, ...


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def io(variant) -> dict[str, torch.Tensor]:
    torch.set_num_threads(1)
    return load_file(str(FIXTURE / variant / "io.safetensors"))


@pytest.fixture(scope="module")
def ckpt(variant):
    return load_smolvla(FIXTURE / variant)


def model_inputs(io: dict[str, torch.Tensor]) -> FlowInputs:
    cams = sorted(k for k in io if k.startswith("model.image."))
    return FlowInputs(
        images=[io[k] for k in cams],
        image_masks=[io[k.replace("image.", "image_mask.")] for k in cams],
        tokens=io["model.tokens"],
        token_masks=io["model.token_mask"],
        state=io["model.state"],
    )


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
    with torch.no_grad():
        chunk, velocities = ckpt.model.integrate(model_inputs(io), io["noise"])
    assert velocities.shape == io["velocities"].shape
    assert (velocities - io["velocities"]).abs().max().item() <= TOL
    assert (chunk - io["chunk"]).abs().max().item() <= TOL


def test_raw_observation_to_actions_match_lerobot(ckpt, io, variant):
    """vlarl's transforms (newline + tokenizer, MEAN_STD, resize with padding) + model + unnormalize."""
    tasks = json.loads((FIXTURE / variant / "io.json").read_text())["tasks"]
    images = {k[len("raw.") :]: v for k, v in io.items() if k.startswith("raw.observation.images.")}
    inputs = ckpt.inputs(images, io["raw.observation.state"], tasks)
    assert torch.equal(inputs.tokens, io["model.tokens"])
    assert torch.equal(inputs.token_masks, io["model.token_mask"])
    with torch.no_grad():
        actions = ckpt.actions(ckpt.model.sample_actions(inputs, io["noise"]))
    assert actions.shape == io["actions"].shape == ((2, 50, 5) if variant == "checkpoint" else (2, 8, 3))
    assert (actions - io["actions"]).abs().max().item() <= TOL


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(FIXTURE / "checkpoint", dst, ignore=shutil.ignore_patterns("io.*"))
    return dst


def _edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def _one_line_error(path: Path, *must_contain: str) -> str:
    with pytest.raises(CheckpointError) as err:
        load_smolvla(path)
    msg = str(err.value)
    assert "\n" not in msg
    for s in must_contain:
        assert s in msg, msg
    return msg


def test_checkpoint_of_another_architecture(copy):
    _edit_config(copy, type="pi0")
    _one_line_error(copy, "'pi0'", "not 'smolvla'")


def test_missing_processor_file(copy):
    (copy / "vlm" / "preprocessor_config.json").unlink()
    _one_line_error(copy, "preprocessor_config.json")
    (copy / "policy_postprocessor.json").unlink()
    _one_line_error(copy, "policy_postprocessor.json")


def test_dims_that_do_not_fit_the_padding(copy):
    cfg = json.loads((copy / "config.json").read_text())
    cfg["output_features"]["action"]["shape"] = [33]
    (copy / "config.json").write_text(json.dumps(cfg))
    _one_line_error(copy, "action dim 33", "max_action_dim=32")


def test_unused_and_missing_keys_are_named(copy):
    weights = load_file(str(copy / "model.safetensors"))
    weights["model.extra_head.weight"] = torch.zeros(2)
    del weights["model.state_proj.bias"]
    save_file(weights, str(copy / "model.safetensors"))
    _one_line_error(copy, "1 missing keys ['state_proj.bias']", "1 unused keys ['extra_head.weight']")
    report = load_smolvla(copy, strict=False).report
    assert (report.missing, report.unused) == (["state_proj.bias"], ["extra_head.weight"])
