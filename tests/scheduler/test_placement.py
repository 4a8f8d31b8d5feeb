"""Placement parsing and validation: every mode's device sets, the Ray resources derived from them,
and a one-line error for every impossible placement."""

from __future__ import annotations

from collections import defaultdict

import pytest

from tests.helpers.recipes import PPO
from vlarl.config import load_train_config
from vlarl.config.schema import ComponentPlacement, PlacementConfig
from vlarl.scheduler.placement import PlacementError, resolve


def _fits(plan, key: str, n: int, reward: bool = False) -> None:
    """The workers of one node (label) ask for at most its n devices; amounts above 1 are whole."""
    load: dict[str, float] = defaultdict(float)
    for w in [*plan.env, plan.rollout, plan.actor, *([plan.reward] if reward else [])]:
        amount = w.ray_options[key]
        assert amount <= 1 or amount == int(amount), amount
        load[str(w.ray_options.get("resources"))] += amount
    assert max(load.values()) <= n + 1e-9, load


def test_yaml_groups_load_and_keep_old_keys():
    cfg = load_train_config([PPO, "placement=hybrid", "env.num_workers=1", "placement.num_cpus=2", "placement.ray_address=auto"])
    p = cfg.placement
    assert (p.mode, p.pipeline_stages, p.num_cpus, p.ray_address) == ("hybrid", 2, 2, "auto")
    cfg = load_train_config([PPO, "placement=disaggregated", "env.num_workers=1", "placement.env.devices=[0]", "placement.env.resource=n1"])
    assert cfg.placement.mode == "disaggregated" and cfg.placement.env.devices == [0]
    assert cfg.placement.env.resource == "n1"
    assert load_train_config([PPO]).placement.mode == "collocated"


def test_collocated_shares_all_devices_and_fits():
    plan = resolve(PlacementConfig(), num_env_workers=2, num_envs=16, device_type="cpu", num_devices=2)
    assert [w.devices for w in plan.env] == [[0, 1], [0, 1]]
    assert plan.rollout.devices == plan.actor.devices == [0, 1]
    assert not plan.overlap and not plan.env[0].pin  # collocated: unpinned, take turns
    _fits(plan, "num_cpus", 2)


@pytest.mark.parametrize("mode", ["collocated", "disaggregated", "hybrid"])
def test_reward_worker_shares_its_devices_when_it_runs(mode):
    """placement.reward: the critic's worker gets its devices (default: the rollout's) and a share of them that
    still lets every worker fit; without a reward worker the others split the devices among themselves."""
    p = PlacementConfig(mode=mode)
    plan = resolve(p, 1, 8, device_type="cpu", num_devices=2, with_reward=True)
    assert plan.reward.devices == plan.rollout.devices and plan.reward.ray_options["num_cpus"] > 0
    _fits(plan, "num_cpus", 2, reward=True)
    alone = resolve(p, 1, 8, device_type="cpu", num_devices=2)
    assert alone.reward.ray_options == {} and alone.rollout.ray_options["num_cpus"] > plan.rollout.ray_options["num_cpus"]
    custom = resolve(PlacementConfig(mode=mode, reward=ComponentPlacement(devices=[0, 1] if mode == "collocated" else [1])),
                     1, 8, device_type="cpu", num_devices=2, with_reward=True)
    _fits(custom, "num_cpus", 2, reward=True)


def test_hybrid_and_disaggregated_default_split():
    hyb = resolve(PlacementConfig(mode="hybrid", pipeline_stages=2), 1, 16, device_type="cpu", num_devices=2)
    assert (hyb.env[0].devices, hyb.rollout.devices, hyb.actor.devices) == ([0], [1], [0, 1])
    assert hyb.overlap and hyb.env[0].pin and hyb.stages == 2
    _fits(hyb, "num_cpus", 2)
    dis = resolve(PlacementConfig(mode="disaggregated"), 2, 16, device_type="cpu", num_devices=4)
    assert [w.devices for w in dis.env] == [[0], [1]] and dis.rollout.devices == [2, 3] == dis.actor.devices
    _fits(dis, "num_cpus", 4)


def test_explicit_sets_gpu_fractions_and_node_labels():
    p = PlacementConfig(mode="hybrid", env=ComponentPlacement(devices=[0, 1, 2], resource="env_node"),
                        rollout=ComponentPlacement(devices=[3]))
    plan = resolve(p, 3, 24, device_type="gpu", num_devices=4)
    assert [w.devices for w in plan.env] == [[0], [1], [2]]
    assert plan.rollout.torch_device == "cuda:3" and plan.actor.devices == [0, 1, 2, 3]
    assert plan.env[0].ray_options["resources"] == {"env_node": 0.001}
    assert "resources" not in plan.rollout.ray_options
    _fits(plan, "num_gpus", 4)


