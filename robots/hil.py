"""Learn on the arm: the robot-side actor steps the Franka at the policy rate, a learner updates elsewhere.

    actor (this process, B = 1)                             learner (a Ray actor, or in-process)
    env.reset(seed) -> policy.sample -> env.chunk_step  --episode-->  add_episode -> update thread (UTD ratio)
         ^ every command through the safety layer                          |
         |                                   <--(version, weights)---------+   pulled between episodes,
    operator (robots.interventions) may take over                               never waited for
    episode -> <output>/episodes/episode_<n>/  (one LeRobot v3 dataset per episode, moved into place whole)

A killed actor or learner loses no recorded episode: each episode is a dataset of its own, written to a hidden
partial folder and renamed when complete. ``resume`` reloads every recorded episode into the learner's buffers
(``read_episode``), the learner's last checkpoint (``learner.pt``, atomic) and the episode counter, and goes on.

Robots may import nothing of vlarl or of ``policies`` but ``policies.base``: the dataset writer and reader are
handed in by the caller (``scripts/train_hil.py`` passes LeRobot v3's), as ``robots.recorder`` does.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robots.franka_env import StepRecord
from robots.franky_driver import RobotLinkError
from robots.interventions import InterventionConfig, make_operator
from robots.learner import LearnerConfig, make_learner
from robots.reach_task import HELD_OUT_SEED
from robots.recorder import LeRobotEpisodeRecorder
from robots.rewards import RewardSourceConfig, make_reward_fn

log = logging.getLogger(__name__)


@dataclass
class HILConfig:
    """``robot.hil`` of a learning run (configs/robot/hil_*.yaml)."""

    episodes: int = 200  # training episodes (operator episodes included)
    robot_minutes: float = 0.0  # stop after this much robot time (episode steps / policy_hz); 0 = no limit
    eval_every: int = 20  # episodes between held-out evaluations (operator off, deterministic policy); 0 = never
    eval_episodes: int = 10
    eval_seed: int = HELD_OUT_SEED
    seed: int = 0  # training episode k starts from seed * 10_000 + k
    checkpoint_every: int = 10  # episodes between learner checkpoints
    max_faults: int = 10  # episodes lost to robot faults before the run stops
    use_ray: bool = True  # the learner as a Ray actor (updates overlap robot time); False = in-process, in turn
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    interventions: InterventionConfig = field(default_factory=InterventionConfig)
    reward: RewardSourceConfig = field(default_factory=RewardSourceConfig)


class EpisodeFolderRecorder:
    """One LeRobot v3 dataset per episode under ``<root>/episode_<n>``: ``writer_factory(path)`` makes its writer.

    Keeps the finished episode's steps (``last_steps``, ``last_meta``) for the learner."""

    def __init__(self, root: str | Path, writer_factory: Callable[[Path], Any], first_index: int = 0,
                 instruction: str = "", final_state: Callable[[], np.ndarray] | None = None):
        self.root, self.factory, self.index, self.instruction = Path(root), writer_factory, first_index, instruction
        self.final_state = final_state  # the state after the last step (kept for bootstrapping on resume)
        self.root.mkdir(parents=True, exist_ok=True)
        self._steps: list[StepRecord] = []
        self.last_steps: list[StepRecord] = []
        self.last_meta: dict[str, Any] = {}

    def add_step(self, rec: StepRecord) -> None:
        self._steps.append(rec)

    def end_episode(self, meta: dict[str, Any]) -> None:
        steps, self._steps = self._steps, []
        self.last_steps, self.last_meta = steps, meta
        if not steps:
            return
        rec = LeRobotEpisodeRecorder(self.factory(self.root / f"episode_{self.index:06d}"), self.instruction)
        rec._steps = steps
        extra = {} if self.final_state is None else {"final_state": json.dumps(np.asarray(self.final_state()).tolist())}
        rec.end_episode({**meta, **extra})
        rec.close()  # the episode's dataset is complete and in place, or absent
        self.index += 1

    def close(self) -> None:
        self._steps = []


def recorded_episodes(root: str | Path) -> list[Path]:
    """The complete episode datasets under ``root`` (partial folders of a killed run are skipped)."""
    root = Path(root)
    return sorted(p for p in root.glob("episode_*") if p.is_dir()) if root.is_dir() else []


