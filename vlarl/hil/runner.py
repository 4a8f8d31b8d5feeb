"""Learn on the arm: the human-in-the-loop training loop, a runner over a B = 1 robot env.

    actor (this process, B = 1)                             learner (vlarl.hil.host: a Ray actor, or in-process)
    env.reset(seed) -> policy.sample -> env.chunk_step  --episode-->  RobotLearner.add_episode -> updates (UTD)
         ^ every command through the safety layer                          |
         |                                   <--(version, weights)---------+   pulled between episodes,
    operator (robots.interventions) may take over                               never waited for
    episode -> <output>/episodes/episode_<n>/  (one LeRobot v3 dataset per episode, moved into place whole)

The env is ``robots``' (Franka env, safety layer, operators, rewards, recorder); what the loop plugs into it (the
operator, the reward source, the episode recorder) goes in through ``FrankaEnv.hooks`` for the training episodes
and comes out again for the held-out evaluations. The learning is vlarl's (``vlarl.hil.learner``: vlarl's replay,
AWAC or chunked SAC/RLPD with Q ensembles and chunk TD targets).

A kill loses no recorded episode. Each episode is a dataset of its own, published whole and fsynced as it ends
(``robots.recorder.EpisodeFolderRecorder``); ``learner.pt`` (weights, optimizers, counters, RNG) and the
``policy/`` export are replaced atomically; ``metrics.jsonl`` is appended and fsynced per episode.
* Kill the actor (this process): the episode in flight is lost (its arm motion stops with the libfranka link),
  nothing else. ``resume=true`` publishes episodes a kill left staged, sweeps partial ones, reloads every recorded
  episode into the learner's buffers (those its checkpoint counted refill the buffers only), rebuilds the metrics
  rows a kill cut off from the episodes themselves, and goes on at the next episode number, seed and stage.
* Kill the learner (its Ray actor): the actor sees it at its next pull, starts a new learner from ``learner.pt``
  and the recorded episodes (``vlarl.hil.host.LearnerLink``), and the arm goes on; the updates since the last
  checkpoint are lost.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robots.franka_env import StepRecord
from robots.franky_driver import RobotLinkError
from robots.interventions import ProtocolOperator, make_operator
from robots.recorder import (
    EpisodeFolderRecorder,
    atomic_save,
    recorded_episodes,
    sweep_partial_episodes,
    sweep_temporaries,
)
from robots.rewards import make_reward_fn
from vlarl.hil.config import HILConfig
from vlarl.hil.episodes import lerobot_writer, read_episode
from vlarl.hil.host import CHECKPOINT, LearnerLink

log = logging.getLogger(__name__)


def episode_arrays(steps: list[StepRecord], final_state: np.ndarray, terminated: bool) -> dict[str, np.ndarray]:
    """The learner's view of one episode (see ``vlarl.hil.learner.episode_transitions``)."""
    return {"state": np.concatenate([s.obs["state"] for s in steps]).astype(np.float32),
            "action": np.stack([s.action for s in steps]).astype(np.float32),
            "reward": np.array([s.reward for s in steps], np.float32),
            "intervention": np.array([s.intervened for s in steps], bool),
            "final_state": np.asarray(final_state, np.float32).reshape(-1), "terminated": bool(terminated)}


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


def _operator_stopped(env: Any) -> bool:
    return env.last_fault == "operator stop"


_ROW_KEYS = ("stage", "policy_version", "success", "episode_len", "intervention_steps", "takeovers", "clamps",
             "goal_reached", "fault")


def episode_row(k: int, meta: dict[str, Any], rewards: np.ndarray, robot_s: float) -> dict[str, Any]:
    """The metrics row of training episode ``k`` from what its recording holds (``meta``: its episode-table
    columns; ``rewards [L]``), so a row lost with a killed process is rebuilt from the episode on resume."""
    row: dict[str, Any] = {"episode": k, **{key: meta[key] for key in _ROW_KEYS if key in meta}}
    row["success"] = float(row.get("success", 0.0))
    row["return"] = float(np.sum(rewards))
    row["intervention_rate"] = float(row.get("intervention_steps", 0)) / max(1, len(rewards))
    row["robot_minutes"] = robot_s / 60.0
    return row


