"""Weight sync from the actor to rollout workers: versioned, only trainable parameters and buffers."""

from __future__ import annotations

import pytest
import torch

from policies.base import PolicySpec
from policies.mlp import MLPPolicyConfig
from vlarl.config.schema import PPOConfig
from vlarl.data.trajectory import Trajectory
from vlarl.scheduler.transport import from_wire
from vlarl.workers import ActorWorker, RolloutWorker

SPEC = PolicySpec(state_dim=5, action_dim=2, action_low=[-1.0, -1.0], action_high=[1.0, 1.0], max_episode_steps=10)
CFG = MLPPolicyConfig(hidden_sizes=[8, 8])


def _trajectory(rollout: RolloutWorker, N: int = 4, B: int = 3) -> Trajectory:
    """A rollout of the rollout worker's own samples on fixed observations and rewards."""
    g = torch.Generator().manual_seed(1)
    obs_list, samples = [], []
    for _ in range(N):
        obs = {"state": torch.randn(B, 5, generator=g), "images": {}, "instruction": [""] * B}
        s, _ = from_wire(rollout.sample(obs))  # replies leave workers as numpy (wire form)
        obs_list.append(obs)
        samples.append(s)
    return Trajectory(
        obs={"state": torch.stack([o["state"] for o in obs_list]), "images": {}, "instruction": [""] * B},
        replay={"actions": torch.stack([s.replay["actions"] for s in samples])},
        logprob=torch.stack([s.logprob for s in samples]), values=torch.stack([s.value for s in samples]),
        rewards=torch.randn(N, B, generator=g), dones=torch.zeros(N, B), truncated=torch.zeros(N, B),
        final_values=torch.zeros(N, B), next_value=torch.zeros(B),
    )


def test_sync_is_versioned_and_makes_rollout_equal_actor():
    actor = ActorWorker(CFG, PPOConfig(num_minibatches=1, update_epochs=2, lr=1e-2), SPEC, seed=0)
    rollout = RolloutWorker(CFG, SPEC, seed=1)
    assert rollout.set_weights(actor.sync_weights()) == 0
    for it in (1, 2):
        actor.train(_trajectory(rollout))
        assert actor.version == it
        stale = {k: v.clone() for k, v in rollout.policy.state_dict().items()}
        version, weights = actor.sync_weights()
        assert version == it and rollout.set_weights((version, weights)) == it and rollout.get_version() == it
        now = rollout.policy.state_dict()
        for k, v in actor.policy.state_dict().items():
            torch.testing.assert_close(now[k], v, rtol=0, atol=0)
        assert any(not torch.equal(stale[k], now[k]) for k in now)  # the update reached the rollout


def test_frozen_parameters_do_not_travel():
    actor = ActorWorker(CFG, PPOConfig(num_minibatches=1), SPEC, seed=0)
    frozen = [n for n, _ in actor.policy.named_parameters()][0]
    dict(actor.policy.named_parameters())[frozen].requires_grad_(False)
    _, weights = actor.sync_weights()
    assert frozen not in weights
    assert set(dict(actor.policy.named_buffers())) <= set(weights)  # normalizer stats travel
    rollout = RolloutWorker(CFG, SPEC, seed=5)
    before = rollout.policy.state_dict()[frozen].clone()
    rollout.set_weights((3, weights))
    torch.testing.assert_close(rollout.policy.state_dict()[frozen], before, rtol=0, atol=0)
    with pytest.raises(KeyError, match="does not have"):
        rollout.set_weights((4, {**weights, "bogus.weight": torch.zeros(1)}))


def test_checkpoint_keeps_the_version(tmp_path):
    actor = ActorWorker(CFG, PPOConfig(num_minibatches=1), SPEC, seed=0)
    actor.train(_trajectory(RolloutWorker(CFG, SPEC, seed=1)))
    actor.save(str(tmp_path), {"iteration": 1, "env_steps": 12})
    again = ActorWorker(CFG, PPOConfig(num_minibatches=1), SPEC, seed=0)
    state = again.load(str(tmp_path))
    assert again.version == 1 and state["iteration"] == 1


@pytest.mark.heavy
def test_collective_sync_over_gloo_arrives_identical_and_versioned():
    """placement.weight_sync=collective: the actor broadcasts over a real Gloo group to a rollout worker in
    another Ray process; after each update the rollout holds bit-identical tensors and the actor's version."""
    import ray

    from vlarl.config.schema import PlacementConfig
    from vlarl.scheduler import start_ray

    fresh = not ray.is_initialized()
    start_ray(PlacementConfig())
    actor = ray.remote(ActorWorker).options(num_cpus=0.2).remote(
        CFG, PPOConfig(num_minibatches=1, update_epochs=2, lr=1e-2), SPEC, 0)
    rollout = ray.remote(RolloutWorker).options(num_cpus=0.2).remote(CFG, SPEC, 1)
    local = RolloutWorker(CFG, SPEC, seed=1)  # makes the training data in this process
    try:
        addr, keys = ray.get([actor.weight_group_address.remote(), actor.weight_keys.remote()])
        assert ray.get([actor.join_weight_group.remote(addr, 2), rollout.join_weight_group.remote(addr, 1, 2, keys)]) \
            == ["gloo", "gloo"]
        first = None
        for it in (0, 1, 2):
            if it:
                ray.get(actor.train.remote(_trajectory(local)))
            got, sent = ray.get([rollout.receive_weights.remote(), actor.broadcast_weights.remote()])
            assert got == sent == it
            want = ray.get(actor.get_weights.remote())
            have = ray.get(rollout.__ray_call__.remote(lambda self: self.policy.state_dict()))
            for k in keys:
                torch.testing.assert_close(have[k], want[k], rtol=0, atol=0)
            local.set_weights(want)
            first = first or have
        assert any(not torch.equal(first[k], have[k]) for k in keys)  # the updates reached the rollout
    finally:
        for a in (actor, rollout):
            ray.kill(a)
        if fresh:
            ray.shutdown()
