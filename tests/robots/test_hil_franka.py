"""Learning on the arm, against franky-sim (the real libfranka protocol on a loopback address, one simulator per test):
the safety layer sees every command, an operator stop ends the motion within the watchdog period, interventions
are recorded and flagged, the reward sources, and a killed run resumes without losing a recorded episode."""

from __future__ import annotations

import io
import json
import os
from dataclasses import replace

import numpy as np
import pytest
import torch
from waits import wait_until

from policies.base import PolicySpec
from policies.mlp import MLPPolicy, MLPPolicyConfig
from robots.cameras import CameraConfig
from robots.franky_driver import FrankyConfig, FrankyDriver
from robots.interventions import InterventionConfig, KeyboardOperator, ProtocolOperator, make_operator
from robots.reach_task import FrankaReachConfig, FrankaReachEnv
from robots.recorder import EpisodeFolderRecorder, recorded_episodes
from robots.rewards import RewardSourceConfig, make_reward_fn
from robots.safety import OperatorStop
from robots.success_classifier import ClassifierConfig, SuccessClassifier
from vlarl.data.lerobot_v3 import read_lerobot_dataset
from vlarl.data.lerobot_writer import LeRobotDatasetWriter
from vlarl.hil import HILConfig, LearnerConfig, run
from vlarl.hil.episodes import read_episode

pytestmark = pytest.mark.robot
torch.set_num_threads(1)


def _cfg(sim, **kw) -> FrankaReachConfig:
    """The reach env config for a test's simulator ``sim`` (its own 127.0.0.x: tests/robots/conftest.py)."""
    cfg = FrankaReachConfig(policy_hz=20.0, max_episode_steps=12, max_start_steps=20, **kw)
    cfg.franky = FrankyConfig(ip=sim.host, realtime="ignore")
    cfg.safety.watchdog_timeout = 2.0  # a busy 2-core machine must not trip it; the stop test sets its own
    return cfg


class SpyDriver:
    """The real ``FrankyDriver``; keeps every target it is asked to track (a spy at the robot boundary)."""

    def __init__(self, inner: FrankyDriver):
        self.inner, self.sent = inner, []

    def track(self, target, mode):
        self.sent.append(target)
        self.inner.track(target, mode)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _spy_safety(env):
    produced = []
    inner = env.safety.filter

    def filt(action):
        target, clamps = inner(action)
        produced.append(target)
        return target, clamps

    env.safety.filter = filt
    return produced


class Drift:
    """A policy stand-in that pushes the arm sideways (-y, away from every start -> goal line) every step."""

    def act(self, obs):
        a = np.zeros((1, 4, 7), np.float32)
        a[0, :, 1] = -0.05
        return torch.from_numpy(a)


def test_safety_layer_sees_every_command_and_interventions_are_recorded(franky_sim, tmp_path):
    cfg = _cfg(franky_sim, auto_reset=False)
    env = FrankaReachEnv(cfg, driver=SpyDriver(FrankyDriver(cfg.franky)))
    produced = _spy_safety(env)
    ic = InterventionConfig(device="scripted", protocol="guided_exploration", corridor_width=0.03, release_width=0.01)
    env.operator = make_operator(ic)
    env.recorder = EpisodeFolderRecorder(tmp_path / "episodes", lambda p: LeRobotDatasetWriter(p, fps=20),
                                         instruction=cfg.instruction, final_state=lambda: env._obs["state"][0])
    try:
        obs = env.reset(seed=3)
        starts = len(env.driver.sent)
        assert starts >= 1 and env.start_commands == starts  # the start motion went through the safety layer
        done = False
        while not done:
            res = env.chunk_step(Drift().act(obs))
            obs, done = res.obs, bool(res.done[0])
        # every command that reached the arm was produced by the safety layer, in order, and nothing else was sent
        assert len(env.driver.sent) == len(produced)
        assert all(a is b for a, b in zip(env.driver.sent, produced, strict=True))
        steps = env.recorder.last_steps
        flags = np.array([s.intervened for s in steps])
        assert flags.any() and not flags[0]  # the drift left the corridor, the operator took over
        assert env.intervention_steps == flags.sum() and env.takeovers >= 1
        dev = env.operator.device
        seg = (dev.goal - dev.start) / np.linalg.norm(dev.goal - dev.start)
        for s in (steps[i] for i in np.flatnonzero(flags)):  # the operator's executed action heads back to the line
            pos = s.obs["state"][0, 7:10]
            off_line = (pos - dev.start) - ((pos - dev.start) @ seg) * seg
            assert s.action[:3] @ -off_line > 0 and s.policy_action[1] == pytest.approx(-0.05)
        ep = read_lerobot_dataset(recorded_episodes(tmp_path / "episodes")[0], cameras=[])[0]
        assert ep.meta["intervention_steps"] == flags.sum() and ep.meta["takeovers"] == env.takeovers
        back = read_episode(recorded_episodes(tmp_path / "episodes")[0])
        np.testing.assert_array_equal(back["intervention"], flags)
        np.testing.assert_allclose(back["reward"], [s.reward for s in steps], rtol=1e-6)
        assert all(r < 0 for r in back["reward"][:-1])  # dense reward from state: minus the distance to the goal
    finally:
        env.close()


