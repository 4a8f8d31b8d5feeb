"""The Diffusion Policy network's hyperparameters, named as LeRobot 0.4.4's ``DiffusionConfig`` names them.

A LeRobot ``config.json`` maps onto ``DiffusionNetConfig`` field by field (``from_lerobot``), plus the
feature sizes that LeRobot keeps in ``input_features`` / ``output_features``: the robot state
(``observation.state``), the optional environment state (``observation.environment_state``), the cameras
(``observation.images.*``, all of one shape) and the action.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

STATE_KEY, ENV_KEY, ACTION_KEY, IMAGE_PREFIX = (
    "observation.state", "observation.environment_state", "action", "observation.images.")
SCHEDULERS = ("DDPM", "DDIM")
PREDICTIONS = ("epsilon", "sample")


@dataclass
class DiffusionNetConfig:
    """Sizes and switches of one Diffusion Policy network (Chi et al. 2023, as LeRobot builds it).

    ``horizon`` actions are denoised per call, conditioned on ``n_obs_steps`` observations; the policy executes
    ``n_action_steps`` of them starting at the last observation (index ``n_obs_steps - 1``)."""

    state_dim: int = 0
    action_dim: int = 0
    env_state_dim: int = 0  # 0 = no observation.environment_state input
    camera_keys: list[str] = field(default_factory=list)  # LeRobot feature names, in model order
    image_shape: list[int] = field(default_factory=list)  # [C, H, W] of every camera
    n_obs_steps: int = 2
    horizon: int = 16
    n_action_steps: int = 8
    vision_backbone: str = "resnet18"
    resize_shape: list[int] | None = None
    crop_ratio: float = 1.0
    crop_shape: list[int] | None = None
    crop_is_random: bool = True
    use_group_norm: bool = True
    spatial_softmax_num_keypoints: int = 32
    use_separate_rgb_encoder_per_camera: bool = False
    down_dims: list[int] = field(default_factory=lambda: [512, 1024, 2048])
    kernel_size: int = 5
    n_groups: int = 8
    diffusion_step_embed_dim: int = 128
    use_film_scale_modulation: bool = True
    noise_scheduler_type: str = "DDPM"
    num_train_timesteps: int = 100
    beta_schedule: str = "squaredcos_cap_v2"
    beta_start: float = 0.0001
    beta_end: float = 0.02
    prediction_type: str = "epsilon"
    clip_sample: bool = True
    clip_sample_range: float = 1.0
    num_inference_steps: int | None = None

    def __post_init__(self) -> None:
        self.down_dims = [int(d) for d in self.down_dims]
        self.image_shape = [int(d) for d in self.image_shape]
        if self.resize_shape is not None:
            self.resize_shape = [int(d) for d in self.resize_shape]
            self.crop_shape = ([int(self.resize_shape[0] * self.crop_ratio), int(self.resize_shape[1] * self.crop_ratio)]
                               if self.crop_ratio < 1.0 else None)
        if self.crop_shape is not None:
            self.crop_shape = [int(d) for d in self.crop_shape]

    def validate(self) -> None:
        """One-line refusals of sizes the network cannot be built with (LeRobot's own checks, plus ours)."""
        if self.vision_backbone != "resnet18":
            raise ValueError(f"vision_backbone='{self.vision_backbone}': vlarl builds resnet18 (LeRobot's default)")
        if self.noise_scheduler_type not in SCHEDULERS:
            raise ValueError(f"noise_scheduler_type='{self.noise_scheduler_type}' must be one of {SCHEDULERS}")
        if self.prediction_type not in PREDICTIONS:
            raise ValueError(f"prediction_type='{self.prediction_type}' must be one of {PREDICTIONS}")
        if self.beta_schedule not in ("squaredcos_cap_v2", "linear", "scaled_linear"):
            raise ValueError(f"beta_schedule='{self.beta_schedule}' is not one of squaredcos_cap_v2, linear, scaled_linear")
        factor = 2 ** len(self.down_dims)
        if self.horizon % factor:
            raise ValueError(f"horizon={self.horizon} must be a multiple of 2**len(down_dims)={factor}")
        if not 1 <= self.n_action_steps <= self.horizon - self.n_obs_steps + 1:
            raise ValueError(f"n_action_steps={self.n_action_steps} must be in [1, horizon - n_obs_steps + 1 = "
                             f"{self.horizon - self.n_obs_steps + 1}]")
        if self.state_dim <= 0 or self.action_dim <= 0:
            raise ValueError(f"state_dim={self.state_dim} and action_dim={self.action_dim} must be > 0")
        if self.camera_keys and len(self.image_shape) != 3:
            raise ValueError(f"image_shape={self.image_shape} must be [C, H, W] when cameras are given")
        if any(d % self.n_groups for d in self.down_dims):
            raise ValueError(f"every down_dims entry {self.down_dims} must be a multiple of n_groups={self.n_groups}")

    @property
    def inference_steps(self) -> int:
        return int(self.num_inference_steps or self.num_train_timesteps)

    @property
    def encoder_input_hw(self) -> list[int]:
        """(H, W) the ResNet sees: the crop, else the resize, else the camera's own size."""
        return list(self.crop_shape or self.resize_shape or self.image_shape[1:])

    def to_lerobot(self) -> dict[str, Any]:
        """The architecture fields of LeRobot's ``config.json`` (features and processor keys are the writer's)."""
        skip = {"state_dim", "action_dim", "env_state_dim", "camera_keys", "image_shape"}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}


