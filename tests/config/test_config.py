
import pytest

from vlarl.config import ConfigError, load_train_config


def test_defaults_compose_into_typed_dataclasses():
    cfg = load_train_config([])
    assert type(cfg.env).__name__ == "ManiSkillConfig"
    assert cfg.env.task == "PushCube-v1"
    assert type(cfg.policy).__name__ == "MLPPolicyConfig"
    assert cfg.algorithm.name == "ppo"
    assert cfg.experiment_name == "pushcube_mlp_ppo"


def test_command_line_overrides_apply_with_types():
    cfg = load_train_config(["env.num_envs=16", "algorithm.lr=3e-4", "policy.hidden_sizes=[64,64]"])
    assert cfg.env.num_envs == 16
    assert cfg.algorithm.lr == pytest.approx(3e-4)
    assert cfg.policy.hidden_sizes == [64, 64]


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["env.num_envz=3"], "unknown config key 'env.num_envz'. Did you mean 'env.num_envs'?"),
        (["algorithm.lrr=1"], "Did you mean 'algorithm.lr'?"),
        (["total_env_stepz=5"], "Valid keys: "),
        (["env=maniskill_pushcub"], "Did you mean env=maniskill_pushcube?"),
        (["algorithm.lr=fast"], "config key 'algorithm.lr' expects Float, got 'fast'"),
        (["env.num_envs=10", "env.num_workers=3"], "does not divide across env.num_workers=3"),
        (["algorithm.logprob_level=step"], "algorithm.logprob_level='step' is unknown"),
        (["placement.mode=magic"], "placement.mode='magic' is unknown"),
    ],
)
def test_bad_config_is_one_clear_line(overrides, needle):
    with pytest.raises(ConfigError) as e:
        load_train_config(overrides)
    msg = str(e.value)
    assert needle in msg
    assert "\n" not in msg


def test_pipeline_benchmark_workload_is_a_flow_vla_on_state_pushcube():
    cfg = load_train_config(["experiment=pipeline_flow_vla"])
    assert type(cfg.policy).__name__ == "SmolVLAPolicyConfig" and cfg.policy.chunk_size == 2
    assert cfg.policy.name == "smolvla" and cfg.policy.arch["vlm"]["text_config"]["hidden_size"] == 256
    assert cfg.env.num_envs == 64 and cfg.env.obs_mode == "state"
