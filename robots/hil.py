"""Learn on the arm: the robot-side actor steps the Franka at the policy rate, a learner updates elsewhere.

    actor (this process, B = 1)                             learner (a Ray actor, or in-process)
    env.reset(seed) -> policy.sample -> env.chunk_step  --episode-->  add_episode -> update thread (UTD ratio)
         ^ every command through the safety layer                          |
         |                                   <--(version, weights)---------+   pulled between episodes,
    operator (robots.interventions) may take over                               never waited for
    episode -> <output>/episodes/episode_<n>/  (one LeRobot v3 dataset per episode, moved into place whole)

A kill loses no recorded episode. Each episode is a dataset of its own, published whole and fsynced as it ends
(``robots.recorder.EpisodeFolderRecorder``); ``learner.pt`` (weights, optimizers, counters, RNG) and the
``policy/`` export are replaced atomically; ``metrics.jsonl`` is appended and fsynced per episode.
* Kill the actor (this process): the episode in flight is lost (its arm motion stops with the libfranka link),
  nothing else. ``resume=true`` publishes episodes a kill left staged, sweeps partial ones, reloads every recorded
  episode into the learner's buffers (those its checkpoint counted refill the buffers only), rebuilds the metrics
  rows a kill cut off from the episodes themselves, and goes on at the next episode number, seed and stage.
* Kill the learner (its Ray actor): the actor sees it at its next pull, starts a new learner from ``learner.pt``
  and the recorded episodes (``LearnerLink``), and the arm goes on; the updates since the last checkpoint are lost.

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
from robots.interventions import InterventionConfig, ProtocolOperator, make_operator
from robots.learner import LearnerConfig, LearnerFactory, learner_factory
from robots.reach_task import HELD_OUT_SEED
from robots.recorder import (
    EpisodeFolderRecorder,
    atomic_save,
    recorded_episodes,
    sweep_partial_episodes,
    sweep_temporaries,
)
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
    max_faults: int = 10  # robot faults in a row (each recovered) before the run stops; recovered ones never stop it
    use_ray: bool = True  # the learner as a Ray actor (updates overlap robot time); False = in-process, in turn
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    interventions: InterventionConfig = field(default_factory=InterventionConfig)
    reward: RewardSourceConfig = field(default_factory=RewardSourceConfig)


def episode_arrays(steps: list[StepRecord], final_state: np.ndarray, terminated: bool) -> dict[str, np.ndarray]:
    """The learner's view of one episode (see ``robots.learner.chunk_transitions``)."""
    return {"state": np.concatenate([s.obs["state"] for s in steps]).astype(np.float32),
            "action": np.stack([s.action for s in steps]).astype(np.float32),
            "reward": np.array([s.reward for s in steps], np.float32),
            "intervention": np.array([s.intervened for s in steps], bool),
            "final_state": np.asarray(final_state, np.float32).reshape(-1), "terminated": bool(terminated)}


CHECKPOINT = "learner.pt"
PROCESSES = "processes.json"  # the actor's and the learner's pids, for an operator (or a test) to watch


class LearnerHost:
    """Holds the learner; with ``background`` a thread runs the owed updates while the robot moves. ``factory``
    builds it (``robots.learner.learner_factory(cfg.name)``, resolved by the caller: a Ray learner's process has
    only what it was handed, not the registrations of the composition root)."""

    def __init__(self, policy_dir: str, cfg: LearnerConfig, checkpoint: str = "", background: bool = True,
                 factory: LearnerFactory | None = None):
        from policies.base import Policy

        torch.set_num_threads(1)
        factory = factory or learner_factory(cfg.name)
        self.learner = factory(Policy.from_pretrained(policy_dir), cfg)
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

    def pid(self) -> int:
        return os.getpid()

    def episodes_seen(self) -> int:
        """Episodes the loaded checkpoint has counted (resume replays those with ``seen=True``)."""
        return self.learner.episodes

    def add_episode(self, episode: dict[str, np.ndarray], seen: bool = False) -> int:
        with self._lock:
            return self.learner.add_episode(episode, seen=seen)

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
        """The learner's state (weights, optimizers, counters, RNG) as one file, replaced atomically and durably."""
        with self._lock:
            sd = self.learner.state_dict()
        atomic_save(lambda tmp: torch.save(sd, tmp), path)

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


