"""The policy configs of the exact OpenVLA and OpenVLA-OFT networks (``policy=openvla`` / ``openvla_oft``).

Light on purpose: the registry and Hydra read them at start-up, while the networks
(``policies.ar_vla.openvla_policy``) are imported only when one is built. OFT's config adds the keys only OFT
has (its continuous L1 head, the squashed SAC actor, the proprio token). The value head, freezing, LoRA and
dtype keys are every VLA's (``policies.vlm.policy_base.VLAPolicyConfig``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from policies.vlm.policy_base import VLAPolicyConfig


@dataclass
class OpenVLAPolicyConfig(VLAPolicyConfig):
    name: str = "openvla"
    size: str = "tiny"  # without pretrained_path: "tiny" | "published" (random weights)
    pretrained_path: str | None = None  # an OpenVLA / OpenVLA-OFT folder (HF layout), loaded whole
    unnorm_key: str | None = None  # dataset statistics entry that un-normalizes the checkpoint's actions
    num_images: int = 0  # cameras fed (0 = OpenVLA 1 / OFT 2 from a checkpoint, else the env's)
    # on an env without cameras: feed this many constant black frames (OpenVLA has no image mask); OFT then sees
    # the state only through its proprio token
    empty_cameras: int = 0
    arch: dict[str, Any] = field(default_factory=dict)  # OpenVLAConfig fields over the size's (a save records all)
    chunk_size: int = 4  # actions per chunk (T); OpenVLA's own is 1 (configs/policy/openvla.yaml)
    temperature: float = 1.0  # action tokens: the categorical over the 256 bins is tempered ...
    top_k: int = 0  # ... and cut to the top k (0 = all bins)
    gradient_checkpointing: bool = False  # recompute the Llama layers in backward
    # with freeze_vision and arch.use_film (OFT+): keep the FiLM maps fixed too, so the words' effect on the
    # towers' features stays what SFT made it (false: OFT+'s own recipe, the maps train with the towers frozen)
    freeze_film: bool = False
    # keep the language model's input embeddings fixed: FiLM's words are their average, so towers whose FiLM was
    # pretrained to find what the words name (scripts/pretrain_vision.py --grounded) keep reading the same words
    freeze_embeddings: bool = False
    # "" = none; "libero_oft": OpenVLA-OFT's LIBERO evaluation conventions around the network
    # (policies/processors/libero.py): TF-exact JPEG + Lanczos resize to 224 and 0.9 center crop of each camera,
    # the gripper from [0, 1] to +-1 and inverted on the way to the env (LIBERO: -1 opens, +1 closes)
    conventions: str = ""


@dataclass
class OpenVLAOFTPolicyConfig(OpenVLAPolicyConfig):
    name: str = "openvla_oft"
    action_head: str = "tokens"  # "tokens" (categorical over the 256 bins) | "l1" (Gaussian around the L1 head)
    log_std_init: float = -1.0  # action_head=l1: initial log std of the Gaussian (learned per action dim)
    # action_head=l1: tanh-squash that Gaussian (normalized units) into the action bounds, with a reparameterized
    # sample: the actor algorithm=sac|rlpd train (docs/sac_vla_actors.md); false = the PPO Gaussian, unchanged
    squash: bool = False
    # squash=true: the SAC critics' own image encoder (policies.cnn.modeling.CNNCriticEncoder) over the model's
    # cameras; keys override policies.cnn.modeling.CNNPolicyConfig's (e.g. image_size, cnn_channels, vision_dim)
    critic_cnn: dict[str, Any] = field(default_factory=dict)
    use_state: bool = True  # the proprio projector's token
