"""The policy config of pi0-FAST (``policy=pi0fast``), registered here by config; the network and its RL policy
(``policies.ar_vla.pi0fast_policy``) are imported only when one is built."""

from __future__ import annotations

from dataclasses import dataclass

from policies.registry import register_family


@dataclass
class PI0FastPolicyConfig:
    name: str = "pi0fast"
    # a LeRobot pi0_fast directory (save_pretrained output), loaded whole; "" = a tiny random model built here
    pretrained_path: str = ""
    vlm_path: str = ""  # local PaliGemma tokenizer folder when the checkpoint does not name one that exists
    fast_path: str = ""  # local FAST tokenizer folder (physical-intelligence/fast layout), likewise
    chunk_size: int = 0  # actions per chunk sent to the env (0 = the checkpoint's n_action_steps; tiny: 4)
    max_decoding_steps: int = 0  # answer tokens decoded per chunk (0 = the checkpoint's; tiny: 12)
    temperature: float = 1.0  # sample(): softmax temperature of the token categorical (act() is greedy)
    # value head on the hidden state at <bos> (which sees images and prompt): "hidden"; "none": no value head
    value_from: str = "hidden"
    freeze_vision: bool = False  # keep SigLIP (and the projector) fixed

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"policy.temperature={self.temperature} must be > 0 (act() is the greedy decoder)")


register_family("pi0fast", PI0FastPolicyConfig, "policies.ar_vla.pi0fast_policy:PI0FastPolicy")
