"""Every VLA policy YAML composes through Hydra into its dataclass and builds a working policy."""

from __future__ import annotations

import pytest

from policies import make_policy
from tests.helpers.recipes import PPO
from vlarl.config.loader import load_train_config

VLA_CONFIGS = ["ar_vla", "ar_vla_paligemma", "ar_vla_smolvlm", "flow_vla", "flow_vla_noise", "diffusion",
               "diffusion_ddpm"]


@pytest.mark.parametrize("name", VLA_CONFIGS)
def test_yaml_composes_and_builds(name, vla_spec, obs):
    cfg = load_train_config([PPO, f"policy={name}", "policy.chunk_size=2"]).policy
    pol = make_policy(cfg, vla_spec)
    assert pol.act(obs).shape == (3, 2, 3)


def test_misspelt_key_is_rejected():
    with pytest.raises(Exception, match="decodng"):
        load_train_config([PPO, "policy=ar_vla", "policy.decodng=parallel"])