def _logged_rows(path: Path) -> list[dict[str, Any]]:
    """The complete rows of ``metrics.jsonl``; a torn last line (a kill mid-write) is cut off the file."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        log.warning("%s ends in a torn row (%d bytes); cutting it", path, len(data) - end)
        with open(path, "r+b") as f:
            f.truncate(end)
    return [json.loads(line) for line in data[:end].splitlines() if line.strip()]


def _append_row(f: Any, row: dict[str, Any]) -> None:
    f.write(json.dumps(row) + "\n")
    f.flush()
    os.fsync(f.fileno())


def check_output(output: str | Path, resume: bool) -> None:
    """A fresh run must not write into an earlier one (FileExistsError, one line)."""
    out = Path(output)
    n = len(recorded_episodes(out / "episodes"))
    if not resume and (n or (out / CHECKPOINT).exists()):
        raise FileExistsError(f"output '{out}' already holds a run ({n} episodes); pass resume=true or a new output")


def restore_output(out: Path, resume: bool, read_episode: Callable[[Path], dict[str, Any]] | None,
                   policy_hz: float) -> list[dict[str, Any]]:
    """Make ``out`` ready for a run segment and return its recorded episodes (``read_episode`` of each; [] for a
    fresh run). On resume: sweep what a kill left (staged episodes published, partial ones and temporaries
    removed) and append the metrics rows a killed process did not write, rebuilt from the episodes themselves."""
    check_output(out, resume)
    out.mkdir(parents=True, exist_ok=True)
    ep_root = out / "episodes"
    if resume:
        sweep_temporaries(out)
        published, swept = sweep_partial_episodes(ep_root)
        if published or swept:
            log.warning("resume: %d staged episode(s) published, %d partial one(s) removed", published, swept)
    done = recorded_episodes(ep_root)
    if done and read_episode is None:
        raise ValueError("resume needs read_episode to reload the recorded episodes into the replay buffers")
    history = [read_episode(p) for p in done] if done else []
    metrics_path = out / "metrics.jsonl"
    logged = {r["episode"] for r in _logged_rows(metrics_path) if "episode" in r}
    with open(metrics_path, "a") as f:
        robot_s = 0.0
        for i, ep in enumerate(history):
            robot_s += len(ep["reward"]) / policy_hz
            if i not in logged:
                _append_row(f, {**episode_row(i, ep.get("meta", {}), ep["reward"], robot_s), "rebuilt": True})
    return history


class TrainingEpisodes:
    """The loop's state between episodes: the robot-side policy and its version, the learner link, the recorder,
    robot time and the faults met in a row. ``episode(k)`` plays, records and learns from training episode ``k``
    (and runs the checkpoint and evaluation that fall after it)."""

    def __init__(self, cfg: HILConfig, env: Any, policy: Any, link: LearnerLink, operator: Any, out: Path,
                 writer_factory: Callable[[Path], Any], first: int, robot_s: float):
        self.cfg, self.env, self.policy, self.link, self.operator, self.out = cfg, env, policy, link, operator, out
        self.version, self.seed, self.robot_s = -1, 0, robot_s
        self.faults = 0  # in a row: a recovered fault never ends the run, max_faults of them in a row do
        self.fault_log: list[str] = []  # faults since the last row: start motions and evaluations (recovered)
        self.stopped = False  # an operator stop ended the last episode (or its evaluation)
        self.recorder = EpisodeFolderRecorder(out / "episodes", writer_factory, first_index=first,
                                              instruction=env.cfg.instruction,
                                              final_state=lambda: env.observe()["state"][0],
                                              episode_meta=self.episode_meta)

    def episode_meta(self) -> dict[str, Any]:
        """Stored with each recorded episode (read when its metrics row is rebuilt)."""
        return {"stage": getattr(self.operator, "stage", "none"), "policy_version": self.version, "seed": self.seed,
                "clamps": len(self.env.safety.clamps),
                "goal_reached": float(getattr(self.env, "goal_reached", np.nan))}

    def out_of_robot_time(self) -> bool:
        return bool(self.cfg.robot_minutes) and self.robot_s / 60.0 >= self.cfg.robot_minutes

    def _fault(self, what: str, error: Exception) -> None:
        """Count a fault that cost an episode; ``error`` when it is one too many in a row."""
        self.fault_log.append(what)
        self.faults += 1
        if self.faults > self.cfg.max_faults:
            raise error

    def episode(self, k: int) -> dict[str, Any] | None:
        """Training episode ``k`` -> its metrics row, or None when nothing was recorded (a fault: recovered, to be
        tried again; or an operator stop before the first step, ``stopped``)."""
        cfg, env = self.cfg, self.env
        got = self.link.poll_weights(self.version)  # the newest weights, if the learner has published some
        if got is not None and got[1] is not None:
            self.policy.load_state_dict(got[1])
            self.version = got[0]
        self.seed = cfg.seed * 10_000 + k
        if isinstance(self.operator, ProtocolOperator):
            self.operator.episode = k - 1  # the stage is a function of the episode number, faults and resumes alike
        try:
            res, terminated = run_episode(env, self.policy, self.seed, deterministic=False)
        except RobotLinkError as exc:  # e.g. a reflex during the start motion: recover, count, try k again
            log.error("episode %d lost to a robot fault (%s); recovering", k, exc)
            self._fault(f"start: {exc}", exc)
            recover_arm(env, cfg.max_faults)
            return None
        steps = self.recorder.last_steps
        self.stopped = _operator_stopped(env)
        if not steps:  # nothing executed, nothing recorded
            if not self.stopped:
                self._fault(f"empty: {env.last_fault}",
                            RobotLinkError(f"{self.faults + 1} episodes in a row ended before their first step"))
            return None
        self.faults = 0
        self.robot_s += len(steps) / env.cfg.policy_hz
        self.link.add_episode(episode_arrays(steps, res.final_obs["state"][0], terminated))
        if not cfg.use_ray:
            self.link.call("update")
        row = episode_row(k, self.recorder.last_meta, np.array([s.reward for s in steps]), self.robot_s)
        if (k + 1) % max(1, cfg.checkpoint_every) == 0 or k + 1 == cfg.episodes or self.stopped:
            self.version, weights, learner_metrics = self.link.call("save", str(self.out / CHECKPOINT))
            self.policy.load_state_dict(weights)  # the checkpoint's own weights, exported for vlarl-deploy
            atomic_save(self.policy.save_pretrained, self.out / "policy")
            row.update(learner_metrics)
        if not self.stopped and cfg.eval_every and ((k + 1) % cfg.eval_every == 0 or k + 1 == cfg.episodes):
            row["eval/success"] = evaluate(env, self.policy, cfg, faults=self.fault_log)
            self.stopped = _operator_stopped(env)
        row["learner_restarts"] = self.link.restarts
        row["recovered_faults"], self.fault_log = self.fault_log, []
        return row


def run(cfg: HILConfig, env: Any, policy_dir: str | Path, output: str | Path,
        writer_factory: Callable[[Path], Any] | None = None,
        read_episode: Callable[[Path], dict[str, Any]] | None = read_episode,
        resume: bool = False, on_episode: Callable[[dict[str, Any]], None] | None = None,
        critic: Callable[..., Any] | None = None, operator: Any = None) -> list[dict[str, Any]]:
    """Train on ``env`` (a ``robots.franka_env.FrankaEnv`` built with ``auto_reset=False``: the loop resets it
    itself, with a seed per episode) from the policy at ``policy_dir``; returns this segment's metrics rows.

    Writes ``<output>/episodes/``, ``<output>/learner.pt``, ``<output>/policy/`` (latest weights, for
    ``vlarl-deploy``), ``<output>/processes.json`` and ``<output>/metrics.jsonl`` (one row per episode: success,
    return, intervention rate, takeovers, clamps, robot time, policy version, learner restarts; held-out
    evaluations as ``eval/success``). ``operator`` replaces the one ``hil.interventions`` describes (a device of
    your own). An operator stop ends the motion and the run (the episode is recorded, the learner checkpointed);
    ``resume=True`` goes on. Episodes are written by ``writer_factory(path)`` (default: a LeRobot v3 writer at the
    env's policy rate) and read back on resume by ``read_episode`` (default: ``vlarl.hil.episodes``')."""
    from policies.base import Policy

    if env.cfg.auto_reset:
        raise ValueError("the learning loop resets the env itself (a seed per episode): build it with "
                         "env.auto_reset=false")
    out, hz = Path(output), env.cfg.policy_hz
    history = restore_output(out, resume, read_episode, hz)
    first, robot_s = len(history), sum(len(ep["reward"]) for ep in history) / hz
    policy = Policy.from_pretrained(str(policy_dir))
    if (out / CHECKPOINT).is_file():  # the learner's last weights (policy/ is an export of the same)
        policy.load_state_dict(torch.load(out / CHECKPOINT, weights_only=False)["policy"])
    policy.eval()
    link = LearnerLink(cfg, policy_dir, out, read_episode, history)
    del history
    operator = operator if operator is not None else make_operator(cfg.interventions, first_episode=first)
    loop = TrainingEpisodes(cfg, env, policy, link, operator, out,
                            writer_factory or lerobot_writer(int(hz)), first, robot_s)
    rows: list[dict[str, Any]] = []
    with (open(out / "metrics.jsonl", "a") as metrics, contextlib.closing(link),
          env.hooks(operator=operator, reward_fn=make_reward_fn(cfg.reward, env, critic), recorder=loop.recorder)):
        k = first
        while k < cfg.episodes and not loop.out_of_robot_time():  # resumed runs count earlier segments' time
            row = loop.episode(k)
            if row is None:
                if loop.stopped:
                    break
                continue
            rows.append(row)
            _append_row(metrics, row)
            log.info("episode %d: %s", k, row)
            k += 1
            if on_episode is not None:
                on_episode(row)
            if loop.stopped:
                log.warning("operator stop: the arm is stopped and the run ends after episode %d; resume=true goes "
                            "on", row["episode"])
                break
    return rows


def recover_arm(env: Any, attempts: int) -> None:
    """``env.recover()`` (the driver waits for rest and a ready controller), tried up to ``attempts`` times."""
    for i in range(max(1, attempts)):
        try:
            env.recover()
            return
        except RobotLinkError as exc:
            if i + 1 >= max(1, attempts):
                raise
            log.error("recovery %d failed (%s); trying again", i + 1, exc)


def evaluate(env: Any, policy: Any, cfg: HILConfig, faults: list[str] | None = None) -> float:
    """Success rate on held-out starts (seeds from ``eval_seed``), operator off, deterministic actions, not recorded.
    An operator stop ends it (the rate is over the episodes that ran). A robot fault (in the start motion or
    mid-episode) is recovered and that start tried again, as in training; ``faults`` collects what was met; more
    than ``max_faults`` in a row raise."""
    wins: list[float] = []
    faults = [] if faults is None else faults
    with env.hooks(operator=None, recorder=None):
        i, in_a_row = 0, 0
        while i < cfg.eval_episodes:
            try:
                res, _ = run_episode(env, policy, cfg.eval_seed + i, deterministic=True)
            except RobotLinkError as exc:
                fault = f"eval start: {exc}"
            else:
                if _operator_stopped(env):
                    break
                fault = f"eval: {env.last_fault}" if env.last_fault else None
            if fault is None:
                wins.append(float(res.episode["success_once"][0]))
                i, in_a_row = i + 1, 0
                continue
            in_a_row += 1
            faults.append(fault)
            log.error("held-out episode %d lost to a robot fault (%s); recovering and running it again", i, fault)
            if in_a_row > cfg.max_faults:
                raise RobotLinkError(f"{in_a_row} faults in a row in a held-out evaluation; last: {fault}")
            recover_arm(env, cfg.max_faults)
    return float(np.mean(wins)) if wins else float("nan")
