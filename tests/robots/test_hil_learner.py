"""The robot loop's pieces that need no arm: chunk transitions, the AWAC learner (vlarl.algorithms.awac through
vlarl.hil.RobotLearner), the operator protocol."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from policies.base import PolicySpec
from policies.mlp import MLPPolicy, MLPPolicyConfig
from robots.interventions import InterventionConfig, ProtocolOperator, ScriptedCorridorOperator, stage
from vlarl.algorithms.chunk_td import discounted_chunk_reward
from vlarl.hil import LearnerConfig, RobotLearner, episode_transitions

torch.set_num_threads(1)


def _episode(L=5, A=2, terminated=True):
    return {"state": np.arange(L * 3, dtype=np.float32).reshape(L, 3), "action": np.ones((L, A), np.float32),
            "reward": np.array([1.0, 2.0, 3.0, 4.0, 5.0][:L], np.float32), "intervention": np.array([0, 0, 1, 0, 0][:L], bool),
            "final_state": np.full(3, -1.0, np.float32), "terminated": terminated}


def _reward_and_discount(rows, gamma):
    """The chunk TD target's constants per transition: discounted reward sum and gamma^k (0 when terminated)."""
    reward, k = discounted_chunk_reward(rows["step_rewards"], rows["step_mask"], gamma)
    return reward, gamma**k * (1 - rows["terminated"].float())


def test_chunk_transitions_by_hand():
    rows, intervened = episode_transitions(_episode(), chunk=2)
    reward, discount = _reward_and_discount(rows, 0.5)
    assert rows.batch_size[0] == 3
    assert reward[0] == pytest.approx(1 + 0.5 * 2) and discount[0] == pytest.approx(0.25)
    assert reward[1] == pytest.approx(3 + 0.5 * 4) and intervened.tolist() == [False, True, False]
    np.testing.assert_array_equal(rows["next_state"][1], _episode()["state"][4])
    # the last chunk ran 1 step: reward 5, padded action, bootstraps from the final state unless terminated
    assert reward[2] == pytest.approx(5.0) and discount[2] == 0.0
    assert rows["step_mask"][2].tolist() == [True, False] and rows["terminated"][2] and not rows["truncated"][2]
    np.testing.assert_array_equal(rows["actions"][2], [[1, 1], [0, 0]])
    np.testing.assert_array_equal(rows["next_state"][2], [-1, -1, -1])
    trunc, _ = episode_transitions(_episode(terminated=False), chunk=2)
    assert _reward_and_discount(trunc, 0.5)[1][2] == pytest.approx(0.5)  # truncated: bootstrap with gamma^1
    assert trunc["truncated"][2] and not trunc["terminated"][2]


def _policy(chunk=2):
    spec = PolicySpec(state_dim=3, action_dim=2, action_low=[-1, -1], action_high=[1, 1])
    return MLPPolicy(MLPPolicyConfig(hidden_sizes=[32], chunk_size=chunk, init_log_std=-1.0), spec)


def test_awac_mixes_demonstrations_and_moves_toward_good_actions():
    torch.manual_seed(0)
    cfg = LearnerConfig(batch_size=32, demo_ratio=0.5, min_buffer=4, updates_per_chunk=5.0, hidden=[32],
                        action_scale=1.0, temperature=0.1, lr=3e-3)
    learner = RobotLearner(_policy(), cfg)
    rng = np.random.default_rng(0)
    for _ in range(20):  # reward = first action entry: the good action is +1; interventions show +1
        L = 4
        act = rng.uniform(-1, 1, (L, 2)).astype(np.float32)
        inter = rng.random(L) < 0.25
        act[inter, 0] = 1.0
        learner.add_episode({"state": rng.normal(size=(L, 3)).astype(np.float32), "action": act,
                             "reward": act[:, 0].copy(), "intervention": inter,
                             "final_state": np.zeros(3, np.float32), "terminated": True})
        learner.update()
    assert len(learner.replay.demos) > 0 and len(learner.replay.online) == 20 * 2
    batch = learner.replay.sample(32)
    assert batch["state"].shape == (32, 3) and batch["actions"].shape == (32, 2, 2)
    assert int(batch["is_demo"].sum()) == 16  # demo_ratio of the batch from the intervention chunks
    mean = learner.policy.act({"state": torch.zeros(8, 3)})
    assert learner.version == 19 and mean[..., 0].mean() > 0.3  # one update per episode once 4 chunks are in; the weighted actor prefers +1


def test_awac_refuses_a_policy_it_cannot_score():
    class NoReplay(torch.nn.Module):
        spec = SimpleNamespace(action_dim=2, state_dim=3)
        chunk_size = 1

        def sample(self, obs):
            return SimpleNamespace(replay={"tokens": torch.zeros(1)})

    with pytest.raises(ValueError, match="policy=mlp") as e:
        RobotLearner(NoReplay(), LearnerConfig())
    assert "\n" not in str(e.value)


def test_graded_protocol_and_corridor_operator():
    cfg = InterventionConfig(device="scripted", protocol="graded", graded_episodes=[1, 2], corridor_width=0.05,
                             release_width=0.01, return_fraction=0.5)
    assert [stage(cfg, k) for k in range(5)] == ["demo_replay", "return_and_explore", "return_and_explore",
                                                  "guided_exploration", "guided_exploration"]
    dev = ScriptedCorridorOperator(cfg)
    op = ProtocolOperator(cfg, dev)
    env = SimpleNamespace(_reading=SimpleNamespace(pos=np.zeros(3)), goal=np.array([0.2, 0.0, 0.0]))
    at = lambda *p: SimpleNamespace(pos=np.array(p, float))  # noqa: E731
    pa = np.zeros(7, np.float32)
    op.on_reset(env)  # episode 0: the operator drives every step, toward the goal
    a = op.act(at(0.05, 0.0, 0.0), pa)
    assert a is not None and a[0] > 0 and np.all(a[3:] == 0)
    op.on_reset(env)  # episode 1: operator until half way, then the policy, for good
    assert op.act(at(0.05, 0.0, 0.0), pa) is not None
    assert op.act(at(0.12, 0.0, 0.0), pa) is None
    assert op.act(at(0.05, 0.0, 0.0), pa) is None
    for _ in range(2):
        op.on_reset(env)
    assert op.stage == "guided_exploration"
    assert op.act(at(0.1, 0.03, 0.0), pa) is None  # inside the corridor
    back = op.act(at(0.1, 0.08, 0.0), pa)  # outside: takes over, steers back (-y) and on (+x)
    assert back is not None and back[1] < 0 and back[0] > 0
    assert op.act(at(0.1, 0.03, 0.0), pa) is not None  # keeps the arm until within release_width
    assert op.act(at(0.1, 0.005, 0.0), pa) is None


def test_bad_intervention_config_is_one_line():
    with pytest.raises(ValueError, match="choose one of"):
        InterventionConfig(protocol="demo").validate()
    with pytest.raises(ValueError, match="graded_episodes"):
        InterventionConfig(graded_episodes=[1]).validate()
