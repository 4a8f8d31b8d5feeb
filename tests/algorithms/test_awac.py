"""Chunked AWAC (vlarl/algorithms/awac.py): its critics regress to the chunk TD target of vlarl.algorithms.chunk_td
(executed steps only, no bootstrap after a termination), and bad keys are refused in one line."""

from __future__ import annotations

import pytest
import torch

from policies.base import PolicySpec
from policies.mlp import MLPPolicy, MLPPolicyConfig
from vlarl.algorithms.awac import AWACConfig, awac_steps, make_awac_state, validate_awac

torch.set_num_threads(1)


def test_critics_learn_the_chunk_td_target_of_executed_steps():
    from tensordict import TensorDict

    torch.manual_seed(0)
    spec = PolicySpec(state_dim=3, action_dim=2, action_low=[-1, -1], action_high=[1, 1])
    policy = MLPPolicy(MLPPolicyConfig(hidden_sizes=[16], chunk_size=2, init_log_std=-1.0), spec)
    cfg = AWACConfig(gamma=0.5, q_lr=1e-2, batch_size=8, buffer_size=16, critic_hidden_sizes=[32], demo_ratio=0.0)
    st = make_awac_state(policy, cfg, spec)
    # two terminated transitions: both steps ran (target 1 + 0.5 * 2 = 2), and one whose second step did not
    # (its reward 5 is past the episode's end: target 1)
    rows = TensorDict({
        "state": torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), "actions": torch.full((2, 2, 2), 0.01),
        "step_rewards": torch.tensor([[1.0, 2.0], [1.0, 5.0]]), "step_mask": torch.tensor([[True, True], [True, False]]),
        "terminated": torch.tensor([True, True]), "truncated": torch.tensor([False, False]),
        "next_state": torch.zeros(2, 3)}, batch_size=[2])
    st.replay.online.extend(rows)
    m = awac_steps(policy, torch.optim.Adam(policy.parameters(), lr=1e-3), st, cfg, 300)
    assert m["critic_steps"] == 300 and st.critic_steps == 300
    mean, std = st.standardizer()
    with torch.no_grad():
        q = st.q((rows["state"] - mean) / std, rows["actions"] / cfg.action_scale).squeeze(-1)  # [E, 2]
    torch.testing.assert_close(q, torch.tensor([[2.0, 1.0]]).expand_as(q), atol=0.05, rtol=0.0)


@pytest.mark.parametrize("key, value", [("temperature", 0.0), ("tau", 1.5), ("buffer_size", 4), ("action_scale", 0.0)])
def test_bad_keys_are_one_line(key, value):
    problem = validate_awac(AWACConfig(**{key: value}))
    assert problem and problem.startswith(f"algorithm.{key}") and "\n" not in problem
    assert validate_awac(AWACConfig()) is None