class StopAtStep:
    """An operator that presses stop at control step ``k`` (an event, not a clock)."""

    def __init__(self, k):
        self.k, self.calls, self.pressed_at = k, 0, None

    def on_reset(self, env):
        self.env = env

    def act(self, reading, policy_action):
        if self.calls == self.k:
            self.env.operator_stop.trigger()
            self.pressed_at = self.calls
        self.calls += 1
        return None


def test_operator_stop_ends_motion_within_the_watchdog_period(franky_sim):
    cfg = _cfg(franky_sim, auto_reset=False)
    cfg.safety.watchdog_timeout = 0.25
    r, w = os.pipe()
    with os.fdopen(r) as rf, os.fdopen(w, "w"):
        env = FrankaReachEnv(cfg, operator_stop=OperatorStop(rf))
        try:
            env.operator = StopAtStep(3)
            env.reset(seed=1)
            move = np.zeros((1, 10, 7), np.float32)
            move[0, :, 0] = 0.02
            res = env.chunk_step(move)
            executed = int(res.step_mask.sum())
            after = executed - (env.operator.pressed_at + 1)  # control steps sent after the press
            assert env.last_fault == "operator stop" and res.truncated[0].any()
            assert after * env.dt <= cfg.safety.watchdog_timeout and after == 0
            assert not env.driver.tracking and not env.driver.robot.is_in_control
            assert wait_until(lambda: np.abs(env.driver.read().dq).max() < 0.05, 30)  # the damping ramp ends
        finally:
            env.close()


def test_reward_sources_operator_key_classifier_and_critic(franky_sim, tmp_path):
    from policies.critics.process_reward import ProcessRewardConfig, ProcessRewardCritic

    cfg = _cfg(franky_sim, auto_reset=False, cameras=[CameraConfig(name="base", width=32, height=32)])
    env = FrankaReachEnv(cfg)
    still = np.zeros((1, 4, 7), np.float32)
    try:
        # the operator's success key (keyboard "y") ends the episode with reward 1
        r, w = os.pipe()
        with os.fdopen(r) as rf, os.fdopen(w, "w"):
            key = KeyboardOperator(InterventionConfig(device="keyboard"), rf)
            env.operator = ProtocolOperator(InterventionConfig(device="keyboard"), key)
            env.reward_fn = make_reward_fn(RewardSourceConfig(source="operator_key"), env)
            env.reset(seed=0)
            key.press("y")
            res = env.chunk_step(still)
            assert res.terminated[0, 0] and res.rewards[0, 0] == 1.0 and res.episode["success_once"][0] == 1
        env.operator = None
        # a success classifier on the camera frames: a tiny CNN whose output is set by its bias
        for bias, success in ((20.0, True), (-20.0, False)):
            model = SuccessClassifier(ClassifierConfig(image_size=32, channels=[4]))
            torch.nn.init.zeros_(model.head.weight)
            torch.nn.init.constant_(model.head.bias, bias)
            path = model.save(tmp_path / f"clf{bias}.pt")
            env.reward_fn = make_reward_fn(RewardSourceConfig(source="classifier", classifier_path=str(path)), env)
            env.reset(seed=0)
            res = env.chunk_step(still)
            assert bool(res.terminated[0].any()) == success and float(res.rewards.sum()) == (1.0 if success else 0.0)
            assert env.reward_fn.last_probability == pytest.approx(1.0 if success else 0.0, abs=1e-6)
        # the VLM process-reward critic: progress between consecutive frames, done from its probability
        torch.manual_seed(0)
        critic = ProcessRewardCritic(ProcessRewardConfig(  # tiny towers built here, nothing downloaded
            image_size=32, patch_size=8, vision_hidden=32, vision_layers=1, vision_heads=2, lm_hidden=32, lm_layers=1,
            lm_heads=2, lm_kv_heads=1, tokens_per_frame=4, max_instruction_tokens=32)).eval()
        rc = RewardSourceConfig(source="critic", threshold=1.01)  # never done: the episode runs to its limit
        env.reward_fn = make_reward_fn(rc, env, critic.score)
        frames = []
        env.recorder = type("R", (), {"add_step": lambda s, rec: frames.append(rec.obs["images"]["base"]),
                                      "end_episode": lambda s, m: None})()
        env.reset(seed=0)
        move = np.zeros((1, 3, 7), np.float32)
        move[0, :, 2] = -0.02
        res = env.chunk_step(move)
        prog, _ = critic.score(torch.from_numpy(np.concatenate(frames[:2])), torch.from_numpy(np.concatenate(frames[1:3])),
                               [cfg.instruction] * 2)
        np.testing.assert_allclose(res.rewards[0, :2].numpy(), prog.numpy(), atol=1e-5)
    finally:
        env.close()


