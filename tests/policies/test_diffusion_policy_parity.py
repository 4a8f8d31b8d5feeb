"""Diffusion Policy against LeRobot 0.4.4 itself (fixture: scripts/reference_fixtures/diffusion_policy.py).

Each variant is a tiny random-weight Diffusion Policy saved by LeRobot (its layout, processors and statistics),
fixed observations with a history axis, a fixed initial noise and the per-step noise LeRobot's DDPM scheduler
drew, and LeRobot's actions under DDPM and DDIM. The camera variant's ResNet weights are the fixture's seeded
redraw: ``lerobot_dir`` rebuilds LeRobot's ``model.safetensors`` byte for byte (its SHA-256 is checked).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from policies.base import CheckpointError, Policy, PolicySpec
from policies.diffusion_policy.checkpoint import load_diffusion_policy
from policies.diffusion_policy.config import from_lerobot
from policies.diffusion_policy.network import DiffusionPolicyNet

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "reference" / "diffusion_policy"
TOL = 1e-4
VARIANTS = ("camera", "state")


def _fixture_redraw():
    """The fixture scripts' seeded redraw (``_lerobot_common.redraw``) and the Diffusion Policy fixture's seed."""
    here = ROOT / "scripts" / "reference_fixtures"
    spec = importlib.util.spec_from_file_location("_lerobot_common_fixture", here / "_lerobot_common.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.redraw, 0  # SEED of scripts/reference_fixtures/diffusion_policy.py


def lerobot_dir(variant: str, tmp: Path) -> Path:
    """The variant's LeRobot directory, with ``model.safetensors`` rebuilt when the fixture keeps it split."""
    src = FIXTURE / variant
    if (src / "model.safetensors").is_file():
        return src
    dst = tmp / variant
    shutil.copytree(src, dst)
    header = (src / "model.header").read_bytes()
    entries = json.loads(header[8:])
    entries.pop("__metadata__", None)
    small = load_file(str(src / "model.small.safetensors"))
    redraw, seed = _fixture_redraw()
    net = DiffusionPolicyNet(from_lerobot(json.loads((src / "config.json").read_text())))
    redraw(net, seed)  # the fixture's rule on the same sorted parameters gives LeRobot's values
    drawn = net.state_dict()
    data = bytearray(max(e["data_offsets"][1] for e in entries.values()))
    for name, e in entries.items():
        t = small[name] if name in small else drawn[name]
        assert e["dtype"] == "F32" and list(t.shape) == e["shape"], name
        a, b = e["data_offsets"]
        data[a:b] = t.detach().contiguous().numpy().tobytes()
    blob = header + bytes(data)
    expected = json.loads((src / "io.json").read_text())["model_sha256"]
    assert hashlib.sha256(blob).hexdigest() == expected, "rebuilt model.safetensors differs from LeRobot's"
    (dst / "model.safetensors").write_bytes(blob)
    for f in ("model.header", "model.small.safetensors"):
        (dst / f).unlink()
    return dst


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def ckpt_dir(variant, tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    return lerobot_dir(variant, tmp_path_factory.mktemp("dp"))


@pytest.fixture(scope="module")
def io(variant) -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURE / variant / "io.safetensors"))


def test_checkpoint_loads_whole(ckpt_dir, variant):
    ckpt = load_diffusion_policy(ckpt_dir)
    assert ckpt.report.missing == [] and ckpt.report.unused == []
    cfg = ckpt.config
    if variant == "camera":
        assert cfg.camera_keys == ["observation.images.front", "observation.images.wrist"]
        assert cfg.crop_shape == [32, 32] and cfg.use_separate_rgb_encoder_per_camera
        assert len(ckpt.net.diffusion.rgb_encoder) == 2
    else:
        assert (cfg.state_dim, cfg.env_state_dim, cfg.prediction_type) == (5, 6, "sample")
        assert not hasattr(ckpt.net.diffusion, "rgb_encoder")


@pytest.mark.parametrize("scheduler", ["DDPM", "DDIM"])
def test_model_level_actions_match_lerobot(ckpt_dir, io, scheduler):
    """The model-level call on LeRobot's own pre-processed batch, with its initial and per-step noise."""
    ckpt = load_diffusion_policy(ckpt_dir, overrides={"noise_scheduler_type": scheduler})
    tag = scheduler.lower()
    step_noise = io[f"{tag}.step_noise"]
    K = len(ckpt.net.diffusion.schedule)
    if scheduler == "DDPM":  # LeRobot draws one noise per step but the last (t = 0)
        assert step_noise.shape[0] == K - 1
        step_noise = torch.cat([step_noise, torch.zeros_like(step_noise[:1])])
    else:
        assert step_noise.numel() == 0  # DDIM with eta = 0 draws nothing
        step_noise = None
    cams = io.get("model.observation.images")
    with torch.no_grad():
        got = ckpt.net.diffusion.generate(io["model.observation.state"], io["noise"], cams,
                                          io.get("model.observation.environment_state"), step_noise)
    want = io[f"{tag}.actions"]
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= TOL
    assert (ckpt.actions(got) - io[f"{tag}.env_actions"]).abs().max().item() <= TOL