def episode_arrays(steps: list[StepRecord], final_state: np.ndarray, terminated: bool) -> dict[str, np.ndarray]:
    """The learner's view of one episode (see ``robots.learner.chunk_transitions``)."""
    return {"state": np.concatenate([s.obs["state"] for s in steps]).astype(np.float32),
            "action": np.stack([s.action for s in steps]).astype(np.float32),
            "reward": np.array([s.reward for s in steps], np.float32),
            "intervention": np.array([s.intervened for s in steps], bool),
            "final_state": np.asarray(final_state, np.float32).reshape(-1), "terminated": bool(terminated)}


class LearnerHost:
    """Holds the learner; with ``background`` a thread runs the owed updates while the robot moves."""

    def __init__(self, policy_dir: str, cfg: LearnerConfig, checkpoint: str = "", background: bool = True):
        from policies.base import Policy

        torch.set_num_threads(1)
        self.learner = make_learner(Policy.from_pretrained(policy_dir), cfg)
        if checkpoint and Path(checkpoint).is_file():
            self.learner.load_state_dict(torch.load(checkpoint, weights_only=False))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.metrics: dict[str, float] = {}
        self._thread = None
        if background:
            self._thread = threading.Thread(target=self._run, name="learner", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                m = self.learner.update(max_updates=8)
            if m:
                self.metrics = m
            else:
                self._stop.wait(0.05)

    def add_episode(self, episode: dict[str, np.ndarray], train: bool = True) -> int:
        with self._lock:
            n = self.learner.add_episode(episode)
            if not train:  # replaying recorded episodes on resume: their updates were already made
                self.learner._credit = 0.0
            return n

    def update(self) -> dict[str, float]:
        """Run the owed updates now (in-process mode)."""
        with self._lock:
            m = self.learner.update()
        self.metrics = m or self.metrics
        return self.metrics

    def weights(self, newer_than: int = -1) -> tuple[int, dict[str, torch.Tensor] | None, dict[str, float]]:
        with self._lock:
            if self.learner.version <= newer_than:
                return self.learner.version, None, self.metrics
            v, w = self.learner.weights()
        return v, w, {**self.metrics, "learner/updates": float(self.learner.updates)}

    def save(self, path: str) -> None:
        with self._lock:
            sd = self.learner.state_dict()
        tmp = f"{path}.tmp-{os.getpid()}"
        torch.save(sd, tmp)
        os.replace(tmp, path)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


class _Local:
    """Calls a ``LearnerHost`` in-process with the call shape of a Ray actor handle."""

    def __init__(self, host: LearnerHost):
        self.host = host

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.host, name)

        class _M:
            remote = staticmethod(fn)

        return _M


def _get(x: Any) -> Any:
    if type(x).__name__ == "ObjectRef":
        import ray

        return ray.get(x)
    return x


def _ready(x: Any) -> bool:
    if type(x).__name__ == "ObjectRef":
        import ray

        return bool(ray.wait([x], timeout=0)[0])
    return True


def run_episode(env: Any, policy: Any, seed: int, deterministic: bool) -> tuple[Any, bool]:
    """One episode on the arm: (last ChunkStepResult, terminated)."""
    obs = env.reset(seed=seed)
    while True:
        with torch.no_grad():
            actions = policy.act(obs) if deterministic else policy.sample(obs).actions
        res = env.chunk_step(actions)
        if bool(res.done[0]):
            return res, bool(res.terminated[0].any())
        obs = res.obs


