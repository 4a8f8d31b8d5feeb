"""GRPO's group selection runs on the rollout side: ``collect_groups`` hands back a reference the driver never
read, and what it refers to equals ``selected_batch`` computed from the same rounds on the driver.
Real runner, real ManiSkill PushCube workers."""

from dataclasses import replace

import pytest
import ray
import torch

from tests.helpers.recipes import PPO
from tests.helpers.runners import set_up_runner
from vlarl.algorithms.grpo import collect_groups, selected_batch
from vlarl.scheduler.transport import TrajectoryRef, payload

pytestmark = [pytest.mark.sim, pytest.mark.slow]  # ~1 min on 2 busy cores

OVERRIDES = [
    PPO, "algorithm=grpo", "algorithm.group_size=2", "algorithm.num_steps=8", "algorithm.filter_groups=true",
    "algorithm.dynamic_sampling_rounds=1", "env.max_episode_steps=5", "env.num_envs=4", "env.num_workers=2",
    "policy.hidden_sizes=[16,16]", "logger.progress_bar=false", "logger.tensorboard=false",
]


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    with set_up_runner(OVERRIDES, tmp_path_factory.mktemp("grpo_rollout_side")) as r:
        yield r


def _collect_watched(runner, monkeypatch):
    """collect_groups, recording each round's reference and every fetch to the driver."""
    rounds, fetches = [], []
    collect, fetch = runner.collect, TrajectoryRef.fetch

    def recorded_collect(*args, **kwargs):
        out = collect(*args, **kwargs)
        rounds.append(out[0])
        return out

    def counted_fetch(self):
        fetches.append(1)
        return fetch(self)

    monkeypatch.setattr(runner, "collect", recorded_collect)
    monkeypatch.setattr(TrajectoryRef, "fetch", counted_fetch)
    traj, _, steps = collect_groups(runner, None)
    assert fetches == [], "the driver read a trajectory during GRPO's collection"
    assert isinstance(traj, TrajectoryRef) and isinstance(payload(traj), ray.ObjectRef)
    monkeypatch.undo()
    return traj, rounds, steps


def _same(a, b) -> None:
    assert a.num_envs == b.num_envs and a.num_steps == b.num_steps
    torch.testing.assert_close(a.obs["state"], b.obs["state"], rtol=0, atol=0)
    torch.testing.assert_close(a.logprob, b.logprob, rtol=0, atol=0)
    torch.testing.assert_close(a.rewards, b.rewards, rtol=0, atol=0)
    assert {k: v for k, v in a.extras.items() if k.startswith("grpo/")} == \
        {k: v for k, v in b.extras.items() if k.startswith("grpo/")}


@pytest.mark.parametrize("filter_groups", [False, True], ids=["whole-round", "filtered-rounds"])
def test_group_selection_runs_where_the_rounds_are(runner, monkeypatch, filter_groups):
    alg = runner.cfg.algorithm
    runner.cfg.algorithm = replace(alg, filter_groups=filter_groups,
                                   dynamic_sampling_rounds=alg.dynamic_sampling_rounds if filter_groups else 0)
    try:
        traj, rounds, steps = _collect_watched(runner, monkeypatch)
        expected, counts = selected_batch([r.get() for r in rounds], runner.cfg.algorithm, target_groups=2)
    finally:
        runner.cfg.algorithm = alg
    assert traj.info["num_envs"] == 2 * counts["groups_kept"] and counts["rounds"] == len(rounds)
    assert steps == sum(r.num_steps for r in rounds) * 4
    _same(traj.get(), expected)
    if not filter_groups:
        assert len(rounds) == 1 and traj.num_envs == 4 and traj.extras["grpo/groups_kept"].item() == 2.0
