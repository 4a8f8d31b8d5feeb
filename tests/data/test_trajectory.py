"""The trajectory's typed per-step facts: what ``TrajectoryBuilder`` records from real env replies, how row
operations keep them in step, and the one-line refusal of a trajectory that lacks one."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from policies.base import ActionSample
from simulators.base import ChunkStepResult
from vlarl.data.builder import TrajectoryBuilder
from vlarl.data.trajectory import Trajectory, index_obs, map_step_facts

T, A, D, S = 2, 1, 3, 4
CAMS = ("base_camera", "wrist")


def _obs(state: float, pixel: int) -> dict:
    return {"state": torch.full((1, D), state),
            "images": {k: torch.full((1, S, S, 3), pixel + i, dtype=torch.uint8) for i, k in enumerate(CAMS)},
            "instruction": ["push"]}


def _reply(state: float, pixel: int, final: int | None) -> ChunkStepResult:
    """One env's reply; ``final`` set: its episode ended after the first action (return 5, success)."""
    ended = final is not None
    nan = torch.tensor([float("nan")])
    return ChunkStepResult(
        obs=_obs(state, pixel), rewards=torch.tensor([[1.0, 0.0 if ended else 2.0]]),
        terminated=torch.tensor([[ended, False]]), truncated=torch.zeros(1, T, dtype=torch.bool),
        step_mask=torch.tensor([[True, not ended]]), final_obs=_obs(-state, final) if ended else None,
        done=torch.tensor([ended]),
        episode={"return": torch.tensor([5.0]) if ended else nan, "success_once": torch.tensor([1.0]) if ended else nan})


def _build(replay: dict | None = None, **kw) -> Trajectory:
    b = TrajectoryBuilder(stages=1, workers=2, policy_version=7, **kw)
    sample = ActionSample(actions=torch.zeros(2, T, A), logprob=torch.zeros(2, T, A), value=None,
                          replay={"actions": torch.zeros(2, T, A)} if replay is None else replay)
    images = {k: v.expand(2, -1, -1, -1) for k, v in _obs(0, 0)["images"].items()}
    b.add_sample(0, 0, {"state": torch.zeros(2, D), "images": images, "instruction": ["a", "b"]},
                 sample, None)
    b.add_results(0, 0, [_reply(1.0, 10, None), _reply(2.0, 20, 99)])  # env 1's episode ended: final obs
    return b.build(1, (torch.zeros(2), None))


def test_builder_records_the_typed_facts_from_the_env_replies():
    traj = _build(next_images=True)
    assert traj.step_mask.tolist() == [[[True, True], [True, False]]]
    assert traj.step_rewards.tolist() == [[[1.0, 2.0], [1.0, 0.0]]]
    assert traj.rewards.tolist() == [[3.0, 1.0]]
    assert traj.episode_return[0, 1].item() == 5.0 and traj.episode_return[0, 0].isnan()
    assert traj.episode_success[0, 1].item() == 1.0 and traj.episode_success[0, 0].isnan()
    assert traj.policy_version.tolist() == [[7.0, 7.0]]
    assert traj.next_state[0, :, 0].tolist() == [1.0, -2.0]  # the ended episode's final state
    assert sorted(traj.next_images) == sorted(CAMS)
    img = traj.next_images["base_camera"]
    assert img.dtype == torch.uint8 and img.shape == (1, 2, S, S, 3)
    assert img[0, :, 0, 0, 0].tolist() == [10, 99]  # the ended episode's final frame
    assert traj.extras == {}


def test_the_executed_chunk_rides_along_when_the_samples_replay_is_a_chain():
    """A flow or diffusion sample replays its chain; the trajectory also keeps the chunk it executed (what an
    off-policy replay stores), and a replay that holds its own ``actions`` keeps them as they are."""
    chain = torch.arange(2 * 3 * T * A, dtype=torch.float32).view(2, 3, T, A)
    traj = _build(replay={"chain": chain})
    assert sorted(traj.replay) == ["actions", "chain"] and traj.replay["actions"].shape == (1, 2, T, A)
    assert torch.equal(traj.replay["chain"][0], chain) and not traj.replay["actions"].any()
    own = torch.ones(2, T, A)
    assert torch.equal(_build(replay={"actions": own}).replay["actions"][0], own)


def test_builder_keeps_only_the_critic_camera_or_no_images():
    assert list(_build(camera="wrist").next_images) == ["wrist"]
    assert _build(camera="wrist").next_images["wrist"][0, :, 0, 0, 0].tolist() == [11, 100]
    assert _build().next_images == {}