def _actor_died(exc: BaseException) -> bool:
    try:
        from ray.exceptions import RayActorError
    except ImportError:
        return False
    return isinstance(exc, RayActorError)


class LearnerLink:
    """The robot-side actor's link to its learner. A learner that dies (its Ray actor killed, its machine lost) is
    started again from its last checkpoint and the recorded episodes, and the robot goes on: a dead learner costs
    the updates made since its last checkpoint, never an episode.

    ``history``: the recorded episodes (``read_episode`` of each); the first ``episodes_seen`` of them are already
    counted in the checkpoint and only refill the buffers."""

    def __init__(self, cfg: HILConfig, policy_dir: str | Path, out: Path,
                 read_episode: Callable[[Path], dict[str, Any]] | None, history: list[dict[str, Any]]):
        self.cfg, self.policy_dir, self.out, self.read_episode = cfg, str(policy_dir), out, read_episode
        self.restarts = 0
        self._pending: Any = None
        self._fresh = True  # the next weights pull takes whatever the (new) learner has
        self.handle = self._start(history)

    def _start(self, history: list[dict[str, Any]]) -> Any:
        ckpt = self.out / CHECKPOINT
        args = (self.policy_dir, self.cfg.learner, str(ckpt) if ckpt.is_file() else "")
        factory = learner_factory(self.cfg.learner.name)
        if self.cfg.use_ray:
            import ray

            if not ray.is_initialized():
                ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            handle = ray.remote(num_cpus=1, max_restarts=0)(LearnerHost).remote(*args, background=True, factory=factory)
        else:
            handle = _Local(LearnerHost(*args, background=False, factory=factory))
        seen = int(_get(handle.episodes_seen.remote()))
        for i, ep in enumerate(history):
            handle.add_episode.remote(ep, i < seen)
        self.learner_pid = int(_get(handle.pid.remote()))
        info = {"actor_pid": os.getpid(), "learner_pid": self.learner_pid, "learner_restarts": self.restarts}
        atomic_save(lambda tmp: tmp.write_text(json.dumps(info)), self.out / PROCESSES)
        log.info("learner up (pid %d, %d recorded episodes, %d counted in its checkpoint)", self.learner_pid,
                 len(history), seen)
        return handle

    def _restart(self, exc: BaseException) -> None:
        log.error("the learner died (%s); starting it again from %s and the recorded episodes",
                  str(exc).splitlines()[0] if str(exc) else type(exc).__name__, CHECKPOINT)
        try:
            import ray

            ray.kill(self.handle, no_restart=True)
        except Exception:  # already gone
            pass
        history = [self.read_episode(p) for p in recorded_episodes(self.out / "episodes")] if self.read_episode else []
        self.restarts += 1
        self.handle, self._pending, self._fresh = self._start(history), None, True

    def call(self, name: str, *args: Any) -> Any:
        """Call the learner and wait for the answer (restarting it once if it has died)."""
        try:
            return _get(getattr(self.handle, name).remote(*args))
        except Exception as exc:
            if not _actor_died(exc):
                raise
            self._restart(exc)
            return _get(getattr(self.handle, name).remote(*args))

    def add_episode(self, episode: dict[str, np.ndarray]) -> None:
        """Hand over a finished (already recorded) episode; not waited for."""
        self.handle.add_episode.remote(episode)

    def poll_weights(self, version: int) -> tuple[int, dict[str, torch.Tensor] | None, dict[str, float]] | None:
        """The learner's newest weights if a pull has come back (never waits); None while it is in flight."""
        if self._pending is None:
            self._pending = self.handle.weights.remote(-1 if self._fresh else version)
            self._fresh = False
        if not _ready(self._pending):
            return None
        try:
            got = _get(self._pending)
        except Exception as exc:
            if not _actor_died(exc):
                raise
            self._restart(exc)
            return None
        self._pending = None
        return got

    def close(self) -> None:
        try:
            _get(self.handle.close.remote())
        except Exception as exc:
            if not _actor_died(exc):
                raise


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
    return getattr(env, "last_fault", None) == "operator stop"


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


