"""The way back out: an RL-changed exact model exported in its reference layout is what the reference ran.

Fixtures (``scripts/reference_fixtures/roundtrip.py``): vlarl loaded each committed tiny reference checkpoint,
changed every network tensor and the normalization statistics (a seeded ``perturb``; the statistics as recorded
there, since float32 ``exp`` may differ by an ulp between CPUs), exported it
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
    policy = RT.recorded_stats(RT.perturb(RT.vlarl_policy(family), family), family).eval()
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

    return LAYOUT_WRITERS[RT.FAMILIES[family][3]]()


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


def test_cli_exports_a_lora_tuned_vlarl_checkpoint_to_lerobot_and_openpi(tmp_path, capsys):
    """``vlarl-export formats=[lerobot,openpi]`` on a vlarl checkpoint of a LoRA-tuned pi0: the adapters are merged
    (no LoRA tensor, the reference's tensor set), and each layout loads back acting as the tuned policy."""
    from policies import make_policy
    from policies.flow_vla.exact import PI0PolicyConfig
    from policies.vlm import LoRAConfig
    from vlarl.export.cli import main as export_main

    torch.set_num_threads(1)
    base = RT.vlarl_policy("pi0")
    cfg = PI0PolicyConfig(pretrained_path=base.config.pretrained_path, chunk_size=0, num_steps=0,
                          lora=LoRAConfig(rank=2))
    torch.manual_seed(0)
    policy = make_policy(cfg, base.spec).eval()
    with torch.no_grad():  # LoRA B starts at zero; give the adapters something to merge
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    ckpt = policy.save_pretrained(tmp_path / "rl")
    out = tmp_path / "export"
    assert export_main([f"checkpoint={ckpt}", f"output={out}", "formats=[lerobot,openpi]"]) == 0
    manifest = json.loads((out / "export.json").read_text())["formats"]
    assert manifest["lerobot"]["lora_layers_merged"] > 0 and manifest["openpi"]["lora_layers_merged"] > 0
    source = load_file(str(Path(base.config.pretrained_path) / "model.safetensors"))
    lerobot = load_file(str(out / "lerobot" / "model.safetensors"))
    openpi = load_file(str(out / "openpi" / "model.safetensors"))
    assert sorted(lerobot) == sorted(source) and sorted(openpi) == sorted(k[len("model."):] for k in source)
    tensors, meta = RT.fixed_inputs(base, "pi0")
    want = policy.act(RT.obs_of(tensors, meta))
    for layout, module in (("lerobot", "lerobot_export"), ("openpi", "openpi_export")):
        writer = importlib.import_module(f"policies.flow_vla.{module}")
        got = writer.reload(base, out / layout).act(RT.obs_of(tensors, meta))
        assert (got - want).abs().max().item() <= TOL, layout
    assert (want - base.act(RT.obs_of(tensors, meta))).abs().max().item() > 100 * TOL  # LoRA changed the actions


def test_cli_refuses_a_layout_the_family_did_not_come_from_in_one_line(tmp_path, capsys):
    from vlarl.export.cli import main as export_main

    torch.set_num_threads(1)
    ckpt = RT.vlarl_policy("smolvla").save_pretrained(tmp_path / "rl")
    capsys.readouterr()
    for fmt, says in (("oft", "covers openvla_oft policies, not 'smolvla'"), ("openpi", "covers pi0 and pi05")):
        assert export_main([f"checkpoint={ckpt}", f"output={tmp_path / 'o'}", f"formats=[{fmt}]"]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and "\n" not in err
        assert not (tmp_path / "o" / fmt).exists() and not (tmp_path / "o" / f".{fmt}.tmp").exists()


def test_a_policy_trained_from_scratch_exports_its_running_statistics(tmp_path):
    """No source checkpoint: LeRobot's config from the network's, state MEAN_STD from the running statistics, actions
    MIN_MAX from the env bounds; LeRobot does not clip as vlarl does, so the check is left to the caller (exact
    False) and here it is compared where nothing clips."""
    from policies import make_policy
    from policies.base import PolicySpec
    from policies.flow_vla.exact import PI0PolicyConfig
    from vlarl.export import export_policy

    torch.set_num_threads(1)
    spec = PolicySpec(state_dim=3, action_dim=2, action_low=[-1.0, 0.0], action_high=[1.0, 2.0],
                      image_keys=["base"], image_size=[32, 32], instruction="push the cube")
    torch.manual_seed(0)
    policy = make_policy(PI0PolicyConfig(chunk_size=4, num_steps=2, arch={"max_state_dim": 8, "max_action_dim": 8}),
                         spec).eval()
    obs = {"state": torch.randn(16, 3)}
    policy.update_normalization(obs)
    export_policy(policy, tmp_path, formats=["lerobot"])
    folder = tmp_path / "lerobot"
    config = json.loads((folder / "config.json").read_text())
    assert config["normalization_mapping"] == {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MIN_MAX"}
    assert config["input_features"]["observation.state"]["shape"] == [3]  # the env's dims, not the padding 8
    assert config["output_features"]["action"]["shape"] == [2] and config["max_action_dim"] == 8
    stats = load_file(str(folder / "policy_postprocessor_step_0_unnormalizer_processor.safetensors"))
    assert torch.equal(stats["action.min"], torch.tensor([-1.0, 0.0]))
    assert torch.allclose(stats["observation.state.mean"], policy.state_norm.mean)