def test_map_step_facts_keeps_the_facts_in_step_with_a_row_operation():
    traj = _build(camera="wrist")
    two = replace(traj, **map_step_facts([traj, traj], lambda _, vs: torch.cat(vs, 1)))
    assert two.step_mask.shape == (1, 4, T) and two.next_state.shape == (1, 4, D)
    assert two.next_images["wrist"].shape == (1, 4, S, S, 3)
    assert two.episode_return[0, 3].item() == 5.0


def test_a_missing_fact_is_refused_in_one_line_naming_it():
    traj = replace(_build(), step_rewards=None)
    with pytest.raises(ValueError, match=r"^PPO needs the trajectory's \['step_rewards', 'next_images.wrist'\]; "
                                         r"vlarl.data.builder.TrajectoryBuilder records them while collecting$"):
        traj.require("step_mask", "step_rewards", "next_images.wrist", why="PPO")


def _two_steps(words_at_1: list[str]) -> Trajectory:
    """Two chunk steps of two envs: the words are ["a", "b"] at step 0 and ``words_at_1`` at step 1."""
    b = TrajectoryBuilder(stages=1, workers=2, policy_version=0)
    sample = ActionSample(actions=torch.zeros(2, T, A), logprob=torch.zeros(2, T, A), value=None,
                          replay={"actions": torch.zeros(2, T, A)})
    images = {k: v.expand(2, -1, -1, -1) for k, v in _obs(0, 0)["images"].items()}
    for t, words in enumerate((["a", "b"], words_at_1)):
        b.add_sample(t, 0, {"state": torch.full((2, D), float(t)), "images": images, "instruction": words},
                     sample, None)
        b.add_results(t, 0, [_reply(1.0, 10, None), _reply(2.0, 20, None)])
    return b.build(2, (torch.zeros(2), None))


def test_each_row_keeps_the_words_it_was_sampled_with_when_a_slot_draws_new_ones():
    """A language task draws its instruction per episode: env 1's words change at step 1. Before, the rollout
    kept step 0's words for every step, so PPO re-scored step 1 of env 1 under the other instruction."""
    traj = _two_steps(["a", "c"])
    assert traj.obs["instruction"] == ["a", "b", "a", "c"]  # per row, time-major
    flat = traj.flat_obs()
    assert flat["instruction"] == ["a", "b", "a", "c"] and flat["state"][:, 0].tolist() == [0, 0, 1, 1]
    assert index_obs(flat, torch.tensor([3, 0]))["instruction"] == ["c", "a"]
    same = _two_steps(["a", "b"])  # unchanged words: one per env, as every consumer of the rollout reads them
    assert same.obs["instruction"] == ["a", "b"] and same.flat_obs()["instruction"] == ["a", "b", "a", "b"]


def test_an_instruction_list_of_another_length_is_refused_in_one_line():
    traj = replace(_two_steps(["a", "b"]), obs={**_two_steps(["a", "b"]).obs, "instruction": ["a", "b", "c"]})
    with pytest.raises(ValueError, match=r"3 strings for 2 steps x 2 envs; .* one per env \(2\) or one per row \(4\)"):
        traj.flat_obs()


def test_grpo_row_operations_keep_the_per_row_words():
    """GRPO picks env columns and joins rounds of different length: each row keeps its own words."""
    from vlarl.algorithms.grpo import cat_envs, index_envs

    traj = _two_steps(["a", "c"])
    assert index_envs(traj, torch.tensor([1])).obs["instruction"] == ["b", "c"]
    assert index_envs(traj, torch.tensor([0])).obs["instruction"] == ["a"]  # unchanged words: one per env
    short = index_envs(replace(traj, **{f: getattr(traj, f)[:1] for f in ("logprob", "values", "rewards", "dones",
                                                                           "truncated", "final_values")},
                               obs={**traj.obs, "state": traj.obs["state"][:1],
                                    "images": {k: v[:1] for k, v in traj.obs["images"].items()},
                                    "instruction": ["a", "b"]},
                               replay={k: v[:1] for k, v in traj.replay.items()},
                               **map_step_facts([traj], lambda _, v: v[0][:1])), torch.tensor([1]))
    joined = cat_envs([traj, short])  # the one-step round is padded with its last step's words
    assert joined.obs["instruction"] == ["a", "b", "b", "a", "c", "b"]
    assert joined.flat_obs()["instruction"][4] == "c"


def test_steps_with_one_instruction_for_the_batch_stack_to_one_per_env():
    """Several steps that each report one instruction for all B envs stack to B equal words (not N), so the rows
    read back for every step and env."""
    from vlarl.data.trajectory import instruction_rows, stack_obs

    steps = [{"state": torch.zeros(4, 2), "images": {}, "instruction": ["push"]} for _ in range(3)]
    obs = stack_obs(steps)
    assert obs["instruction"] == ["push"] * 4
    assert instruction_rows(obs, 3, 4) == ["push"] * 12