def from_lerobot(cfg: dict[str, Any]) -> DiffusionNetConfig:
    """``DiffusionNetConfig`` from a LeRobot diffusion ``config.json`` dict (``"type": "diffusion"``)."""
    feats_in, feats_out = cfg.get("input_features", {}), cfg.get("output_features", {})
    if STATE_KEY not in feats_in or ACTION_KEY not in feats_out:
        raise ValueError(f"config.json needs input feature '{STATE_KEY}' and output feature '{ACTION_KEY}'")
    cams = [k for k, f in feats_in.items() if f.get("type") == "VISUAL"]
    shapes = {tuple(feats_in[k]["shape"]) for k in cams}
    if len(shapes) > 1:
        raise ValueError(f"cameras {cams} have different shapes {sorted(shapes)}; Diffusion Policy needs one shape")
    ours = {f.name for f in fields(DiffusionNetConfig)}
    kw = {k: v for k, v in cfg.items() if k in ours}
    return DiffusionNetConfig(
        **kw, state_dim=int(feats_in[STATE_KEY]["shape"][-1]), action_dim=int(feats_out[ACTION_KEY]["shape"][-1]),
        env_state_dim=int(feats_in[ENV_KEY]["shape"][-1]) if ENV_KEY in feats_in else 0,
        camera_keys=cams, image_shape=list(shapes.pop()) if shapes else [],
    )


@dataclass
class DiffusionPolicyConfig:
    """``policy=diffusion_policy``: where the network comes from and the DPPO chain's knobs (see ``policy.py``)."""

    name: str = "diffusion_policy"
    pretrained_path: str = ""  # a LeRobot diffusion directory, loaded whole (its sizes and statistics)
    chunk_size: int = 4  # executed actions per chunk (LeRobot's n_action_steps); 0 = the checkpoint's
    arch: dict[str, Any] = field(default_factory=dict)  # DiffusionNetConfig fields over the tiny ones (not a checkpoint's)
    robot_state_dim: int = 0  # the first dims of the env state are observation.state, the rest environment_state; 0 = all
    num_inference_steps: int = 0  # 0 = the network's own
    noise_scheduler_type: str = ""  # "" = the network's own; DDPM | DDIM
    rl_steps: int = 0  # DPPO: stochastic (scored) denoising steps at the end of the chain; 0 = all
    ddim_eta: float = 1.0  # DDIM's noise scale of the RL steps
    min_std: float = 0.1  # DPPO's floor on each step's std
    value_hidden: int = 64
    freeze_vision: bool = False  # keep the ResNet fixed (RL on the UNet only)
    freeze_state_norm: bool = False  # RL keeps the state statistics SFT fitted (vlarl.data.sft fits them directly)
