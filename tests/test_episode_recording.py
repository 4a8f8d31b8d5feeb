"""``vlarl.episode_recording``: on a two-task ManiSkill RGB env, rolling out chunk by chunk (each scene starting
its next seed when its episode ends) and replaying each episode records exactly what observing every step does
(states, frames, actions, rewards, words, success, bit for bit, for episodes that end inside a chunk, on both
tasks' rows, each seed in the scene the batches give it); a replay that is not the same episode (another first
observation, end or outcome) is refused, a drift after the first observation is measured and reported; an attempt
past ``max_length`` is given up at its chunk's end (both ways, and by ``collect``); ``tries_per_seed`` attempts each
seed several times in one scene and keeps one episode per seed; ``vlarl.collect.collect`` takes
the replay path on RGB ManiSkill, writes the same dataset as ``replay=false`` and reports it.

The policy is a fixed function of each row's frame and state (its actions change when a frame does), standing in
for a VLA: what is tested is the recording, not the policy."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("mani_skill")
torch.set_num_threads(1)

TASKS = ["PushCubeToColor-v1", "PushCube-v1"]
SEEDS = [5, 6, 7, 8]  # two per scene: the second starts when the scene's first episode ends


class FramePolicy:
    """A chunk of 4 actions from each row's mean colour and first state value."""

    def __init__(self, action_dim: int):
        self.w = torch.randn(3, action_dim, generator=torch.Generator().manual_seed(0))

    def act(self, obs):
        colour = obs["images"]["base_camera"].float().mean((1, 2)) / 255.0
        a = torch.tanh((colour - 0.5) @ self.w * 4 + obs["state"][:, :1])
        return torch.stack([a * (1 - 0.2 * t) for t in range(4)], 1)


@pytest.fixture(scope="module")
def world():
    from simulators.maniskill_multitask import ManiSkillMultiTaskConfig
    from simulators.registry import make_env
    from vlarl import system_env

    system_env.apply()
    # 6 steps: every episode ends at step 2 of its second chunk of 4
    cfg = ManiSkillMultiTaskConfig(tasks=list(TASKS), control_mode="pd_ee_delta_pos", obs_mode="rgb", image_size=16,
                                   num_envs=2, reward_mode="sparse", max_episode_steps=6)
    env = make_env(cfg, num_envs=2)
    yield cfg, env, FramePolicy(env.spec.action_dim)
    env.close()


