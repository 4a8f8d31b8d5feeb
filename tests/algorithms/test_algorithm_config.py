"""The algorithm config group: choosing ppo / grpo / grpo_dapo, one-line errors, resume keeps the type."""

import pytest

from tests.helpers.recipes import PPO, pinned
from vlarl.config import load_saved_config, load_train_config
from vlarl.config.loader import ConfigError, to_yaml
from vlarl.config.schema import GRPOConfig, PPOConfig


def test_ppo_recipe_and_grpo_are_selectable():
    assert type(load_train_config([PPO]).algorithm) is PPOConfig
    g = load_train_config([PPO, "algorithm=grpo", "algorithm.group_size=4"]).algorithm
    assert type(g) is GRPOConfig and g.group_size == 4 and g.norm_adv is False
    d = load_train_config([PPO, "algorithm=grpo_dapo"]).algorithm
    assert d.filter_groups and d.dynamic_sampling_rounds == 2 and d.clip_high > d.clip_low


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["algorithm=grpo", "algorithm.gamma=0.9"], "unknown config key 'algorithm.gamma'"),
        (["algorithm=grpo", "algorithm.group_sise=4"], "Did you mean 'algorithm.group_size'?"),
        (["algorithm=grpo", "algorithm.group_size=3"], "must be a multiple of algorithm.group_size=3"),
        (["algorithm=grpo", "algorithm.dynamic_sampling_rounds=1"], "set algorithm.filter_groups=true"),
        (["algorithm=grpo", "algorithm.score=reward"], "algorithm.score='reward' is unknown"),
        (["algorithm.dual_clip=0.5"], "algorithm.dual_clip=0.5 must be > 1"),
        (["algorithm.reward_level=action"], "needs algorithm.logprob_level=action or token"),
        (["algorithm.loss_agg_mode=sum"], "algorithm.loss_agg_mode='sum' is unknown"),
        (["algorithm.kl_estimator=k5"], "algorithm.kl_estimator='k5' is unknown"),
        (["algorithm.norm_adv_by=task"], "algorithm.norm_adv_by='task' is unknown"),
        (["algorithm.value_loss=l1"], "algorithm.value_loss='l1' is unknown"),
        (["algorithm.logprob_level=step"], "algorithm.logprob_level='step' is unknown"),
        (["algorithm.num_minibatches=7"], "must divide the batch"),
        (["algorithm=grpx"], "Did you mean algorithm=grpo?"),
        # each algorithm accepts only its own keys: PPO's are not SAC's, SAC's demonstrations are not DSRL's
        (["algorithm=sac", "policy.squash=true", "algorithm.kl_coef=0.1"], "unknown config key 'algorithm.kl_coef'"),
        (["algorithm=rlpd", "algorithm.update_epochs=2"], "unknown config key 'algorithm.update_epochs'"),
        (["algorithm=dsrl", "algorithm.bc_weight=1.0"], "unknown config key 'algorithm.bc_weight'"),
        (["algorithm=ppo", "algorithm.tau=0.1"], "unknown config key 'algorithm.tau'"),
        # a policy without the capability the algorithm declares (AlgorithmSpec.requires)
        (["algorithm=sac"], "algorithm=sac needs reparameterized sampling"),
        (["algorithm=sac"], "set policy.squash=true"),
        (["algorithm=dsrl"], "policies that have it: policy=noise_steering"),
    ],
)
def test_bad_algorithm_config_is_one_clear_line(overrides, needle):
    with pytest.raises(ConfigError) as e:
        load_train_config(pinned(overrides))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_resume_restores_the_algorithm_type(tmp_path):
    cfg = load_train_config([PPO, "algorithm=grpo", "algorithm.group_size=4"])
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))
    back = load_saved_config(tmp_path, ["algorithm.kl_coef=0.1"])
    assert type(back.algorithm) is GRPOConfig and back.algorithm.group_size == 4 and back.algorithm.kl_coef == 0.1
