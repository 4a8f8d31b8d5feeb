"""Small CNN + text-embedding policy (``policy=cnn``) for fast CPU RL on image observations."""

from policies.cnn.modeling import CNNPolicy, CNNPolicyConfig

__all__ = ["CNNPolicy", "CNNPolicyConfig"]
