"""The way back out for Diffusion Policy: vlarl writes LeRobot's layout and LeRobot acts the same.

``tests/fixtures/reference/diffusion_policy/roundtrip/`` was written by vlarl (``save_lerobot`` of a seeded
``policy=diffusion_policy`` with an environment-state split and two observation steps) and then loaded by LeRobot
0.4.4's own ``DiffusionPolicy.from_pretrained(strict=True)`` and processor pipelines, which acted on the saved
observations and noise (``reference_actions.safetensors``; scripts/reference_fixtures/diffusion_policy.py
--roundtrip). Also: vlarl's graph exports (torch.export, ONNX) of the same policy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from policies.base import PolicySpec
from policies.diffusion_policy.checkpoint import load_diffusion_policy
from policies.registry import make_policy, policy_config_class

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "diffusion_policy"
ROUNDTRIP = FIXTURE / "roundtrip"
TOL = 1e-4


def _spec(state_dim: int, action_dim: int) -> PolicySpec:
    return PolicySpec(state_dim=state_dim, action_dim=action_dim, action_low=[-1.0] * action_dim,
                      action_high=[1.0] * action_dim)


def test_lerobot_acts_on_vlarls_export_as_vlarl_does():
    torch.set_num_threads(1)
    io = load_file(str(ROUNDTRIP / "inputs.safetensors"))
    ref = load_file(str(ROUNDTRIP / "reference_actions.safetensors"))["actions"]
    robot, env = io["raw.observation.state"], io["raw.observation.environment_state"]
    ckpt = load_diffusion_policy(ROUNDTRIP)
    assert ckpt.report.missing == [] and ckpt.report.unused == []
    config = policy_config_class("diffusion_policy")(pretrained_path=str(ROUNDTRIP), chunk_size=0,
                                                     robot_state_dim=robot.shape[-1])
    policy = make_policy(config, _spec(robot.shape[-1] + env.shape[-1], ref.shape[-1])).eval()
    got = policy.act({"state": torch.cat([robot, env], -1)}, noise=io["noise"])
    assert got.shape == ref.shape
    assert (got - ref).abs().max().item() <= TOL
    assert (io["vlarl.actions"] - ref).abs().max().item() <= TOL  # the exporting policy itself, before the export


def test_a_loaded_lerobot_checkpoint_is_written_back_unchanged(tmp_path):
    src = FIXTURE / "state"
    ckpt = load_diffusion_policy(src)
    config = policy_config_class("diffusion_policy")(pretrained_path=str(src), chunk_size=0,
                                                     robot_state_dim=ckpt.config.state_dim)
    policy = make_policy(config, _spec(ckpt.config.state_dim + ckpt.config.env_state_dim, ckpt.config.action_dim))
    out = policy.save_lerobot(tmp_path / "back")
    a, b = load_file(str(src / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    cfg_a, cfg_b = json.loads((src / "config.json").read_text()), json.loads((out / "config.json").read_text())
    for key in ("input_features", "output_features", "horizon", "n_obs_steps", "down_dims", "prediction_type",
                "noise_scheduler_type", "num_inference_steps", "use_film_scale_modulation"):
        assert cfg_a[key] == cfg_b[key], key
    stats = "policy_preprocessor_step_3_normalizer_processor.safetensors"
    sa, sb = load_file(str(src / stats)), load_file(str(out / stats))
    assert sorted(sa) == sorted(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    back = load_diffusion_policy(out)
    assert back.norm_map["ENV"] == "MEAN_STD" and back.report.missing == back.report.unused == []


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["torch_export", "onnx"])
def test_graph_export_matches_eager(fmt, tmp_path):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
    from vlarl.export.formats import export_policy

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = policy_config_class("diffusion_policy")(chunk_size=4, robot_state_dim=3,
                                                     arch=dict(down_dims=[16, 32], n_groups=4, num_inference_steps=4))
    policy = make_policy(config, _spec(7, 2))
    report = export_policy(policy, tmp_path, formats=[fmt])["formats"][fmt]
    assert (tmp_path / report["file"]).is_file()
    assert set(report["max_abs_err"]) == {"1", "8"} and all(v <= TOL for v in report["max_abs_err"].values())


def test_vlarl_export_formats_lerobot_writes_the_layout_lerobot_read(tmp_path):
    """``export_policy(formats=[lerobot])`` (``vlarl-export``) on a policy=diffusion_policy with running statistics:
    the directory holds the files LeRobot read in the round-trip fixture, loads whole, and acts as the policy."""
    from vlarl.export.formats import export_policy

    torch.manual_seed(0)
    config = policy_config_class("diffusion_policy")(chunk_size=4, robot_state_dim=3,
                                                     arch=dict(down_dims=[16, 32], n_groups=4, num_inference_steps=4))
    policy = make_policy(config, _spec(7, 2))
    policy.update_normalization({"state": 3 * torch.randn(32, 7) + 1})
    report = export_policy(policy, tmp_path, formats=["lerobot"])["formats"]["lerobot"]
    assert all(v <= TOL for v in report["max_abs_err"].values())
    out = tmp_path / report["dir"]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in ROUNDTRIP.iterdir()
                                                           if p.name not in ("inputs.safetensors",
                                                                             "reference_actions.safetensors"))
    ckpt = load_diffusion_policy(out)
    assert ckpt.report.missing == ckpt.report.unused == [] and ckpt.config.env_state_dim == 4
