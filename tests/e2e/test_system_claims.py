"""Small default versions of the README's system claims (the full-size ones run with ``-m slow``):

* a flow-matching VLA trains through the real runner (Ray workers, ManiSkill PushCube, PPO), checkpoints, and
  the checkpoint exports (Hugging Face layout) and reloads to the same actions;
* process-parallel evaluation (2 env worker processes) gives the one-process per-episode results;
* placement modes change speed, not semantics: collocated and hybrid give bit-identical trajectories and updates.

Order matters for Ray: the first two start and stop their own instance; the last shares one (``ray_local``).
"""

from __future__ import annotations

import json

import pytest
import ray
import torch

from tests.helpers.recipes import PPO

pytest.importorskip("mani_skill", reason="the system tests run ManiSkill (pip install -e .[maniskill])")
pytest.importorskip("transformers", reason="the VLA families need the vla extra (pip install -e .[vla])")

VLA_RUN = [PPO, "policy=flow_vla", "policy.chunk_size=2", "env.num_envs=2", "env.num_workers=1", "algorithm.num_steps=2",
           "algorithm.num_minibatches=1", "algorithm.update_epochs=1", "total_env_steps=16", "eval.episodes=2",
           "eval.num_envs=2", "eval.video_episodes=0", "time_limit_minutes=0", "logger.progress_bar=false",
           "logger.tensorboard=false", "placement.timeline=false"]


@pytest.fixture(scope="module")
def vla_run(tmp_path_factory):
    from vlarl.config import load_train_config
    from vlarl.runner import run_training

    run_dir = tmp_path_factory.mktemp("vla") / "run"
    run_dir.mkdir()
    final = run_training(load_train_config(VLA_RUN), run_dir)
    return run_dir, final


@pytest.mark.heavy
def test_vla_trains_through_the_runner_and_checkpoints(vla_run):
    from vlarl.checkpoint import latest_checkpoint
    from vlarl.checkpoint_files import check_checkpoint

    run_dir, final = vla_run
    assert final["iterations"] == 2 and final["env_steps"] == 16 and final["episodes"] == 2
    ckpt = latest_checkpoint(run_dir)
    check_checkpoint(ckpt, trainer_state=True)  # every file complete, processor files present
    assert json.loads((ckpt / "config.json").read_text())["policy"] == "flow_vla"


@pytest.mark.heavy
def test_vla_checkpoint_exports_and_reloads_to_the_same_actions(vla_run, tmp_path):
    from policies.base import Policy
    from vlarl.export import export_checkpoint, obs_from_inputs, random_inputs

    run_dir, _ = vla_run
    ckpt = run_dir / "checkpoints" / "latest"
    manifest = export_checkpoint(ckpt, tmp_path / "export", ["hf"])
    assert max(manifest["formats"]["hf"]["max_abs_err"].values()) <= 1e-4  # measured by the exporter itself
    policy, again = Policy.from_pretrained(ckpt).eval(), Policy.from_pretrained(tmp_path / "export" / "hf").eval()
    obs = obs_from_inputs(policy, random_inputs(policy, 2, torch.Generator().manual_seed(0)), policy.spec.instruction)
    torch.manual_seed(0)
    want = policy.act(obs)
    torch.manual_seed(0)
    torch.testing.assert_close(again.act(obs), want, rtol=0, atol=1e-5)


def test_parallel_evaluation_equals_one_process(tmp_path, capsys):
    from tests.helpers.checkpoints import pushcube_checkpoint
    from vlarl.cli import eval_main

    ckpt = pushcube_checkpoint(tmp_path / "ckpt")
    args = [f"checkpoint={ckpt}", "env.max_episode_steps=6", "episodes=3", "num_envs=2", "video_episodes=0"]
    assert eval_main([*args, f"output={tmp_path / 'one'}"]) == 0
    assert eval_main([*args, "num_workers=2", f"output={tmp_path / 'two'}"]) == 0
    one = json.loads((tmp_path / "one" / "eval.json").read_text())
    two = json.loads((tmp_path / "two" / "eval.json").read_text())
    assert one["num_workers"] == 1 and two["num_workers"] == 2 and len(two["per_episode"]) == 3
    assert two["per_episode"] == one["per_episode"]
    assert not ray.is_initialized()


@pytest.fixture(scope="module")
def ray_local():
    from vlarl import scheduler
    from vlarl.config.schema import PlacementConfig

    scheduler.start_ray(PlacementConfig())
    yield
    ray.shutdown()


@pytest.mark.heavy
def test_collocated_and_hybrid_are_bit_identical(ray_local, tmp_path):
    from tests.scheduler.mode_helpers import assert_same_trajectory, run_iterations

    stages = ["env.num_workers=1", "placement.pipeline_stages=2", "algorithm.num_steps=2"]
    ta, ma, va = run_iterations(["placement=collocated", *stages], tmp_path / "c", iterations=2)
    tb, mb, vb = run_iterations(["placement=hybrid", *stages], tmp_path / "h", iterations=2)
    assert va == vb == [1, 2]
    for x, y in zip(ta, tb, strict=True):
        assert_same_trajectory(x, y)
    assert ma == mb
