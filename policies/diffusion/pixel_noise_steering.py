"""Noise steering from pixels and words (``policy=noise_steering_cnn``): DSRL over a frozen flow or diffusion base
that reads cameras, with a noise actor that sees what the base sees.

The state-only noise actor (``policy=noise_steering``) reads ``obs["state"]``. Over a pixel VLA that is not
enough: in ManiSkill's RGB observation the state is the robot's own (no cube, no goal), and over several tasks the
instruction says which goal counts, so an actor on the state alone cannot know where to steer. Here the noise actor
is ``policy=cnn``'s network (a small CNN on the base's cameras, the instruction's hashed words and the state) with
a tanh-squashed Gaussian over the noise box; the off-policy critics read its image encoder (``critic_encoder``, by
default shared with the actor as DrQ-v2 does, the critic loss training it), and the replay keeps every row's frames
and words (``vlarl.algorithms.replay``). The base is frozen as in ``policy=noise_steering``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from policies.base import Policy, PolicySpec
from policies.cnn import CNNPolicy, CNNPolicyConfig
from policies.diffusion.noise_steering import NoiseSteeringConfig, NoiseSteeringPolicy
from policies.registry import register_policy


@dataclass
class PixelNoiseSteeringConfig(NoiseSteeringConfig):
    name: str = "noise_steering_cnn"
    # the noise actor's network: policy=cnn's keys of the same names (its light pixel-RLPD sizes by default)
    image_size: int = 48
    cnn_channels: list[int] = field(default_factory=lambda: [16, 32, 32])
    vision_dim: int = 128
    text_encoder: str = "hashed_embedding"  # "hashed_embedding" | "minilm" | "none" (the words are ignored)
    text_dim: int = 32
    use_state: bool = True
    critic_shares_encoder: bool = True  # the critics read the actor's CNN, which the critic loss trains


@register_policy("noise_steering_cnn", PixelNoiseSteeringConfig)
class PixelNoiseSteeringPolicy(NoiseSteeringPolicy):
    """``NoiseSteeringPolicy`` whose noise actor is a ``CNNPolicy`` on the base's cameras, words and state."""

    def make_noise_actor(self, config: PixelNoiseSteeringConfig, spec: PolicySpec) -> Policy:
        if not spec.image_keys:
            raise ValueError(f"policy=noise_steering_cnn reads the base policy's cameras, but the base at "
                             f"policy.base_path='{config.base_path}' reads none; use policy=noise_steering for a "
                             f"state-only base")
        return CNNPolicy(CNNPolicyConfig(
            image_size=config.image_size, cnn_channels=list(config.cnn_channels), vision_dim=config.vision_dim,
            text_encoder=config.text_encoder, text_dim=config.text_dim, use_state=config.use_state,
            hidden_sizes=list(config.hidden_sizes), activation=config.activation, chunk_size=config.chunk_size,
            init_log_std=config.init_log_std, squash=True, critic_shares_encoder=config.critic_shares_encoder),
            spec)

    def critic_encoder(self) -> nn.Module:
        """The critics' encoder of the cameras, words and state (``CNNPolicy.critic_encoder``): the noise actor's
        own CNN with ``critic_shares_encoder``, else a fresh one."""
        return self.noise_actor.critic_encoder()

    @property
    def critic_image_keys(self) -> list[str]:
        """The cameras the critics read: the base's (which the noise actor reads), not every camera of the env."""
        return list(self.noise_actor.spec.image_keys)