def run(cfg: HILConfig, env: Any, policy_dir: str | Path, output: str | Path,
        writer_factory: Callable[[Path], Any], read_episode: Callable[[Path], dict[str, np.ndarray]] | None = None,
        resume: bool = False, on_episode: Callable[[dict[str, Any]], None] | None = None,
        critic: Callable[..., Any] | None = None) -> list[dict[str, Any]]:
    """Train on ``env`` (a Franka env, ``auto_reset`` off) from the policy at ``policy_dir``; returns the metrics rows.

    Writes ``<output>/episodes/``, ``<output>/learner.pt``, ``<output>/policy/`` (latest weights) and
    ``<output>/metrics.jsonl`` (one row per episode: success, return, intervention rate, takeovers, clamps,
    robot time, policy version; held-out evaluations as rows with ``eval/success``)."""
    from policies.base import Policy

    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    ep_root, ckpt = out / "episodes", out / "learner.pt"
    done_eps = recorded_episodes(ep_root)
    if done_eps and not resume:
        raise FileExistsError(f"'{out}' already holds {len(done_eps)} episodes; pass resume=true or a new output")
    policy = Policy.from_pretrained(str(out / "policy") if resume and (out / "policy").is_dir() else policy_dir)
    policy.eval()
    host_args = (str(policy_dir), cfg.learner, str(ckpt) if resume else "")
    if cfg.use_ray:
        import ray

        if not ray.is_initialized():
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        learner: Any = ray.remote(num_cpus=1)(LearnerHost).remote(*host_args, background=True)
    else:
        learner = _Local(LearnerHost(*host_args, background=False))
    if resume:
        if done_eps and read_episode is None:
            raise ValueError("resume needs read_episode to reload the recorded episodes into the replay buffers")
        for p in done_eps:
            _get(learner.add_episode.remote(read_episode(p), False))
    rows: list[dict[str, Any]] = []
    first = len(done_eps)
    operator = make_operator(cfg.interventions, first_episode=first)
    reward_fn = make_reward_fn(cfg.reward, env, critic)
    recorder = EpisodeFolderRecorder(ep_root, writer_factory, first_index=first, instruction=env.cfg.instruction,
                                     final_state=lambda: env._obs["state"][0])
    env.operator, env.reward_fn, env.recorder = operator, reward_fn, recorder
    env.cfg.auto_reset = False
    version, pending = -1, learner.weights.remote(-1)
    robot_s, faults = 0.0, 0
    metrics_file = open(out / "metrics.jsonl", "a")  # noqa: SIM115 - closed in finally
    try:
        for k in range(first, cfg.episodes):
            if _ready(pending):  # newest weights, if the learner has published some; never waits
                v, w, lm = _get(pending)
                if w is not None:
                    policy.load_state_dict(w)
                    version = v
                pending = learner.weights.remote(version)
            try:
                res, terminated = run_episode(env, policy, cfg.seed * 10_000 + k, deterministic=False)
            except RobotLinkError as exc:  # e.g. a reflex during the start motion: recover, count, go on
                log.error("episode %d lost to a robot fault (%s); recovering", k, exc)
                env.recover()
                faults += 1
                if faults > cfg.max_faults:
                    raise
                continue
            steps = recorder.last_steps
            robot_s += len(steps) / env.cfg.policy_hz
            ep = episode_arrays(steps, res.final_obs["state"][0], terminated) if steps else None
            if ep is not None:
                learner.add_episode.remote(ep)
                if not cfg.use_ray:
                    _get(learner.update.remote())
            row = {"episode": k, "stage": operator.stage if operator else "none", "policy_version": version,
                   "success": float(res.episode["success_once"][0]), "return": float(res.episode["return"][0]),
                   "episode_len": len(steps), "intervention_steps": env.intervention_steps,
                   "takeovers": env.takeovers, "intervention_rate": env.intervention_steps / max(1, len(steps)),
                   "clamps": len(env.safety.clamps), "goal_reached": float(getattr(env, "goal_reached", np.nan)),
                   "robot_minutes": robot_s / 60.0, "fault": env.last_fault or ""}
            if (k + 1) % max(1, cfg.checkpoint_every) == 0 or k + 1 == cfg.episodes:
                _get(learner.save.remote(str(ckpt)))
                v, w, lm = _get(learner.weights.remote(-1))
                if w is not None:
                    policy.load_state_dict(w)
                    version = v
                    policy.save_pretrained(out / "policy")
                row.update(lm)
            if cfg.eval_every and ((k + 1) % cfg.eval_every == 0 or k + 1 == cfg.episodes):
                row["eval/success"] = evaluate(env, policy, cfg)
            rows.append(row)
            metrics_file.write(json.dumps(row) + "\n")
            metrics_file.flush()
            if on_episode is not None:
                on_episode(row)
            log.info("episode %d: %s", k, row)
            if cfg.robot_minutes and robot_s / 60.0 >= cfg.robot_minutes:
                break
    finally:
        metrics_file.close()
        env.operator, env.recorder = None, None
        _get(learner.close.remote())
    return rows


def evaluate(env: Any, policy: Any, cfg: HILConfig) -> float:
    """Success rate on held-out starts (seeds from ``eval_seed``), operator off, deterministic actions, not recorded."""
    saved = env.operator, env.recorder
    env.operator, env.recorder = None, None
    try:
        wins = [float(run_episode(env, policy, cfg.eval_seed + i, deterministic=True)[0].episode["success_once"][0])
                for i in range(cfg.eval_episodes)]
    finally:
        env.operator, env.recorder = saved
    return float(np.mean(wins)) if wins else float("nan")
