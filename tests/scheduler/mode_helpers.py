"""Helpers of the mode tests: a Runner built from a tiny PushCube config, iterated by hand."""

from __future__ import annotations

import ray
import torch

from tests.helpers.recipes import PPO

SMALL = [PPO, "env.num_envs=4", "algorithm.num_steps=6", "algorithm.num_minibatches=2", "algorithm.update_epochs=1",
         "policy.hidden_sizes=[16,16]", "logger.tensorboard=false", "logger.progress_bar=false"]


def run_iterations(overrides: list[str], run_dir, iterations: int = 2):
    """Build a Runner, collect + train ``iterations`` times (synced weights in between); returns the
    trajectories, train metrics and the rollout's policy versions. Kills its actors, keeps Ray up."""
    from vlarl.config import load_train_config
    from vlarl.runner import Runner
    from vlarl.scheduler.transport import payload

    cfg = load_train_config([*SMALL, *overrides])
    r = Runner(cfg, run_dir)
    r.setup()
    try:
        ray.get(r.rollout.set_weights.remote(r.actor.get_weights.remote()))
        obs = r._reset_envs()
        trajs, metrics, versions = [], [], []
        for _ in range(iterations):
            traj, obs, _ = r.collect(obs)  # a reference: the actor gets it from the object store
            metrics.append(ray.get(r.actor.train.remote(payload(traj))))
            trajs.append(traj.get())
            versions.append(ray.get(r.rollout.set_weights.remote(r.actor.sync_weights.remote())))
        return trajs, metrics, versions
    finally:
        for w in [*r.env_workers, r.rollout, r.actor]:
            ray.kill(w)


def assert_same_trajectory(a, b) -> None:
    for name in ("logprob", "values", "rewards", "dones", "truncated", "final_values", "next_value"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=0, msg=name)
    torch.testing.assert_close(a.obs["state"], b.obs["state"], rtol=0, atol=0)
    for k in a.replay:
        torch.testing.assert_close(a.replay[k], b.replay[k], rtol=0, atol=0)
