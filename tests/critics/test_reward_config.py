"""The reward Hydra group composes onto its schema (reward_schema, stored by vlarl.config.loader)."""

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from vlarl.config.loader import config_dir, register_schemas
from vlarl.rewards import RewardConfig


def _compose(name, overrides=()):
    register_schemas()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose(config_name=f"reward/{name}", overrides=list(overrides))


def test_reward_group_files_compose_to_reward_config():
    none = OmegaConf.to_object(_compose("none").reward)
    assert isinstance(none, RewardConfig) and not none.enabled
    cfg = OmegaConf.to_object(_compose("vlm_critic", ["reward.critic_path=/tmp/c", "reward.mode=potential"]).reward)
    assert isinstance(cfg, RewardConfig) and cfg.enabled and cfg.mode == "potential" and cfg.critic_path == "/tmp/c"


def test_misspelt_reward_key_is_rejected():
    with pytest.raises(Exception, match="critic_weigth"):
        _compose("vlm_critic", ["reward.critic_weigth=2"])