@pytest.mark.parametrize("kwargs, workers, envs, group, needle", [
    (dict(mode="magic"), 1, 4, 1, "placement.mode='magic' is unknown"),
    (dict(mode="hybrid", env=ComponentPlacement(devices=[0, 1]), rollout=ComponentPlacement(devices=[1])), 1, 4, 1,
     "needs disjoint env and rollout devices"),
    (dict(mode="disaggregated", actor=ComponentPlacement(devices=[0, 1])), 1, 4, 1, "keeps the actor off the env"),
    (dict(mode="hybrid", actor=ComponentPlacement(devices=[1])), 1, 4, 1, "trains the actor on all 2 devices"),
    (dict(mode="collocated", env=ComponentPlacement(devices=[0])), 1, 4, 1, "remove placement.env.devices"),
    (dict(mode="hybrid", rollout=ComponentPlacement(devices=[5])), 1, 4, 1, "names device(s) [5]"),
    (dict(mode="hybrid"), 2, 4, 1, "env.num_workers=2 env workers do not fit on 1 env core"),
    (dict(mode="hybrid", pipeline_stages=4), 1, 6, 1, "not divisible by env.num_workers x placement.pipeline_stages"),
    (dict(mode="hybrid", pipeline_stages=2), 1, 8, 8, "= 1 x 2 x 8 = 16"),
    (dict(pipeline_stages=0), 1, 4, 1, "placement.pipeline_stages=0 must be >= 1"),
])
def test_impossible_placements_fail_with_the_key(kwargs, workers, envs, group, needle):
    with pytest.raises(PlacementError) as e:
        resolve(PlacementConfig(**kwargs), workers, envs, group, device_type="cpu", num_devices=2)
    assert needle in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_one_device_refuses_split_modes():
    with pytest.raises(PlacementError, match="needs at least 2 devices"):
        resolve(PlacementConfig(mode="hybrid"), 1, 4, device_type="cpu", num_devices=1)
    resolve(PlacementConfig(), 1, 4, device_type="cpu", num_devices=1)  # collocated runs anywhere


def test_requests_fit_when_ray_gets_fewer_cpus_than_cores():
    plan = resolve(PlacementConfig(num_cpus=1), 2, 16, device_type="cpu", num_devices=2)
    _fits(plan, "num_cpus", 1)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(overlap=True), "placement.overlap=true overlaps pipeline stages, but placement.pipeline_stages=1"),
    (dict(weight_sync="pigeon"), "placement.weight_sync='pigeon' is unknown"),
    (dict(pipeline_stages="many"), "placement.pipeline_stages='many' must be an integer >= 1 or auto"),
])
def test_overlap_auto_and_weight_sync_keys_are_validated(kwargs, needle):
    with pytest.raises(PlacementError) as e:
        resolve(PlacementConfig(**kwargs), 2, 8, device_type="cpu", num_devices=2)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_collocated_overlap_and_auto_stages():
    plan = resolve(PlacementConfig(overlap=True, pipeline_stages=2), 2, 8, device_type="cpu", num_devices=2)
    assert plan.overlap and plan.stages == 2 and not plan.env[0].pin  # shared cores, unpinned, overlapped
    assert not resolve(PlacementConfig(pipeline_stages=2), 2, 8, device_type="cpu", num_devices=2).overlap
    auto = resolve(PlacementConfig(mode="hybrid", pipeline_stages="auto"), 1, 12, device_type="cpu", num_devices=2)
    assert auto.auto_stages and auto.stages == 1 and auto.stage_candidates == (1, 2, 4)
    auto = resolve(PlacementConfig(overlap=True, pipeline_stages="auto"), 2, 8, device_type="cpu", num_devices=2)
    assert auto.stage_candidates == (2, 4)  # collocated overlap needs S >= 2
    fixed = resolve(PlacementConfig(mode="hybrid", pipeline_stages=4), 1, 12, device_type="cpu", num_devices=2)
    assert not fixed.auto_stages and fixed.stages == 4  # an explicit S overrides auto-tuning
    cfg = load_train_config([PPO, "placement.pipeline_stages=auto", "placement.overlap=true", "env.num_envs=8",
                             "placement.weight_sync=collective"])
    assert (cfg.placement.pipeline_stages, cfg.placement.overlap, cfg.placement.weight_sync) == ("auto", True, "collective")


def test_env_split_auto_candidates_and_errors():
    """env_split=auto lists the env device counts k whose k workers divide the batch; a chosen k puts env
    on devices 0..k-1 (one worker each) and the rollout on the rest; bad input names the key."""
    p = PlacementConfig(mode="hybrid", pipeline_stages="auto", env_split="auto")
    plan = resolve(p, 1, 12, device_type="cpu", num_devices=4)
    assert plan.auto_split and plan.split_candidates == (1, 2, 3) and "split auto" in plan.describe()
    assert resolve(p, 1, 8, device_type="cpu", num_devices=4).split_candidates == (1, 2)  # 3 workers can't share 8
    chosen = resolve(p, 3, 12, device_type="cpu", num_devices=4, env_devices=3)
    assert [w.devices for w in chosen.env] == [[0], [1], [2]] and chosen.rollout.devices == [3]
    assert chosen.actor.devices == [0, 1, 2, 3]  # hybrid trains on all devices
    dis = resolve(PlacementConfig(mode="disaggregated", env_split="auto"), 1, 12, device_type="cpu", num_devices=4,
                  env_devices=1)
    assert dis.rollout.devices == dis.actor.devices == [1, 2, 3]
    assert not resolve(PlacementConfig(env_split="auto"), 2, 8, device_type="cpu", num_devices=2).auto_split
    with pytest.raises(PlacementError, match="placement.env_split='thirds' is unknown"):
        resolve(PlacementConfig(mode="hybrid", env_split="thirds"), 1, 8, device_type="cpu", num_devices=2)
    given = PlacementConfig(mode="hybrid", env_split="auto")
    given.env.devices = [0]
    with pytest.raises(PlacementError, match="remove them or set placement.env_split=half"):
        resolve(given, 1, 8, device_type="cpu", num_devices=2)
