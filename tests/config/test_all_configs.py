"""Every YAML under configs/ composes into its typed config and is built: the run's policy on the meta device,
optimizer, algorithm, reward and placement (``vlarl.config.construct`` via ``load_train_config``) and the env's
own start-up check. A YAML that only works with other groups names them here (``COMPANIONS``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from simulators.base import EnvError
from tests.helpers.recipes import PPO
from vlarl.cli import _validate_env
from vlarl.config import load_eval_config, load_train_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TRAIN_GROUPS = ("env", "policy", "algorithm", "placement", "reward", "experiment")
# groups a YAML is meant to be used with (the default experiment pins a ManiSkill controller; image policies
# need a camera env; split placements give the env one core of two; the critic and RLPD's demonstrations need a path)
COMPANIONS = {
    "env/libero_": ["~experiment"],
    "env/robosuite_": ["~experiment"],
    "env/franka": ["~experiment", "algorithm.num_minibatches=2"],  # one arm: 50 chunk steps per iteration
    "policy/cnn": ["env=maniskill_pushcube_rgb"],
    "policy/openvla": ["env=maniskill_pushcube_rgb"],  # OpenVLA and OFT read one camera image by default
    "placement/disaggregated": ["env.num_workers=1"],
    "placement/hybrid": ["env.num_workers=1"],
    "reward/vlm_critic": ["reward.critic_path={tmp}"],
    # SAC's actor is a squashed, reparameterized MLP; RLPD also mixes demonstrations into every batch
    "algorithm/sac": ["policy.squash=true"],
    "algorithm/rlpd": ["algorithm.demos={tmp}", "policy.squash=true"],
    "algorithm/dsrl": ["policy=noise_steering", "policy.base_path={diffusion}"],
    "algorithm/pa_rl": ["algorithm.demos={tmp}", "policy=diffusion"],  # an actor that imitates (sft_loss)
    "experiment/pushcube_mlp_rlpd": ["algorithm.demos={tmp}"],
    "experiment/pickcube_mlp_rlpd": ["algorithm.demos={tmp}"],
    "experiment/pushcube_rlpd_fast": ["algorithm.demos={tmp}"],
    # its demonstrations hold frames (scripts/multitask_sft_rl.py writes them); built here without, as its SFT stage
    "experiment/multitask_oft_rlpd": ["algorithm.demos=''", "algorithm.demo_ratio=0"],
    "experiment/multitask_oft_pa_rl": ["algorithm.demos=''", "algorithm.demo_ratio=0"],
    "experiment/pushcube_oft_pa_rl": ["algorithm.demos={tmp}"],
    # noise steering (DSRL) wraps a saved diffusion policy: {diffusion} is a tiny one written for the test
    "policy/noise_steering": ["policy.base_path={diffusion}"],
    "experiment/pushcube_diffusion_dsrl": ["policy.base_path={diffusion}"],
    # pixel noise steering wraps a saved base that reads a camera: {pixel_flow} is a tiny SmolVLA written for the test
    "policy/noise_steering_cnn": ["env=maniskill_pushcube_rgb", "algorithm=dsrl", "algorithm.buffer_size=20000",
                                  "policy.base_path={pixel_flow}"],
    "experiment/multitask_smolvla_dsrl": ["policy.base_path={pixel_flow}"],
}


def _tiny_diffusion(directory: Path) -> Path:
    from policies.diffusion import DiffusionPolicyConfig
    from policies.registry import make_policy
    from vlarl.config.construct import probe_spec

    make_policy(DiffusionPolicyConfig(chunk_size=4), probe_spec(None)).save_pretrained(directory)
    return directory


def _tiny_pixel_flow(directory: Path) -> Path:
    from dataclasses import replace

    from policies.flow_vla import SmolVLAPolicyConfig
    from policies.registry import make_policy
    from vlarl.config.construct import probe_spec

    spec = replace(probe_spec(None), image_keys=["base_camera"], image_size=[64, 64])
    make_policy(SmolVLAPolicyConfig(chunk_size=4, num_steps=2, arch={"empty_cameras": 0}), spec).save_pretrained(directory)
    return directory


def _yaml(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def test_every_yaml_is_covered():
    covered = {f"{g}/{n}" for g in TRAIN_GROUPS for n in _yaml(g)} | {f"robot/{n}" for n in _yaml("robot")}
    on_disk = {f"{p.parent.name}/{p.stem}" for p in CONFIGS.glob("*/*.yaml")}
    assert on_disk == covered, f"configs/ groups this test does not know: {sorted(on_disk - covered)}"


@pytest.mark.parametrize("choice", [f"{g}={n}" for g in TRAIN_GROUPS for n in _yaml(g)])
def test_train_yaml_composes_and_builds(choice, tmp_path):
    key = choice.replace("=", "/")
    opts = [o for prefix, opts in COMPANIONS.items() if key.startswith(prefix) for o in opts]
    diffusion = _tiny_diffusion(tmp_path / "diffusion") if any("{diffusion}" in o for o in opts) else None
    pixel_flow = _tiny_pixel_flow(tmp_path / "pixel_flow") if any("{pixel_flow}" in o for o in opts) else None
    extra = [o.format(tmp=tmp_path, diffusion=diffusion, pixel_flow=pixel_flow) for o in opts]
    cfg = load_train_config([PPO, choice, *extra])  # builds policy (meta), optimizer, algorithm, reward, placement
    group, name = choice.split("=")
    if group == "experiment":
        assert cfg.experiment_name == name
    if cfg.env.name == "maniskill_gpu" and not torch.cuda.is_available():
        with pytest.raises(EnvError, match="needs a CUDA GPU"):  # refused up front, in one line, on CPU machines
            _validate_env(cfg.env)
        return
    _validate_env(cfg.env)  # the simulator's own start-up check (task id, obs mode, backend)


def test_eval_yaml_composes():
    cfg = load_eval_config(["checkpoint=some/dir"])
    assert cfg.checkpoint == "some/dir" and cfg.num_workers == 1


@pytest.mark.parametrize("robot", _yaml("robot"))
def test_robot_yaml_composes(robot):
    from robots.deploy import load_config

    cfg = load_config([f"robot={robot}", "robot.franky.ip=192.0.2.1", "checkpoint=some/dir"])
    assert cfg.robot.franky.ip == "192.0.2.1" and cfg.checkpoint == "some/dir"
