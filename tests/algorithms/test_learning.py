"""Each registered algorithm learns: on a contextual chunk bandit its update raises the reward within seconds.

The bandit: state s ~ N(0, I_4); the policy emits a chunk of 2 actions in [-1, 1]^2; reward = -mean |a - a*(s)|
with a*(s) = tanh(W s) for a fixed W. PPO collects independent contexts; GRPO collects groups of 4 envs that
share one context (its reset state) and scores each episode by its return. The update is the registry's own
(``algorithm_spec(name).update``), fed a ``Trajectory`` as the runner builds it. The off-policy algorithms
(sac, rlpd: replay, squashed actor, per-step rewards) learn their own chunk bandit in test_sac.py.
"""

from __future__ import annotations

import pytest
import torch

from policies.base import PolicySpec
from policies.mlp import MLPPolicy, MLPPolicyConfig
from vlarl.algorithms.registry import algorithm_spec
from vlarl.data.trajectory import Trajectory, stack_obs

SPEC = PolicySpec(state_dim=4, action_dim=2, action_low=[-1.0, -1.0], action_high=[1.0, 1.0])
W = torch.tensor([[0.9, -0.6, 0.3, 0.0], [-0.2, 0.5, 0.0, 0.8]])
B, GROUP, ITERATIONS = 32, 4, 30
KNOBS = dict(update_epochs=4, num_minibatches=2, lr=3e-3, target_kl=0.0)
EXTRA = {"ppo": dict(gamma=0.0, gae_lambda=0.0), "grpo": dict(group_size=GROUP, score="return")}


def _reward(state: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    return -(actions - torch.tanh(state @ W.T).unsqueeze(1)).abs().mean((1, 2))


def _rollout(policy: MLPPolicy, gen: torch.Generator, grouped: bool) -> tuple[Trajectory, torch.Tensor]:
    n_ctx = B // GROUP if grouped else B
    state = torch.randn(n_ctx, 4, generator=gen)
    if grouped:  # GROUP envs per reset state, adjacent (vlarl.algorithms.grpo.group_reset_ids)
        state = state.repeat_interleave(GROUP, 0)
    obs = {"state": state, "images": {}, "instruction": ["reach the target"] * B}
    with torch.no_grad():
        s = policy.sample(obs)
    r = _reward(state, s.actions)
    traj = Trajectory(
        obs=stack_obs([obs]), replay={k: v.unsqueeze(0) for k, v in s.replay.items()},
        logprob=s.logprob.unsqueeze(0), values=(s.value if s.value is not None else torch.zeros(B)).unsqueeze(0),
        rewards=r.unsqueeze(0), dones=torch.ones(1, B), truncated=torch.zeros(1, B),
        final_values=torch.zeros(1, B), next_value=torch.zeros(B),
        episode_return=r.unsqueeze(0), episode_success=(r > -0.2).float().unsqueeze(0),
    )
    return traj, r


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_algorithm_raises_the_bandit_reward(name):
    torch.manual_seed(0)
    policy = MLPPolicy(MLPPolicyConfig(hidden_sizes=[32], chunk_size=2, normalize_obs=False), SPEC)
    spec = algorithm_spec(name)
    cfg = spec.config(**KNOBS, **EXTRA[name])
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr, eps=1e-5)
    gen = torch.Generator().manual_seed(1)
    history = []
    for it in range(ITERATIONS):
        traj, r = _rollout(policy, gen, grouped=spec.fresh_episodes)
        history.append(float(r.mean()))
        spec.update(policy, opt, traj, cfg, generator=torch.Generator().manual_seed(it), version=it)
    first, last = sum(history[:5]) / 5, sum(history[-5:]) / 5
    assert last > first + 0.1, f"{name}: mean bandit reward {first:.3f} -> {last:.3f} over {ITERATIONS} updates"