class StopInEpisode(ProtocolOperator):
    """The scripted operator under the graded protocol, plus an operator-stop press at control step ``k`` of
    training episode ``episode`` (an event in the loop, no clock); counts what had reached the arm by then."""

    def __init__(self, cfg, episode, k):
        super().__init__(cfg, make_operator(cfg).device)
        self.stop_episode, self.k, self.calls, self.sent_at_press = episode, k, 0, None

    def act(self, reading, policy_action):
        if self.episode == self.stop_episode:
            if self.calls == self.k:
                self.env.operator_stop.trigger()
                self.sent_at_press = len(self.env.driver.sent)
            self.calls += 1
        return super().act(reading, policy_action)

    def on_reset(self, env):
        self.env = env
        super().on_reset(env)


def test_training_loop_sends_only_safety_filtered_commands_and_an_operator_stop_ends_it(franky_sim, tmp_path):
    """Through ``vlarl.hil.run`` (the training loop, not a hand-written episode loop): every command that reached
    the arm came out of the safety layer (count and identity), for start motions, operator takeovers and policy
    actions alike; an operator stop in episode 2 sends no further control step, stops the tracker, leaves the arm
    at rest within the watchdog period, ends the run with the episode recorded and checkpointed; resume goes on."""
    cfg = _cfg(franky_sim, auto_reset=False)  # the loop resets the env itself
    cfg.safety.watchdog_timeout = 0.5
    hil = HILConfig(episodes=5, eval_every=0, use_ray=False, checkpoint_every=10,
                    learner=LearnerConfig(batch_size=8, min_buffer=2, hidden=[32], updates_per_chunk=1.0),
                    interventions=InterventionConfig(device="scripted", protocol="graded", graded_episodes=[1, 1]))
    env = FrankaReachEnv(cfg, driver=SpyDriver(FrankyDriver(cfg.franky)), operator_stop=OperatorStop(io.StringIO()))
    produced = _spy_safety(env)
    out, pol = tmp_path / "run", _policy_dir(tmp_path)
    writer = lambda p: LeRobotDatasetWriter(p, fps=20)  # noqa: E731
    op = StopInEpisode(hil.interventions, episode=2, k=5)
    try:
        rows = run(hil, env, pol, out, writer, read_episode, operator=op)
        # filtered vs sent: one command per safety-layer output, the same objects, nothing else
        assert len(env.driver.sent) == len(produced) > 0
        assert all(a is b for a, b in zip(env.driver.sent, produced, strict=True))
        assert len(produced) == env.start_commands + sum(r["episode_len"] for r in rows)
        assert rows[0]["intervention_steps"] == rows[0]["episode_len"] and rows[1]["intervention_steps"] > 0
        # the stop: the step in progress at the press went out, no step after it, the run ended there
        assert [r["episode"] for r in rows] == [0, 1, 2] and rows[-1]["fault"] == "operator stop"
        after = len(env.driver.sent) - op.sent_at_press
        assert after == 1 and rows[-1]["episode_len"] == op.k + 1
        assert not env.driver.tracking and not env.driver.robot.is_in_control
        assert wait_until(lambda: np.abs(env.driver.read().dq).max() < 0.05, 30)  # the stop's ramp ends
        eps = recorded_episodes(out / "episodes")
        assert len(eps) == 3 and read_episode(eps[2])["meta"]["fault"] == "operator stop"
        assert torch.load(out / "learner.pt", weights_only=False)["episodes"] == 3  # checkpointed at the stop
        assert env.operator is None and env.recorder is None and env.reward_fn is None  # the loop's hooks came out
        rows2 = run(hil, env, pol, out, writer, read_episode, resume=True)
        assert [r["episode"] for r in rows2] == [3, 4] and rows2[0]["stage"] == "guided_exploration"
        assert len(env.driver.sent) == len(produced)  # resumed episodes went through the safety layer too
    finally:
        env.close()