def run(cfg: HILConfig, env: Any, policy_dir: str | Path, output: str | Path,
        writer_factory: Callable[[Path], Any], read_episode: Callable[[Path], dict[str, Any]] | None = None,
        resume: bool = False, on_episode: Callable[[dict[str, Any]], None] | None = None,
        critic: Callable[..., Any] | None = None, operator: Any = None) -> list[dict[str, Any]]:
    """Train on ``env`` (a Franka env, ``auto_reset`` off) from the policy at ``policy_dir``; returns this
    segment's metrics rows.

    Writes ``<output>/episodes/``, ``<output>/learner.pt``, ``<output>/policy/`` (latest weights, for
    ``vlarl-deploy``), ``<output>/processes.json`` and ``<output>/metrics.jsonl`` (one row per episode: success,
    return, intervention rate, takeovers, clamps, robot time, policy version, learner restarts; held-out
    evaluations as ``eval/success``). ``operator`` replaces the one ``hil.interventions`` describes (a device of
    your own). An operator stop ends the motion and the run (the episode is recorded, the learner checkpointed);
    ``resume=True`` goes on."""
    from policies.base import Policy

    out = Path(output)
    check_output(out, resume)
    out.mkdir(parents=True, exist_ok=True)
    ep_root, ckpt = out / "episodes", out / CHECKPOINT
    if resume:
        sweep_temporaries(out)
        published, swept = sweep_partial_episodes(ep_root)
        if published or swept:
            log.warning("resume: %d staged episode(s) published, %d partial one(s) removed", published, swept)
    done_eps = recorded_episodes(ep_root)
    if done_eps and read_episode is None:
        raise ValueError("resume needs read_episode to reload the recorded episodes into the replay buffers")
    history = [read_episode(p) for p in done_eps] if done_eps else []
    first = len(done_eps)
    robot_s = sum(len(ep["reward"]) for ep in history) / env.cfg.policy_hz
    metrics_path = out / "metrics.jsonl"
    logged = {r["episode"] for r in _logged_rows(metrics_path) if "episode" in r}
    with open(metrics_path, "a") as f:  # rows a killed process did not write, from the episodes themselves
        acc = 0.0
        for i, ep in enumerate(history):
            acc += len(ep["reward"]) / env.cfg.policy_hz
            if i not in logged:
                _append_row(f, {**episode_row(i, ep.get("meta", {}), ep["reward"], acc), "rebuilt": True})

    policy = Policy.from_pretrained(str(policy_dir))
    if ckpt.is_file():  # the learner's last weights (policy/ is an export of the same, for deployment)
        policy.load_state_dict(torch.load(ckpt, weights_only=False)["policy"])
    policy.eval()
    link = LearnerLink(cfg, policy_dir, out, read_episode, history)
    del history
    if operator is None:
        operator = make_operator(cfg.interventions, first_episode=first)
    reward_fn = make_reward_fn(cfg.reward, env, critic)
    version, seed = -1, 0

    def episode_meta() -> dict[str, Any]:  # stored with each recorded episode (read when its row is rebuilt)
        return {"stage": getattr(operator, "stage", "none"), "policy_version": version, "seed": seed,
                "clamps": len(env.safety.clamps), "goal_reached": float(getattr(env, "goal_reached", np.nan))}

    recorder = EpisodeFolderRecorder(ep_root, writer_factory, first_index=first, instruction=env.cfg.instruction,
                                     final_state=lambda: env._obs["state"][0], episode_meta=episode_meta)
    env.operator, env.reward_fn, env.recorder = operator, reward_fn, recorder
    env.cfg.auto_reset = False
    rows: list[dict[str, Any]] = []
    faults, k = 0, first
    fault_log: list[str] = []  # faults since the last row: start motions and evaluations (recovered)
    metrics_file = open(metrics_path, "a")  # noqa: SIM115 - closed in finally
    try:
        while k < cfg.episodes:
            if cfg.robot_minutes and robot_s / 60.0 >= cfg.robot_minutes:  # resumed runs count earlier segments
                break
            got = link.poll_weights(version)  # the newest weights, if the learner has published some; never waits
            if got is not None and got[1] is not None:
                policy.load_state_dict(got[1])
                version = got[0]
            seed = cfg.seed * 10_000 + k
            if isinstance(operator, ProtocolOperator):
                operator.episode = k - 1  # the stage is a function of the episode number, faults and resumes alike
            try:
                res, terminated = run_episode(env, policy, seed, deterministic=False)
            except RobotLinkError as exc:  # e.g. a reflex during the start motion: recover, count, try k again
                log.error("episode %d lost to a robot fault (%s); recovering", k, exc)
                fault_log.append(f"start: {exc}")
                faults += 1
                if faults > cfg.max_faults:
                    raise
                recover_arm(env, cfg.max_faults)
                continue
            steps = recorder.last_steps
            stopped = _operator_stopped(env)
            if not steps:  # nothing executed, nothing recorded
                if stopped:
                    break
                faults += 1
                fault_log.append(f"empty: {getattr(env, 'last_fault', None)}")
                if faults > cfg.max_faults:
                    raise RobotLinkError(f"{faults} episodes in a row ended before their first step")
                continue
            faults = 0  # max_faults counts faults in a row: a recovered fault never ends the run
            robot_s += len(steps) / env.cfg.policy_hz
            link.add_episode(episode_arrays(steps, res.final_obs["state"][0], terminated))
            if not cfg.use_ray:
                link.call("update")
            row = episode_row(k, recorder.last_meta, np.array([s.reward for s in steps]), robot_s)
            if (k + 1) % max(1, cfg.checkpoint_every) == 0 or k + 1 == cfg.episodes or stopped:
                link.call("save", str(ckpt))
                v, w, lm = link.call("weights", -1)
                if w is not None:
                    policy.load_state_dict(w)
                    version = v
                    atomic_save(policy.save_pretrained, out / "policy")
                row.update(lm)
            if not stopped and cfg.eval_every and ((k + 1) % cfg.eval_every == 0 or k + 1 == cfg.episodes):
                row["eval/success"] = evaluate(env, policy, cfg, faults=fault_log)
                stopped = _operator_stopped(env)
            row["learner_restarts"] = link.restarts
            row["recovered_faults"], fault_log = fault_log, []
            rows.append(row)
            _append_row(metrics_file, row)
            log.info("episode %d: %s", k, row)
            k += 1
            if on_episode is not None:
                on_episode(row)
            if stopped:
                log.warning("operator stop: the arm is stopped and the run ends after episode %d; resume=true goes on",
                            row["episode"])
                break
    finally:
        metrics_file.close()
        env.operator, env.recorder = None, None
        link.close()
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
    saved = env.operator, env.recorder
    env.operator, env.recorder = None, None
    wins: list[float] = []
    faults = [] if faults is None else faults
    try:
        i, in_a_row = 0, 0
        while i < cfg.eval_episodes:
            try:
                res, _ = run_episode(env, policy, cfg.eval_seed + i, deterministic=True)
            except RobotLinkError as exc:
                fault = f"eval start: {exc}"
            else:
                if _operator_stopped(env):
                    break
                fault = getattr(env, "last_fault", None)
                fault = f"eval: {fault}" if fault else None
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
    finally:
        env.operator, env.recorder = saved
    return float(np.mean(wins)) if wins else float("nan")