def test_raw_features_through_vlarls_processors_match_lerobot(ckpt_dir, io):
    """vlarl's normalizers on the raw observation history give LeRobot's model inputs."""
    ckpt = load_diffusion_policy(ckpt_dir)
    x = ckpt.model_inputs({k[len("raw."):]: v for k, v in io.items() if k.startswith("raw.")})
    assert (x["state"] - io["model.observation.state"]).abs().max().item() <= 1e-6
    if "model.observation.images" in io:
        assert (x["images"] - io["model.observation.images"]).abs().max().item() <= 1e-5
    if "model.observation.environment_state" in io:
        assert (x["env_state"] - io["model.observation.environment_state"]).abs().max().item() <= 1e-6


def test_rl_policy_loads_the_checkpoint_and_acts_as_lerobot_deploys_it(ckpt_dir, io, variant):
    """``policy=diffusion_policy`` with ``pretrained_path``: vlarl's observation (latest frame, uint8 images)
    through the public loader, the chain with LeRobot's noise, vs LeRobot's select_action pipeline (a fresh queue
    holds the latest observation n_obs_steps times)."""
    from policies.registry import make_policy, policy_config_class

    ckpt = load_diffusion_policy(ckpt_dir)
    cfg = ckpt.config
    raw = {k[len("raw."):]: v[:, -1] for k, v in io.items() if k.startswith("raw.")}
    state = raw["observation.state"]
    if cfg.env_state_dim:
        state = torch.cat([state, raw["observation.environment_state"]], -1)
    names = [k.split(".")[-1] for k in cfg.camera_keys]
    spec = PolicySpec(state_dim=state.shape[-1], action_dim=cfg.action_dim, action_low=[-1.0] * cfg.action_dim,
                      action_high=[1.0] * cfg.action_dim, image_keys=names,
                      image_size=cfg.image_shape[1:] if names else None)
    config = policy_config_class("diffusion_policy")(pretrained_path=str(ckpt_dir), chunk_size=0,
                                                     robot_state_dim=cfg.state_dim)
    policy = make_policy(config, spec).eval()
    # the fixture's frames are k / 255: vlarl's uint8 images carry them exactly
    images = {n: (raw[k] * 255).round().to(torch.uint8).permute(0, 2, 3, 1)
              for n, k in zip(names, cfg.camera_keys, strict=True)}
    obs = {"state": state, "images": images, "instruction": [""] * state.shape[0]}
    step_noise = io["pipeline.step_noise"]
    sch = policy.net.diffusion.schedule
    noise = io["noise"]
    with torch.no_grad():
        cond, _ = policy._cond(obs)
        extra = torch.cat([step_noise, torch.zeros_like(step_noise[:1])]) if step_noise.numel() else None
        got = policy._unnormalize(policy.net.diffusion.denoise(cond, noise, extra))
        det = policy.act(obs, noise=noise)
    assert len(sch) == cfg.inference_steps
    assert (got - io["pipeline.env_actions"]).abs().max().item() <= TOL
    if extra is None:  # DDIM (eta = 0): act() is LeRobot's deployed chain
        assert (det - io["pipeline.env_actions"]).abs().max().item() <= TOL


def test_vlarl_checkpoint_round_trips(ckpt_dir, tmp_path):
    from policies.registry import make_policy, policy_config_class

    ckpt = load_diffusion_policy(ckpt_dir)
    cfg = ckpt.config
    S = cfg.state_dim + cfg.env_state_dim
    names = [k.split(".")[-1] for k in cfg.camera_keys]
    spec = PolicySpec(state_dim=S, action_dim=cfg.action_dim, action_low=[-1.0] * cfg.action_dim,
                      action_high=[1.0] * cfg.action_dim, image_keys=names,
                      image_size=cfg.image_shape[1:] if names else None)
    config = policy_config_class("diffusion_policy")(pretrained_path=str(ckpt_dir), chunk_size=0,
                                                     robot_state_dim=cfg.state_dim)
    policy = make_policy(config, spec).eval()
    g = torch.Generator().manual_seed(3)
    obs = {"state": torch.randn(2, S, generator=g), "instruction": ["", ""],
           "images": {n: torch.randint(0, 256, (2, *cfg.image_shape[1:], 3), generator=g, dtype=torch.uint8)
                      for n in names}}
    policy.save_pretrained(tmp_path / "p")
    back = Policy.from_pretrained(tmp_path / "p").eval()
    assert type(back) is type(policy) and back.fixed_norm
    assert torch.equal(back.act(obs), policy.act(obs))


def test_bad_checkpoints_are_one_line_refusals(tmp_path):
    src = FIXTURE / "state"
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    cfg = json.loads((src / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "down_dims": [16, 32, 128]}))
    with pytest.raises(CheckpointError, match="differ in shape") as e:
        load_diffusion_policy(bad)
    assert "\n" not in str(e.value)
    (bad / "config.json").write_text(json.dumps({**cfg, "type": "act"}))
    with pytest.raises(CheckpointError, match="not 'diffusion'"):
        load_diffusion_policy(bad)
    (bad / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(src / "model.safetensors"))
    from safetensors.torch import save_file

    save_file({**tensors, "diffusion.extra.weight": torch.zeros(1)}, str(bad / "model.safetensors"))
    with pytest.raises(CheckpointError, match="1 unused keys"):
        load_diffusion_policy(bad)
