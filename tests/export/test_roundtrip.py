"""The way back out: an RL-changed exact model exported in its reference layout is what the reference ran.

Fixtures (``scripts/reference_fixtures/roundtrip.py``): vlarl loaded each committed tiny reference checkpoint,
changed every network tensor and the normalization statistics (a seeded ``perturb``), exported it
(``formats=[lerobot]`` / ``[oft]``); the reference code, in its own environment, loaded that export with its own
``from_pretrained`` and computed actions on fixed observations and noise. Here vlarl re-exports from the same
committed inputs: the export must be the one the reference loaded (digest of every tensor and config), and
vlarl's actions must match the reference's within 1e-4.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "reference" / "roundtrip"
TOL = 1e-4


def _script():
    spec = importlib.util.spec_from_file_location("roundtrip_fixture",
                                                  ROOT / "scripts" / "reference_fixtures" / "roundtrip.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RT = _script()
FAMILIES = [f for f in RT.FAMILIES if (FIXTURE / f / "reference.json").is_file()]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request) -> str:
    torch.set_num_threads(1)
    return request.param


@pytest.fixture(scope="module")
def exported(family, tmp_path_factory):
    """(perturbed vlarl policy, the export folder) made now, from the committed inputs."""
    torch.manual_seed(0)
    policy = RT.perturb(RT.vlarl_policy(family), family).eval()
    folder = RT.export(policy, family, tmp_path_factory.mktemp(family))
    return policy, folder


def test_all_families_have_fixtures():
    assert set(FAMILIES) == {"smolvla", "pi0", "pi05", "oft"}, FAMILIES


def test_export_is_the_one_the_reference_loaded(family, exported):
    _, folder = exported
    recorded = json.loads((FIXTURE / family / "reference.json").read_text())["export_digest"]
    ours = RT.digest(folder)
    assert sorted(ours) == sorted(recorded)
    differing = [f for f in ours if ours[f] != recorded[f]]
    assert differing == [], f"files differ from what the reference loaded: {differing}"


def test_vlarl_actions_match_the_reference_run_of_the_export(family, exported):
    policy, _ = exported
    tensors = load_file(str(FIXTURE / family / "inputs.safetensors"))
    meta = json.loads((FIXTURE / family / "inputs.json").read_text())
    ours = RT.vlarl_actions(policy, tensors, meta)
    reference = load_file(str(FIXTURE / family / "reference.safetensors"))["actions"]
    assert ours.shape == reference.shape
    assert (ours - reference).abs().max().item() <= TOL
    # the change reached the reference: the unchanged checkpoint acts differently on the same inputs
    untouched = RT.vlarl_actions(RT.vlarl_policy(family).eval(), tensors, meta)
    assert (untouched - reference).abs().max().item() > 100 * TOL


def test_export_reloads_in_vlarl_with_the_changed_statistics(family, exported):
    """The layout's loader (vlarl's own) reads back the statistics the RL update left, not the checkpoint's."""
    policy, folder = exported
    reloaded = _writer(family).reload(policy, folder)
    _, ours = RT._network_and_stats(policy, family)
    _, back = RT._network_and_stats(reloaded, family)
    assert len(ours) == len(back) >= 2
    for (a_shift, a_scale), (b_shift, b_scale) in zip(ours, back, strict=True):
        assert torch.allclose(a_shift.double(), b_shift.double(), rtol=1e-6, atol=1e-6)
        assert torch.allclose(a_scale.double(), b_scale.double(), rtol=1e-6, atol=1e-6)


def _writer(family: str):
    from vlarl.export.formats import LAYOUT_WRITERS

    return importlib.import_module(LAYOUT_WRITERS[RT.FAMILIES[family][3]])


@pytest.mark.parametrize("family", ["smolvla", "pi0", "pi05", "oft"])
def test_unchanged_checkpoint_exports_to_the_reference_files(family, tmp_path):
    """Load + export without a change gives back the reference's own checkpoint: every tensor bit-equal, and
    LeRobot's config and processor files equal as JSON (OFT: its statistics equal)."""
    torch.set_num_threads(1)
    policy = RT.vlarl_policy(family).eval()
    out = _writer(family).write(policy, tmp_path / family)
    source = Path(out["source"])
    if family == "oft":
        from policies.vlm.checkpoint_mapping import read_safetensors_dir

        ref = read_safetensors_dir(source)
        ours = load_file(str(tmp_path / family / "model.safetensors"))
        for name in ("action_head", "proprio_projector"):
            part = next(source.glob(f"{name}--*checkpoint.pt"))
            ref.update({f"{name}.{k.removeprefix('module.')}": v
                        for k, v in torch.load(part, weights_only=True).items()})
            written = torch.load(tmp_path / family / f"{name}--latest_checkpoint.pt", weights_only=True)
            ours.update({f"{name}.{k.removeprefix('module.')}": v for k, v in written.items()})
        files = ["dataset_statistics.json"]
    else:
        ref = load_file(str(source / "model.safetensors"))
        ours = load_file(str(tmp_path / family / "model.safetensors"))
        files = ["config.json", "policy_preprocessor.json", "policy_postprocessor.json"]
    assert sorted(ours) == sorted(ref)
    assert all(torch.equal(ours[k], ref[k].to(ours[k].dtype)) for k in ref)
    for f in files:
        a, b = (json.loads((d / f).read_text()) for d in (source, tmp_path / family))
        assert _close(a, b), f


def _close(a, b) -> bool:
    """JSON equality with float lists compared to 1e-6 (q99 is rebuilt as q01 + (q99 - q01) in float32)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and sorted(a) == sorted(b) and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return abs(float(a) - float(b)) <= 1e-6 * max(1.0, abs(float(a)))
    return a == b