def _policy_dir(tmp_path):
    spec = PolicySpec(state_dim=15, action_dim=7, action_low=[-0.1] * 7, action_high=[0.1] * 7)
    return MLPPolicy(MLPPolicyConfig(hidden_sizes=[32], chunk_size=4, init_log_std=-3.5), spec).save_pretrained(
        tmp_path / "init")


def test_learning_loop_records_every_episode_and_resumes_after_a_kill(franky_sim, tmp_path):
    cfg = _cfg(franky_sim)
    hil = HILConfig(episodes=3, eval_every=0, use_ray=False, checkpoint_every=1,
                    learner=LearnerConfig(batch_size=8, min_buffer=2, hidden=[32], updates_per_chunk=1.0),
                    interventions=InterventionConfig(device="scripted", protocol="graded", graded_episodes=[1, 1]))
    env = FrankaReachEnv(replace(cfg, auto_reset=False))
    out = tmp_path / "run"
    pol = _policy_dir(tmp_path)
    writer = lambda p: LeRobotDatasetWriter(p, fps=20)  # noqa: E731

    class Killed(Exception):
        pass

    def kill_after_two(row):
        if row["episode"] == 1:
            raise Killed

    try:
        with pytest.raises(Killed):
            run(hil, env, pol, out, writer, read_episode, on_episode=kill_after_two)
        eps = recorded_episodes(out / "episodes")
        assert len(eps) == 2  # both finished episodes are on disk, complete
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        assert [r["stage"] for r in rows] == ["demo_replay", "return_and_explore"]
        assert rows[0]["intervention_rate"] == 1.0 and rows[0]["takeovers"] == 1
        first = read_episode(eps[0])
        assert first["intervention"].all() and json.loads(json.dumps(first["final_state"].tolist()))
        v_before = torch.load(out / "learner.pt", weights_only=False)["version"]
        rows2 = run(replace(hil, episodes=3), env, pol, out, writer, read_episode, resume=True)
        assert [r["episode"] for r in rows2] == [2] and rows2[0]["stage"] == "guided_exploration"
        assert len(recorded_episodes(out / "episodes")) == 3
        assert torch.load(out / "learner.pt", weights_only=False)["version"] >= v_before
        assert (out / "policy").is_dir()  # the latest weights, loadable by vlarl-deploy
    finally:
        env.close()


@pytest.mark.slow
def test_learner_as_a_ray_actor_pushes_versioned_weights(franky_sim, tmp_path):
    """The asynchronous path: the learner's thread updates in a Ray actor while the arm moves; the actor pulls
    (version, weights) between episodes without waiting, so later episodes run newer policy versions."""
    hil = HILConfig(episodes=6, eval_every=0, use_ray=True, checkpoint_every=3,
                    learner=LearnerConfig(batch_size=8, min_buffer=2, hidden=[32], updates_per_chunk=4.0),
                    interventions=InterventionConfig(device="scripted", protocol="graded", graded_episodes=[2, 0]))
    env = FrankaReachEnv(_cfg(franky_sim, auto_reset=False))
    try:
        rows = run(hil, env, _policy_dir(tmp_path), tmp_path / "run", lambda p: LeRobotDatasetWriter(p, fps=20),
                   read_episode)
    finally:
        env.close()
        import ray

        ray.shutdown()
    versions = [r["policy_version"] for r in rows]
    assert versions == sorted(versions) and versions[-1] > 0 and rows[-1]["learner/updates"] > 0
    assert len(recorded_episodes(tmp_path / "run" / "episodes")) == 6
