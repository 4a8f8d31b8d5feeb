"""The per-task recipes (``configs/experiment/<task>_*.yaml``, docs/tasks.md): each of the nine tasks has one, it
composes into a config for that task, and its demonstrations fit it: an RLPD recipe reads ``algorithm.demos=auto``
on a task and control mode ManiSkill's planner and replay (or, PokeCube and RollBall, vlarl's scripted experts) can
make, a PPO recipe learns from the dense reward on a task neither covers; PokeCube's and RollBall's PPO recipes stay
as their dense-reward baselines."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulators.base import EnvError
from simulators.maniskill_demos import CONVERTIBLE_CONTROL, EXPERT_TASKS, PLANNER_TASKS, ManiSkillPlanner
from vlarl.config import load_train_config

EXPERIMENTS = Path(__file__).resolve().parents[2] / "configs" / "experiment"
TASKS = {"pushcube": "PushCube-v1", "pullcube": "PullCube-v1", "pickcube": "PickCube-v1",
         "stackcube": "StackCube-v1", "pokecube": "PokeCube-v1", "peginsertionside": "PegInsertionSide-v1",
         "pusht": "PushT-v1", "rollball": "RollBall-v1", "placesphere": "PlaceSphere-v1"}
RECIPES = {"pushcube": "pushcube_rlpd", "pullcube": "pullcube_rlpd", "pickcube": "pickcube_rlpd",
           "stackcube": "stackcube_rlpd", "placesphere": "placesphere_rlpd",
           "peginsertionside": "peginsertionside_rlpd", "pokecube": "pokecube_rlpd", "pusht": "pusht_ppo",
           "rollball": "rollball_rlpd"}
BASELINES = {"pokecube": "pokecube_ppo", "rollball": "rollball_ppo"}  # PPO from the dense reward, beside the task's RLPD recipe


def test_every_task_has_a_recipe_file():
    assert set(RECIPES) == set(TASKS)
    for name in RECIPES.values():
        assert (EXPERIMENTS / f"{name}.yaml").is_file(), name


@pytest.mark.parametrize("key", sorted(RECIPES))
def test_recipe_composes_for_its_task_and_its_demonstrations_fit(key):
    cfg = load_train_config([f"experiment={RECIPES[key]}"])
    assert cfg.env.task == TASKS[key] and cfg.experiment_name == RECIPES[key]
    assert cfg.eval.episodes == 100 and cfg.time_limit_minutes > 0
    planner = ManiSkillPlanner()
    if cfg.algorithm.name == "rlpd":
        assert cfg.algorithm.demos == "auto" and cfg.policy.squash
        assert cfg.env.reward_mode == "sparse" and not cfg.env.ignore_terminations  # the demonstrations' labels
        # the planner has a solution for the task and the replay can convert into the recipe's control mode, or
        # a scripted expert records the task in it
        expert = EXPERT_TASKS.get(cfg.env.task)
        assert (cfg.env.task in PLANNER_TASKS and cfg.env.control_mode in CONVERTIBLE_CONTROL) or (
            expert is not None and cfg.env.control_mode == expert.CONTROL)
    else:
        assert cfg.algorithm.name == "ppo" and cfg.env.reward_mode == "normalized_dense"
        with pytest.raises(EnvError, match="has no ManiSkill motion-planning solution"):
            planner.check(cfg.env)


@pytest.mark.parametrize("key", sorted(BASELINES))
def test_dense_reward_baselines_compose_as_ppo(key):
    cfg = load_train_config([f"experiment={BASELINES[key]}"])
    assert cfg.env.task == TASKS[key] and cfg.experiment_name == BASELINES[key]
    assert cfg.algorithm.name == "ppo" and cfg.env.reward_mode == "normalized_dense" and cfg.eval.episodes == 100
