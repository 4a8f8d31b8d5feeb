
import pytest

from tests.helpers.recipes import PPO, pinned
from vlarl.config import ConfigError, load_train_config


def test_the_embedded_default_is_rlpd_from_planner_demonstrations_and_ppo_is_one_override_away():
    cfg = load_train_config([])
    assert type(cfg.env).__name__ == "ManiSkillConfig"
    assert (cfg.env.task, cfg.env.control_mode, cfg.env.reward_mode) == ("PushCube-v1", "pd_ee_delta_pos", "sparse")
    assert type(cfg.policy).__name__ == "MLPPolicyConfig" and cfg.policy.squash
    assert type(cfg.algorithm).__name__ == "RLPDConfig" and cfg.experiment_name == "pushcube_rlpd"
    assert cfg.algorithm.demos == "auto" and cfg.algorithm.num_demos == 20  # made by the planner on first use
    assert cfg.total_env_steps == 14336 and cfg.time_limit_minutes == 8 and cfg.eval.episodes == 100
    ppo = load_train_config([PPO])
    assert ppo.algorithm.name == "ppo" and ppo.experiment_name == "pushcube_mlp_ppo"
    assert type(ppo.policy).__name__ == "MLPPolicyConfig" and ppo.env.reward_mode != "sparse"


def test_command_line_overrides_apply_with_types():
    cfg = load_train_config([PPO, "env.num_envs=16", "algorithm.lr=3e-4", "policy.hidden_sizes=[64,64]"])
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
        load_train_config(pinned(overrides))
    msg = str(e.value)
    assert needle in msg
    assert "\n" not in msg


def test_pipeline_benchmark_workload_is_a_flow_vla_on_state_pushcube():
    cfg = load_train_config(["experiment=pipeline_flow_vla"])
    assert type(cfg.policy).__name__ == "SmolVLAPolicyConfig" and cfg.policy.chunk_size == 2
    assert cfg.policy.name == "smolvla" and cfg.policy.arch["vlm"]["text_config"]["hidden_size"] == 256
    assert cfg.env.num_envs == 64 and cfg.env.obs_mode == "state"


def test_resume_overrides_read_values_as_a_fresh_run_does(tmp_path):
    """A resumed run's overrides are parsed by Hydra's grammar, like the first run's: a list stays a list, a
    number a number, an empty value the empty string, a ``+`` key is added."""
    from vlarl.config import load_saved_config
    from vlarl.config.loader import to_yaml

    fresh = load_train_config([*pinned([PPO]), "env=maniskill_multitask_rgb"])
    (tmp_path / "config.yaml").write_text(to_yaml(fresh))
    back = load_saved_config(tmp_path, ["env.tasks=[PullCube-v1,PushCube-v1]", "time_limit_minutes=7",
                                        "init_from=", "+env.task_kwargs.PushCube-v1.instruction=other"])
    assert list(back.env.tasks) == ["PullCube-v1", "PushCube-v1"]
    assert back.time_limit_minutes == 7 and back.init_from == ""
    assert back.env.task_kwargs == {"PushCube-v1": {"instruction": "other"}}
    assert list(fresh.env.tasks) != list(back.env.tasks)
    with pytest.raises(ConfigError, match="no_such_key"):
        load_saved_config(tmp_path, ["env.no_such_key=[1,2]"])
