"""An env's privileged ``obs["critic_state"]`` (the value head's input under ``policy.value_from=critic_state``)
travels with every row: the rollout worker's stage joins, ``TrajectoryBuilder``, ``flat_obs`` / ``index_obs`` /
``split_obs`` for the update's minibatches, and GRPO's column picks, step padding and round joins."""

from __future__ import annotations

import torch

from policies.base import ActionSample
from vlarl.data.builder import TrajectoryBuilder
from vlarl.data.trajectory import Trajectory, cat_obs, index_obs, split_obs

T, A, D, C = 2, 1, 3, 5


def _obs(t: int, B: int = 2) -> dict:
    """Step ``t``'s observation of B envs: row b's critic state is all ``10 * t + b``."""
    rows = torch.tensor([10.0 * t + b for b in range(B)])
    return {"state": torch.zeros(B, D), "critic_state": rows[:, None].expand(B, C).clone(), "images": {},
            "instruction": ["w"] * B}


def _trajectory(steps: int = 2) -> Trajectory:
    from tests.data.test_trajectory import _reply

    b = TrajectoryBuilder(stages=1, workers=2, policy_version=0)
    sample = ActionSample(actions=torch.zeros(2, T, A), logprob=torch.zeros(2, T, A), value=None,
                          replay={"actions": torch.zeros(2, T, A)})
    for t in range(steps):
        b.add_sample(t, 0, _obs(t), sample, None)
        b.add_results(t, 0, [_reply(1.0, 10, None), _reply(2.0, 20, None)])
    return b.build(steps, (torch.zeros(2), None))


def test_the_builder_and_the_update_rows_carry_the_critic_state():
    traj = _trajectory()
    assert traj.obs["critic_state"].shape == (2, 2, C)
    flat = traj.flat_obs()
    assert flat["critic_state"][:, 0].tolist() == [0.0, 1.0, 10.0, 11.0]  # time-major, like the state
    assert index_obs(flat, torch.tensor([3, 0]))["critic_state"][:, 0].tolist() == [11.0, 0.0]
    halves = split_obs(flat, 2)
    assert [h["critic_state"][:, 0].tolist() for h in halves] == [[0.0, 1.0], [10.0, 11.0]]
    assert cat_obs(halves)["critic_state"].equal(flat["critic_state"])
    # an env without it: the key stays absent (nothing invents one)
    assert "critic_state" not in index_obs({k: v for k, v in flat.items() if k != "critic_state"}, slice(0, 1))


def test_stages_join_in_global_row_order_with_their_critic_state():
    """Hybrid placement: stage s of worker k holds rows; the builder puts them back in global order."""
    b = TrajectoryBuilder(stages=2, workers=1, policy_version=0)
    from tests.data.test_trajectory import _reply

    sample = ActionSample(actions=torch.zeros(1, T, A), logprob=torch.zeros(1, T, A), value=None,
                          replay={"actions": torch.zeros(1, T, A)})
    for s in range(2):
        o = _obs(0, B=1)
        o["critic_state"] += s
        b.add_sample(0, s, o, sample, None)
        b.add_results(0, s, [_reply(1.0, 10, None)])
    traj = b.build(1, (torch.zeros(2), None))
    assert traj.obs["critic_state"][0, :, 0].tolist() == [0.0, 1.0]


def test_grpo_row_operations_carry_the_critic_state():
    from dataclasses import replace

    from vlarl.algorithms.grpo import cat_envs, index_envs, pad_steps

    traj = _trajectory(steps=2)
    one = index_envs(traj, torch.tensor([1]))
    assert one.obs["critic_state"][:, 0, 0].tolist() == [1.0, 11.0]
    short = index_envs(replace(traj, **{f: getattr(traj, f)[:1] for f in ("logprob", "values", "rewards", "dones",
                                                                           "truncated", "final_values")},
                               obs={**traj.obs, "state": traj.obs["state"][:1],
                                    "critic_state": traj.obs["critic_state"][:1]},
                               replay={k: v[:1] for k, v in traj.replay.items()},
                               step_mask=traj.step_mask[:1], step_rewards=traj.step_rewards[:1],
                               episode_return=traj.episode_return[:1], episode_success=traj.episode_success[:1],
                               policy_version=traj.policy_version[:1], next_state=traj.next_state[:1]),
                       torch.tensor([0]))
    padded = pad_steps(short, 2)
    assert padded.obs["critic_state"][:, 0, 0].tolist() == [0.0, 0.0]  # the pad repeats the last step
    both = cat_envs([one, short])
    assert both.obs["critic_state"].shape == (2, 2, C)
    assert both.obs["critic_state"][:, :, 0].tolist() == [[1.0, 0.0], [11.0, 0.0]]
