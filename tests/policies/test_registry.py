"""Explicit construction: ``make_policy(config, spec)`` and ``Policy.from_pretrained(dir, **overrides)`` build the
class registered for each family from its config alone, leave the caller's config as it was, and load the
checkpoints main wrote before each exact network had its own family (``flow_vla`` / ``ar_vla`` with
``architecture=<network>``). Tiny random-weight models built here."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from vla_helpers import make_obs

from policies import Policy, PolicySpec, available_policies, make_policy, policy_class, policy_config_class
from policies.registry import upgrade_saved
from policies.spec import CheckpointError
from policies.vlm.backbone import BackboneConfig

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]

# every registered family -> the class it builds (a family registered without an entry here fails the first test)
EXPECTED = {
    "mlp": "MLPPolicy", "cnn": "CNNPolicy", "diffusion": "DiffusionPolicy", "noise_steering": "NoiseSteeringPolicy",
    "noise_steering_cnn": "PixelNoiseSteeringPolicy",
    "ar_vla": "ARVLAPolicy", "openvla": "OpenVLAPolicy", "openvla_oft": "OpenVLAOFTPolicy",
    "flow_vla": "FlowVLAPolicy", "pi0": "PI0Policy", "pi05": "PI05Policy", "smolvla": "SmolVLAPolicy",
    "diffusion_policy": "DiffusionPolicyRL", "pi0fast": "PI0FastPolicy",
}


def _config(name: str, spec: PolicySpec, tmp_path: Path):
    """The family's config from its defaults alone (noise steering: plus the frozen base it needs; from pixels, a
    base that reads the cameras)."""
    cfg = policy_config_class(name)()
    if name in ("noise_steering", "noise_steering_cnn"):
        base = tmp_path / "base"
        torch.manual_seed(0)
        base_cfg = (policy_config_class("diffusion")(chunk_size=2) if name == "noise_steering" else
                    policy_config_class("smolvla")(chunk_size=2, num_steps=2))
        make_policy(base_cfg, spec).save_pretrained(base)
        cfg.base_path = str(base)
    return cfg


def test_every_registered_family_is_checked_here():
    assert sorted(EXPECTED) == available_policies()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_alone_builds_the_family_and_a_save_loads_back_as_it(name, vla_spec, obs, tmp_path):
    cfg = _config(name, vla_spec, tmp_path)
    before = asdict(cfg)
    torch.manual_seed(0)
    pol = make_policy(cfg, vla_spec)
    assert type(pol).__name__ == EXPECTED[name] and type(pol) is policy_class(name)
    assert pol.name == pol.config.name == name
    assert asdict(cfg) == before  # the caller's config is not touched (resolved values live in pol.config)
    pol.eval()
    a = pol.act(obs)
    assert a.shape == (3, pol.chunk_size, vla_spec.action_dim)
    back = Policy.from_pretrained(pol.save_pretrained(tmp_path / "ckpt")).eval()
    assert type(back) is type(pol) and json.loads((tmp_path / "ckpt" / "config.json").read_text())["policy"] == name
    torch.testing.assert_close(back.act(obs), a, atol=1e-6, rtol=0)


def test_from_pretrained_overrides_fields_and_refuses_unknown_ones(vla_spec, tmp_path):
    cfg = policy_config_class("smolvla")(arch={"empty_cameras": 1})
    make_policy(cfg, vla_spec).save_pretrained(tmp_path)
    pol = Policy.from_pretrained(tmp_path, noise_level=0.3, freeze_state_norm=True)
    assert pol.config.noise_level == 0.3 and pol.config.freeze_state_norm
    with pytest.raises(ValueError, match=r"overrides \['likelyhood'\] are not fields of SmolVLAPolicyConfig") as e:
        Policy.from_pretrained(tmp_path, likelyhood="flow_noise")
    assert "\n" not in str(e.value)



def test_saved_spec_reads_the_spec_without_building_the_policy(vla_spec, tmp_path, monkeypatch):
    cfg = policy_config_class("smolvla")(arch={"empty_cameras": 1})
    make_policy(cfg, vla_spec).save_pretrained(tmp_path / "ck")
    (tmp_path / "ck" / "model.safetensors").write_bytes(b"not weights")  # never read
    monkeypatch.setattr(Policy, "_restore", lambda *a: pytest.fail("saved_spec built the policy"))
    spec = Policy.saved_spec(tmp_path / "ck")
    assert (spec.image_keys, spec.state_dim, spec.instruction) == (vla_spec.image_keys, vla_spec.state_dim,
                                                                   vla_spec.instruction)
    with pytest.raises(CheckpointError, match="is missing"):
        Policy.saved_spec(tmp_path)

def test_make_policy_refuses_another_familys_config(vla_spec):
    cfg = policy_config_class("pi0")()
    cfg.name = "smolvla"
    with pytest.raises(TypeError, match="policy=smolvla takes a SmolVLAPolicyConfig, got a PI0PolicyConfig"):
        make_policy(cfg, vla_spec)


def _as_main_wrote_it(directory: Path, old_name: str, extra: dict, drop: tuple[str, ...] = ()) -> None:
    """Rewrite a checkpoint's config.json in main's earlier layout: the look-alike family's name, the network as
    ``architecture`` and the look-alike's own keys beside the live ones (``drop``: keys it did not have)."""
    meta = json.loads((directory / "config.json").read_text())
    arch = meta["policy"]
    kept = {k: v for k, v in meta["config"].items() if k not in drop}
    meta["config"] = {**kept, **extra, "name": old_name, "architecture": arch}
    meta["policy"] = old_name
    (directory / "config.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("name", ["smolvla", "pi0", "openvla_oft"])
def test_checkpoints_of_the_earlier_layout_load_as_their_network(name, vla_spec, tmp_path):
    obs = make_obs(2)
    kw = {"arch": {"empty_cameras": 1}} if name != "openvla_oft" else {"action_head": "l1", "chunk_size": 2}
    torch.manual_seed(0)
    pol = make_policy(policy_config_class(name)(**kw), vla_spec).eval()
    pol.save_pretrained(tmp_path)
    if name == "openvla_oft":  # ar_vla's keys; OpenVLA read gradient checkpointing from backbone.*
        extra = {"backbone": {**asdict(BackboneConfig()), "gradient_checkpointing": True}, "n_action_bins": 256,
                 "action_token_strategy": "added", "decoding": "parallel"}
        _as_main_wrote_it(tmp_path, "ar_vla", extra, drop=("gradient_checkpointing",))
    else:
        extra = {"backbone": asdict(BackboneConfig()), "expert_width": 32, "expert_layers": 2, "expert_heads": 2,
                 "use_state": True}
        _as_main_wrote_it(tmp_path, "flow_vla", extra)
    back = Policy.from_pretrained(tmp_path).eval()
    assert type(back) is type(pol) and back.name == name
    assert torch.equal(back.act(obs), pol.act(obs))
    if name == "openvla_oft":
        assert back.config.gradient_checkpointing


def test_upgrade_saved_converts_only_known_layouts_and_leaves_its_input():
    meta = {"policy": "flow_vla", "config": {"architecture": "pi05", "chunk_size": 4}, "spec": {}}
    name, new = upgrade_saved(meta)
    assert name == new["policy"] == new["config"]["name"] == "pi05" and "architecture" not in new["config"]
    assert meta["config"]["architecture"] == "pi05" and meta["policy"] == "flow_vla"
    assert upgrade_saved({"policy": "flow_vla", "config": {"architecture": "lookalike"}})[0] == "flow_vla"
    assert upgrade_saved({"policy": "mlp", "config": {"chunk_size": 2}})[0] == "mlp"
    with pytest.raises(ValueError, match="architecture='gr00t' is not a known layout"):
        upgrade_saved({"policy": "flow_vla", "config": {"architecture": "gr00t"}})


def test_no_new_dispatch():
    """Construction is explicit: no ``__new__`` under ``policies/`` (string imports: tests/test_string_imports.py)."""
    for path in sorted((ROOT / "policies").rglob("*.py")):
        assert "__new__" not in path.read_text(), path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("experiment,name", [("pushcube_flow_sft_rl", "smolvla"), ("pushcube_oft_sft_rl", "openvla_oft")])
def test_a_run_saved_in_the_earlier_layout_resumes_as_its_network(experiment, name, tmp_path):
    """``resume=<run dir>`` on a config.yaml written before the split (look-alike name + ``architecture`` +
    the look-alike's dead keys) loads as the network's family with the same live values."""
    import yaml

    from vlarl.config.loader import ConfigError, load_saved_config, load_train_config, to_yaml

    now = load_train_config([f"experiment={experiment}"])
    assert now.policy.name == name
    doc = yaml.safe_load(to_yaml(now))
    old = "ar_vla" if name.startswith("openvla") else "flow_vla"
    doc["policy"] = {**doc["policy"], "name": old, "architecture": name, "backbone": asdict(BackboneConfig()),
                     "expert_width": 32, "decoding": "parallel"}
    if old == "ar_vla":  # main's OpenVLA read it from backbone.gradient_checkpointing
        doc["policy"].pop("gradient_checkpointing")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(doc))
    back = load_saved_config(tmp_path)
    assert type(back.policy) is type(now.policy)
    assert asdict(back.policy) == asdict(now.policy)
    doc["policy"] = {**yaml.safe_load(to_yaml(now))["policy"], "chunk_sise": 3}  # today's layout: a typo still fails
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="chunk_sise"):
        load_saved_config(tmp_path)
