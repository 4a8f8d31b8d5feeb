"""PPO re-scores every chunk with the words it was sampled with, when a slot's instruction changes inside one
rollout (a language task draws red or blue per episode, and episodes end mid-rollout).

Before the fix the rollout kept step 0's instructions for every step, so an update on an unchanged policy already
saw large log-ratios on the rows whose words had changed: approx_kl well above 0, clipped samples, and an early
stop at ``target_kl`` before any learning (measured on the multi-task SmolVLA run: approx_kl 0.1 during the
critic warm-up, when the policy had not moved at all).
"""

from __future__ import annotations

import torch
from vla_helpers import make_obs

from policies import make_policy
from tests.helpers.recipes import PPO
from vlarl.algorithms.ppo import ppo_update
from vlarl.config import load_train_config
from vlarl.config.schema import PPOConfig
from vlarl.data.trajectory import Trajectory, stack_obs

WORDS = ["push the cube to the red goal", "push the cube to the blue goal"]


def _rollout(policy, flips: bool) -> Trajectory:
    """N=3 chunk steps of B=2 envs sampled by ``policy``; with ``flips`` env 1 draws the other words at step 2."""
    obs_list, samples = [], []
    for t in range(3):
        o = make_obs(2, seed=20 + t)
        o["instruction"] = [WORDS[0], WORDS[1 if flips and t == 2 else 0]]
        obs_list.append(o)
        samples.append(policy.sample(o))
    return Trajectory(
        obs=stack_obs(obs_list), replay={k: torch.stack([s.replay[k] for s in samples]) for k in samples[0].replay},
        logprob=torch.stack([s.logprob for s in samples]), values=torch.stack([s.value for s in samples]),
        rewards=torch.randn(3, 2, generator=torch.Generator().manual_seed(0)), dones=torch.zeros(3, 2),
        truncated=torch.zeros(3, 2), final_values=torch.zeros(3, 2), next_value=torch.zeros(2))


def test_an_unchanged_policy_rescores_its_own_samples_when_an_instruction_changes_mid_rollout(vla_spec):
    torch.manual_seed(0)
    policy = make_policy(load_train_config([PPO, "policy=smolvla", "policy.noise_level=0.5"]).policy, vla_spec)
    traj = _rollout(policy, flips=True)
    assert traj.obs["instruction"][5] == WORDS[1]  # step 2, env 1: the words it was sampled with
    lp, _, _ = policy.evaluate(traj.flat_obs(), {k: traj.flat(v) for k, v in traj.replay.items()})
    assert (lp - traj.flat(traj.logprob)).abs().max().item() <= 1e-4
    # the same rows under step 0's words (what the rollout used to keep) score differently: the check can fail
    stale = {**traj.flat_obs(), "instruction": [WORDS[0]] * 6}
    lp_stale, _, _ = policy.evaluate(stale, {k: traj.flat(v) for k, v in traj.replay.items()})
    assert (lp_stale - traj.flat(traj.logprob))[5].abs().max().item() > 1e-3
    cfg = PPOConfig(update_epochs=1, num_minibatches=1, lr=0.0, target_kl=0.0)
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=0.0)
    stats = ppo_update(policy, opt, traj, cfg, generator=torch.Generator().manual_seed(0))
    assert stats["approx_kl"] <= 1e-6 and stats["clipfrac"] == 0.0