def _same(a, b) -> None:
    assert (a.seed, a.success, a.instruction) == (b.seed, b.success, b.instruction)
    for name in ("state", "actions", "rewards"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape and np.array_equal(x, y), name
    assert a.images.keys() == b.images.keys()
    for k in a.images:
        assert a.images[k].shape == b.images[k].shape and np.array_equal(a.images[k], b.images[k]), k


def test_replayed_episodes_equal_the_ones_observed_every_step_and_a_differing_one_is_refused(world):
    from simulators.base import EnvError
    from simulators.maniskill_tasks import task_instructions
    from vlarl.episode_recording import Replayer, records_by_replay, rollout_attempts, rollout_chunks

    cfg, env, policy = world
    assert records_by_replay(env, cfg) and not records_by_replay(env, dataclasses.replace(cfg, render_every_step=True))
    every_step = [e for half in (SEEDS[:2], SEEDS[2:]) for e in rollout_attempts(policy, env, half, True)]
    acted = rollout_chunks(policy, env, SEEDS, deterministic=True)
    assert [a.seed for a in acted] == SEEDS and [a.row for a in acted] == [0, 1, 0, 1]
    assert [len(a.actions) for a in acted] == [6] * 4 and sorted(acted[0].starts) == [0, 4]  # chunk starts
    for a in acted:
        assert a.instruction in task_instructions(TASKS[a.row])
    with pytest.raises(EnvError, match="reset_rows got rows"):
        env.reset_rows([2], [1])
    replayer = Replayer(env, cfg)
    try:
        replayed = [replayer.replay(a) for a in acted]
        for old, new in zip(every_step, replayed, strict=True):
            assert new is not None
            _same(old, new)
            assert new.images["base_camera"].shape == (6, 16, 16, 3) and new.images["base_camera"].dtype == np.uint8
        # the checks can fail: the seed (another first observation), an action less (the episode does not end),
        # another outcome; a drift after the first observation is measured and the replay's own record kept
        a = acted[0]
        seed = dataclasses.replace(a, seed=a.seed + 1)
        short = dataclasses.replace(a, actions=a.actions[:-1])
        outcome = dataclasses.replace(a, success=not a.success)
        assert [replayer.replay(x) for x in (seed, short, outcome)] == [None, None, None]
        assert replayer.max_state_drift == 0.0 and replayer.max_pixel_drift == 0.0
        frame = a.starts[4][1]["base_camera"].copy()
        frame[0, 0, 0] ^= np.uint8(1)
        drifted = dataclasses.replace(a, starts={**a.starts, 4: (a.starts[4][0] + np.float32(1e-3),
                                                                 {"base_camera": frame})})
        kept = replayer.replay(drifted)
        assert kept is not None and replayer.max_state_drift == pytest.approx(1e-3, rel=1e-3)
        assert replayer.max_pixel_drift == pytest.approx(1 / frame.size)
        _same(every_step[0], kept)  # what is written is the replay's own record
        at_start = dataclasses.replace(a, starts={**a.starts, 0: (a.starts[0][0] + np.float32(1e-6), a.starts[0][1])})
        assert replayer.replay(at_start) is None
    finally:
        replayer.close()


def test_an_attempt_past_max_length_is_given_up_and_its_scene_starts_the_next_seed(world, tmp_path):
    """Episodes here run 6 steps; giving up after 3 ends each at the end of its first chunk (4 steps) as a failure,
    the scene going on with its next seed at once: the same seeds in the same scenes, the same first 4 actions as
    the full episodes; observed every step, the same cut. ``collect`` gives up past ``max_length`` and keeps none."""
    from vlarl.collect import CollectConfig, collect
    from vlarl.episode_recording import rollout_attempts, rollout_chunks

    cfg, env, policy = world
    full = rollout_chunks(policy, env, SEEDS, deterministic=True)
    cut = rollout_chunks(policy, env, SEEDS, deterministic=True, give_up_after=3)
    assert [(a.seed, a.row) for a in cut] == [(a.seed, a.row) for a in full] == [(s, i % 2) for i, s in enumerate(SEEDS)]
    for a, b in zip(cut, full, strict=True):
        assert len(a.actions) == 4 and len(b.actions) == 6 and not a.success
        assert np.array_equal(a.actions, b.actions[:4]) and np.array_equal(a.rewards, b.rewards[:4])
        assert sorted(a.starts) == [0] and np.array_equal(a.starts[0][0], b.starts[0][0])
        assert np.array_equal(a.starts[0][1]["base_camera"], b.starts[0][1]["base_camera"])
    stepped = rollout_attempts(policy, env, SEEDS[:2], True, give_up_after=3)
    assert [len(e.actions) for e in stepped] == [4, 4] and not any(e.success for e in stepped)
    assert all(np.array_equal(e.actions, a.actions) for e, a in zip(stepped, cut, strict=False))
    c = CollectConfig(checkpoint="", output=str(tmp_path / "none"), env=cfg, episodes=4, seed=SEEDS[0],
                      max_attempts=4, num_envs=2, success_only=False, max_length=3, codec="lossless")
    summary = collect(policy, cfg, c, log=lambda m: None)
    assert summary["kept"] == 0 and [a["quality/length"] for a in summary["per_attempt"]] == [4] * 4
    assert not (tmp_path / "none").exists()


def test_tries_per_seed_attempts_each_seed_in_its_own_scene_and_keeps_it_once(world, tmp_path):
    """Two tries per seed on 2 scenes: attempts 0-3 run seeds 5, 6, 5, 6 (seed 5 twice in scene 0, 6 twice in scene
    1: the same task and instruction), 4-7 seeds 7, 8, 7, 8; the policy is deterministic, so every try of a seed is
    the same episode, and only its first is kept."""
    from vlarl.collect import CollectConfig, collect
    from vlarl.data.lerobot_v3 import read_lerobot_dataset

    cfg, _env, policy = world
    c = CollectConfig(checkpoint="", output=str(tmp_path / "ds"), env=cfg, episodes=8, seed=SEEDS[0],
                      max_attempts=8, num_envs=2, success_only=False, codec="lossless", tries_per_seed=2)
    summary = collect(policy, cfg, c, log=lambda m: None)
    rows = summary["per_attempt"]
    assert [a["seed"] for a in rows] == [5, 6, 5, 6, 7, 8, 7, 8]
    assert [a["kept"] for a in rows] == [True, True, False, False] * 2 and summary["kept"] == 4
    for first, again in ((0, 2), (1, 3), (4, 6), (5, 7)):
        a, b = rows[first], rows[again]
        assert a["seed"] == b["seed"] and a["instruction"] == b["instruction"]
        assert a["quality/return"] == b["quality/return"]
    assert rows[0]["instruction"] != rows[1]["instruction"]  # two scenes, two tasks
    assert [e.meta["seed"] for e in read_lerobot_dataset(tmp_path / "ds")] == SEEDS


@pytest.mark.heavy
def test_collect_replays_on_rgb_maniskill_and_writes_what_observing_every_step_writes(world, tmp_path):
    from vlarl.collect import CollectConfig, collect
    from vlarl.data.lerobot_v3 import read_lerobot_dataset

    cfg, _env, policy = world
    out = {}
    for replay in (True, False):
        c = CollectConfig(checkpoint="", output=str(tmp_path / str(replay)), env=cfg, episodes=4, seed=SEEDS[0],
                          max_attempts=4, num_envs=2, success_only=False, codec="lossless", replay=replay)
        summary = collect(policy, cfg, c, log=lambda m: None)
        assert summary["kept"] == 4 and summary["recorded_by"] == ("replay" if replay else "rollout")
        assert summary.get("replay_mismatches", 0) == 0 and (("replay_mismatches" in summary) == replay)
        assert summary.get("replay_max_state_drift", 0.0) == 0.0  # fresh scenes, short episodes: exact
        out[replay] = read_lerobot_dataset(tmp_path / str(replay), cameras=["base_camera"])
    assert len(out[True]) == len(out[False]) == 4
    for a, b in zip(out[True], out[False], strict=True):
        assert a.instruction == b.instruction and a.meta == b.meta and np.array_equal(a.state, b.state)
        assert np.array_equal(a.actions, b.actions) and a.state.shape[0] == 6
        assert np.array_equal(a.images["base_camera"], b.images["base_camera"])
        assert a.images["base_camera"].shape == (6, 16, 16, 3)
