"""The reference fixtures (``tests/fixtures/reference/<name>``, written by ``scripts/reference_fixtures/*.py``) as
the parity tests read them: their inputs and outputs, the comparisons, and the one-line refusals of a damaged copy.

Each parity test module keeps what it checks; this module holds only the reading and comparing they share.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from policies.base import CheckpointError, PolicySpec
from policies.flow_vla.interface import FlowInputs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "reference"
TOL = 1e-4  # float32 models against the reference's own outputs


def fixture_io(folder: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """A fixture folder's tensors (``io.safetensors``) and its metadata (``io.json``), on one torch thread."""
    torch.set_num_threads(1)
    return load_file(str(folder / "io.safetensors")), json.loads((folder / "io.json").read_text())


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest absolute difference (in float64) of two tensors of one shape."""
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.double() - b.double()).abs().max().item()


def oft_spec() -> PolicySpec:
    """The env the OFT fixtures were made for: two cameras, proprio 8, 7-D actions in [-1, 1]."""
    return PolicySpec(state_dim=8, action_dim=7, action_low=[-1.0] * 7, action_high=[1.0] * 7,
                      image_keys=["third_person", "wrist"], instruction="put the bowl on the plate")


def spec_obs(spec: PolicySpec, batch: int = 2) -> dict[str, Any]:
    """A seeded raw observation for ``spec``: uint8 ``[B, 32, 32, 3]`` images per camera, a ``[B, state_dim]``
    state and the spec's instruction."""
    g = torch.Generator().manual_seed(0)
    return {"images": {k: torch.randint(0, 256, (batch, 32, 32, 3), dtype=torch.uint8, generator=g)
                       for k in spec.image_keys},
            "state": torch.randn(batch, spec.state_dim, generator=g), "instruction": [spec.instruction] * batch}


def holds_reference_weights(policy: torch.nn.Module, reference: torch.nn.Module) -> bool:
    """Every ``model.*`` tensor of ``policy`` equals the reference network's tensor of that name."""
    theirs = reference.state_dict()
    return all(torch.equal(v, theirs[k.removeprefix("model.")]) for k, v in policy.state_dict().items()
               if k.startswith("model."))


# ---- flow VLAs (pi0, pi0.5, SmolVLA): the fixtures LeRobot wrote ------------------------------------------------

def flow_model_inputs(io: dict[str, torch.Tensor]) -> FlowInputs:
    """The model-side inputs LeRobot fed its network (images sorted by camera name, tokens, padded state)."""
    cams = sorted(k for k in io if k.startswith("model.image."))
    return FlowInputs(
        images=[io[k] for k in cams],
        image_masks=[io[k.replace("image.", "image_mask.")] for k in cams],
        tokens=io["model.tokens"],
        token_masks=io["model.token_mask"],
        state=io["model.state"],
    )


def assert_velocities_and_chunk_match(ckpt: Any, io: dict[str, torch.Tensor]) -> None:
    """The network alone: per-step velocities ``[steps, B, chunk, max_action_dim]`` and the chunk, within TOL."""
    with torch.no_grad():
        chunk, velocities = ckpt.model.integrate(flow_model_inputs(io), io["noise"])
    assert velocities.shape == io["velocities"].shape
    assert (velocities - io["velocities"]).abs().max().item() <= TOL
    assert (chunk - io["chunk"]).abs().max().item() <= TOL


def raw_observation_inputs(ckpt: Any, io: dict[str, torch.Tensor], folder: Path) -> FlowInputs:
    """vlarl's transforms on the fixture's raw observation; its tokens and masks must be LeRobot's exactly."""
    tasks = json.loads((folder / "io.json").read_text())["tasks"]
    images = {k[len("raw.") :]: v for k, v in io.items() if k.startswith("raw.observation.images.")}
    inputs = ckpt.inputs(images, io["raw.observation.state"], tasks)
    assert torch.equal(inputs.tokens, io["model.tokens"])
    assert torch.equal(inputs.token_masks, io["model.token_mask"])
    return inputs


def assert_actions_match(ckpt: Any, inputs: FlowInputs, io: dict[str, torch.Tensor], shape: tuple) -> None:
    """Model + unnormalize from ``inputs``: actions of ``shape`` within TOL of LeRobot's."""
    with torch.no_grad():
        actions = ckpt.actions(ckpt.model.sample_actions(inputs, io["noise"]))
    assert actions.shape == io["actions"].shape == shape
    assert (actions - io["actions"]).abs().max().item() <= TOL


# ---- damaged copies: one line naming the fix ----------------------------------------------------------------

def edit_config(path: Path, **changes: Any) -> None:
    """Overwrite top-level keys of ``<path>/config.json``."""
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def set_feature_shape(path: Path, features: str, key: str, shape: list[int]) -> None:
    """Give ``<path>/config.json``'s ``features`` entry ``key`` (e.g. ``input_features``, ``observation.state``)
    another shape, as a checkpoint for other dims would have."""
    cfg = json.loads((path / "config.json").read_text())
    cfg[features][key]["shape"] = shape
    (path / "config.json").write_text(json.dumps(cfg))


def one_line_error(load: Callable[..., Any], path: Path, *must_contain: str, **kw: Any) -> str:
    """``load(path, **kw)`` raises a one-line ``CheckpointError`` that contains every string of ``must_contain``."""
    with pytest.raises(CheckpointError) as err:
        load(path, **kw)
    msg = str(err.value)
    assert "\n" not in msg
    for s in must_contain:
        assert s in msg, msg
    return msg


def assert_missing_and_unused_named(load: Callable[..., Any], path: Path) -> None:
    """A LeRobot-layout copy with ``state_proj.bias`` dropped and an extra tensor: both named in one line, and
    loaded with ``strict=False`` the report lists them."""
    weights = load_file(str(path / "model.safetensors"))
    weights["model.extra_head.weight"] = torch.zeros(2)
    del weights["model.state_proj.bias"]
    save_file(weights, str(path / "model.safetensors"))
    one_line_error(load, path, "1 missing keys ['state_proj.bias']", "1 unused keys ['extra_head.weight']")
    report = load(path, strict=False).report
    assert (report.missing, report.unused) == (["state_proj.bias"], ["extra_head.weight"])
