"""The training loop as a dataflow: the driver moves object references, episode statistics and timings.

    env workers --obs--> rollout worker --actions--> env workers      (num_steps chunk steps, staged)
                           | builds the trajectory from what it saw (vlarl.data.builder)
                           +--- trajectory ref ---> reward worker (optional) --- ref ---+
                           +--- trajectory ref -------------------------------------------> actor worker
                                  rollout worker <-- weights ---------------------------------/

Each iteration: collect (the algorithm's spec says how), score (process reward), train, sync weights,
log, maybe checkpoint; ``Runner.train`` is that list of phase calls under timers. At the end: a final
checkpoint and an evaluation on held-out seeds (JSON + MP4).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ray
import torch

from policies.base import PolicySpec
from simulators.base import EnvSpec, training_seed
from vlarl import scheduler
from vlarl.algorithms.registry import algorithm_spec
from vlarl.algorithms.spec import SEED_STRIDE
from vlarl.checkpoint import latest_checkpoint, save_checkpoint
from vlarl.data.metrics import EpisodeStats
from vlarl.logging import LIBRARY_LOG, LIBRARY_LOG_ENV, MetricLogger, RunProgress, route_library_logs
from vlarl.rewards import reward_camera, validate_reward_config
from vlarl.scheduler.pipeline import EnvObs, StagedRollout
from vlarl.scheduler.transport import TrajectoryRef, payload
from vlarl.workers import ActorWorker, EnvWorker, RolloutWorker
from vlarl.workers.crash import describe_dead_env_worker, describe_dead_worker
from vlarl.workers.supervisor import WorkerSupervisor, dead_worker


def policy_spec_from_env(spec: EnvSpec) -> PolicySpec:
    """The env's spec as the policy's. ``simulators`` and ``policies`` may not import each other, so each
    declares its own spec class, with the same fields (``tests/simulators/test_contract.py`` keeps them
    equal); here they are copied by name into plain JSON types (a checkpoint stores the policy's spec)."""
    values = {f.name: getattr(spec, f.name) for f in dataclasses.fields(PolicySpec)}
    values.update(action_low=[float(x) for x in spec.action_low], action_high=[float(x) for x in spec.action_high])
    return PolicySpec(**{k: list(v) if isinstance(v, tuple) else v for k, v in values.items()})


class Runner:
    def __init__(self, cfg: Any, run_dir: str | Path):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.iteration = 0
        self.algorithm_state: dict[str, Any] = {}  # an algorithm's collect keeps its own state here
        self.env_steps = 0
        self.wall_offset = 0.0  # wall seconds spent by earlier (resumed) segments of this run
        self.eval_wall = 0.0  # wall seconds of periodic evaluations in this process (inside perf/wall_s)
        self.stats = EpisodeStats(window=max(32, cfg.env.num_envs * 2))
        self._traced_iterations = 0
        self.rollout_version = 0  # version of the weights the rollout worker holds (actor updates so far)
        self.reward_worker, self.reward_cam = None, ""  # set in setup() when reward.enabled

    # -- set-up ---------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        self.device = device = self._device()
        # placement as data: devices and Ray resources of every worker (vlarl.scheduler.placement)
        self.plan = scheduler.resolve_for_training(cfg, device)
        print(f"[vlarl] {self.plan.describe()}")
        scheduler.start_ray(cfg.placement)
        self._build_rollout_side(device)
        if self.plan.auto_stages or self.plan.auto_split:  # =auto: a short profiling pass picks S / k (printed)
            from vlarl.scheduler import autotune

            group = scheduler.group_size_of(cfg.algorithm)
            plan = autotune.apply(self.plan, self.env_workers, self.rollout, self._reset_envs(), cfg.env.num_envs,
                                  cfg.seed + 1, group=group,
                                  resplit=lambda k: scheduler.resolve_for_training(cfg, device, env_devices=k))
            rebuild = not autotune.same_devices(plan, self.plan)  # another env/rollout split
            self.plan = plan
            if rebuild:  # env and rollout workers from the new plan
                for w in [*self.env_workers, self.rollout]:
                    ray.kill(w)
                print(f"[vlarl] {plan.describe()}")
                self._build_rollout_side(device)
        self.actor = self.new_actor()
        self.policy_chunk = int(ray.get(self.actor.chunk_size.remote()))  # resolved by the policy itself
        if cfg.placement.weight_sync == "collective":  # weights by torch.distributed broadcast, actor = rank 0
            addr, keys = ray.get([self.actor.weight_group_address.remote(), self.actor.weight_keys.remote()])
            ray.get([self.actor.join_weight_group.remote(addr, 2), self.rollout.join_weight_group.remote(addr, 1, 2, keys)])
        if cfg.init_from:  # the actor starts from saved policy weights (e.g. SFT); resume= still wins in train()
            ray.get(self.rollout.set_weights.remote(self.actor.get_weights.remote()))
            print(f"[vlarl] policy initialized from {cfg.init_from}")
            if note := init_from_note(cfg.policy, cfg.init_from):
                print(note)
        # optional dense process reward from a VLM critic (vlarl.rewards, vlarl.workers.reward_worker)
        if cfg.reward.enabled:
            from vlarl.workers.reward_worker import RewardWorker  # loads the critic's model code

            validate_reward_config(cfg.reward)
            # the policy's cameras, or a camera the env renders for the critic only (its spec says which)
            self.reward_cam = reward_camera(cfg.reward, [*self.env_spec.image_keys, *self.env_spec.critic_cameras])
            ray.get(self.rollout.set_reward_camera.remote(self.reward_cam))  # its end-of-chunk frames, kept
            # on placement.reward's devices (default: the rollout's), with its share of them in Ray
            self.reward_worker = scheduler.remote_on(RewardWorker, self.plan.reward).remote(
                cfg.reward, cfg.torch_threads, placement=self.plan.reward)

    def _build_rollout_side(self, device: str) -> None:
        """Env workers and the rollout worker of ``self.plan`` (the actor is built once the plan is final)."""
        self.device = device
        cfg = self.cfg
        self.per_worker = cfg.env.num_envs // len(self.plan.env)
        self.env_workers = [
            scheduler.remote_on(EnvWorker, w).remote(cfg.env, self.per_worker, i, cfg.torch_threads, self.plan.stages, w)
            for i, w in enumerate(self.plan.env)
        ]
        self.env_spec: EnvSpec = ray.get(self.env_workers[0].spec.remote())
        self.policy_spec = policy_spec_from_env(self.env_spec)
        self.rollout = self.new_rollout()

    def new_rollout(self) -> Any:
        """A rollout worker on the plan's rollout devices (set-up, and the supervisor after one died); it holds
        freshly built weights until the actor's are synced."""
        cfg = self.cfg
        rollout = scheduler.remote_on(RolloutWorker, self.plan.rollout).remote(
            cfg.policy, self.policy_spec, cfg.seed + 1, self.device, cfg.torch_threads, self.plan.rollout)
        if algorithm_spec(cfg.algorithm.name).replays_stale_data:  # a replay's pixel critic reads next images
            ray.get(rollout.record_next_images.remote(True))
        if self.reward_cam:  # a process reward's camera (set once the reward worker exists)
            ray.get(rollout.set_reward_camera.remote(self.reward_cam))
        return rollout

    def new_actor(self) -> Any:
        """An actor worker on the plan's actor devices with the run's starting weights: seeded, or ``init_from``'s
        (set-up, and the supervisor after one died, before it loads the latest checkpoint)."""
        cfg = self.cfg
        actor = scheduler.remote_on(ActorWorker, self.plan.actor).remote(
            cfg.policy, cfg.algorithm, self.policy_spec, cfg.seed, self.device, cfg.torch_threads, self.plan.actor)
        if cfg.init_from:
            from vlarl.init_from import load_init_weights

            state = load_init_weights(cfg.init_from, cfg.policy, self.policy_spec, cfg.env)
            ray.get(actor.load_initial_weights.remote(state))
        return actor

    def _submit_train(self, traj: TrajectoryRef) -> Any:
        """One actor update on ``traj`` (by reference); returns the reference to its metrics."""
        return self.actor.train.remote(payload(traj))

    def _sync_weights(self) -> int:
        """Actor -> rollout weight sync (placement.weight_sync); returns the policy version the rollout holds."""
        if self.cfg.placement.weight_sync == "collective":
            return ray.get([self.rollout.receive_weights.remote(), self.actor.broadcast_weights.remote()])[0]
        return ray.get(self.rollout.set_weights.remote(self.actor.sync_weights.remote()))

    def _phase_metrics(self, wall_s: float) -> dict[str, float]:
        """Per-phase seconds of the last iteration from the workers' spans (env and infer summed over
        workers), the fraction of device time left idle, and a Chrome trace of one iteration."""
        from vlarl.scheduler import timeline

        spans = ray.get([w.pop_spans.remote() for w in [*self.env_workers, self.rollout, self.actor]])
        totals = timeline.phase_totals(spans)
        cfg = self.cfg.placement
        if cfg.timeline and self._traced_iterations == cfg.timeline_iteration - 1:
            timeline.write_trace(self.run_dir / "timeline.json", spans)
        self._traced_iterations += 1
        busy = sum(totals.values())
        return {**{f"perf/phase_{k}_s": v for k, v in totals.items()},
                "perf/idle_frac": max(0.0, 1.0 - busy / max(wall_s * self.plan.num_devices, 1e-9))}

    def _device(self) -> str:
        if self.cfg.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.cfg.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device=cuda but no CUDA device is visible; use device=cpu")
        return self.cfg.device

    def resume(self, checkpoint: Path) -> None:
        state = ray.get(self.actor.load.remote(str(checkpoint)))
        ray.get(self.actor.load_reference.remote(str(checkpoint)))  # KL reference, if saved
        self.iteration = int(state["iteration"])
        self.env_steps = int(state["env_steps"])
        self.wall_offset = float(state.get("wall_s", 0.0))

    def _reset_envs(self) -> EnvObs:
        """Training seeds: integers derived from ``seed`` and the iteration, never held-out ones (``training_seed``)."""
        base = self.cfg.seed * SEED_STRIDE + self.iteration * self.cfg.env.num_envs
        if self.reward_worker is not None:
            ray.get(self.reward_worker.reset_state.remote())  # episodes start afresh: forget start frames
        self.reset_seeds = [[training_seed(base + i * self.per_worker + j) for j in range(self.per_worker)]
                            for i in range(len(self.env_workers))]
        return EnvObs([[w.reset.remote(seeds) for w, seeds in zip(self.env_workers, self.reset_seeds, strict=True)]])

    def reset_envs(self, reset_state_ids: list[int] | None) -> EnvObs:
        """Reset every env to ``reset_state_ids`` (one per env; group rollouts) -> where the observations are."""
        k = self.per_worker
        return EnvObs([[w.reset.remote(None, reset_state_ids[i * k:(i + 1) * k] if reset_state_ids else None)
                        for i, w in enumerate(self.env_workers)]])

    # -- one rollout ----------------------------------------------------------------------------
    def collect(self, obs: EnvObs, num_steps: int = 0,
                until_all_ended: bool = False) -> tuple[TrajectoryRef, EnvObs, int]:
        """Step every env ``num_steps`` (default ``algorithm.num_steps``) chunks; returns (trajectory, next obs,
        env steps). The rollout worker builds the trajectory; the driver reads each step's summaries only.
        ``until_all_ended``: stop early once every env has ended an episode (GRPO scores one episode each)."""
        N = num_steps or self.cfg.algorithm.num_steps
        pipe = StagedRollout(self.env_workers, self.rollout, self.plan.stages, self.plan.overlap)
        steps, ended, done = 0, torch.zeros(0, dtype=torch.bool), 0
        for rec in pipe.run(obs, N):
            done += 1
            steps += rec.env_steps
            for episode in rec.episodes():
                self.stats.add(episode)
            obs = rec.next_obs()
            ended = rec.ended | ended if ended.numel() else rec.ended
            if until_all_ended and bool(ended.all()):
                break  # the pipeline already submitted one more step; the rollout worker drops it
        return pipe.finish(done), obs, steps

    def transform(self, fn: Any, trajs: list[TrajectoryRef], **kwargs: Any) -> tuple[TrajectoryRef, dict[str, Any]]:
        """``fn(trajectories, **kwargs) -> (trajectory, info)`` run on the rollout worker, where the trajectories
        are; the driver gets a reference to the result and ``info`` (an algorithm's batch selection)."""
        ref, meta_ref = self.rollout.transform_trajectories.options(num_returns=2).remote(
            fn, *[payload(t) for t in trajs], **kwargs)
        meta = ray.get(meta_ref)
        return TrajectoryRef(ref, meta["trajectory"]), meta["info"]

    # -- the phases of one iteration ------------------------------------------------------------
    def _score(self, supervisor: WorkerSupervisor, collect: Any, batch: tuple[Any, EnvObs, int]
               ) -> tuple[tuple[Any, EnvObs, int], dict[str, float]]:
        """Process reward on the reward worker (the trajectory goes there and back by reference)."""
        if self.reward_worker is None:
            return batch, {}
        spec = algorithm_spec(self.cfg.algorithm.name)
        gamma = spec.discount(self.cfg.algorithm)
        traj, obs, steps, metrics = supervisor.rewarded(  # restarts a dead critic
            self, collect, batch, lambda t: score_trajectory(t, self.reward_worker, gamma, spec.fresh_episodes))
        return (traj, obs, steps), metrics

    def _stop_reason(self, t_start: float) -> str | None:
        if self.env_steps >= self.cfg.total_env_steps:
            return "total_env_steps"
        limit = self.cfg.time_limit_minutes * 60
        if limit > 0 and self.wall_offset + time.time() - t_start > limit:
            return "time_limit_minutes"
        return None

    def _anneal_lr(self) -> None:
        if self.cfg.algorithm.anneal_lr:
            self.actor.set_lr.remote(self.cfg.algorithm.lr * (1.0 - self.env_steps / self.cfg.total_env_steps))

    # -- the loop -------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        logger = MetricLogger(self.run_dir, cfg.logger, config_dict=_as_dict(cfg))
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is not None:
            self.resume(ckpt)
            print(f"[vlarl] resumed from {ckpt} at iteration {self.iteration}, {self.env_steps} env steps")
        ray.get(self.rollout.set_weights.remote(self.actor.get_weights.remote()))
        self.rollout_version = self._sync_weights()
        prefetched = None  # asynchronous mode: the rollout collected while the actor trained
        obs = self._reset_envs()
        supervisor = WorkerSupervisor(cfg.faults.max_worker_deaths, cfg.faults.death_window_iterations)
        t_start = time.time()
        bar = RunProgress(cfg.total_env_steps, cfg.time_limit_minutes * 60, self.env_steps, self.wall_offset,
                          desc=cfg.experiment_name, disable=not cfg.logger.progress_bar)  # ETA: the binding budget
        collect = functools.partial(algorithm_spec(cfg.algorithm.name).collect, self)  # the algorithm's own way
        try:
            # a batch prefetched before a time-limit stop is still trained on: its env steps were spent
            while (stop_reason := self._stop_reason(t_start)) is None or prefetched:
                self._anneal_lr()
                t0 = time.time()
                batch = prefetched or supervisor.collect(self, collect, obs)  # restarts dead envs
                batch, reward_metrics = self._score(supervisor, collect, batch)
                traj, obs, steps = batch
                t1 = time.time()
                train = functools.partial(self._submit_train, traj)  # again on a restored actor if it died
                train_ref, prefetched = train(), None
                if cfg.placement.async_rollout and stop_reason is None and self.env_steps + steps < cfg.total_env_steps:
                    # the next rollout runs on the current weights while the actor trains: one version stale
                    # (each step is stamped with the version that sampled it: train/policy_lag)
                    prefetched = supervisor.collect(self, collect, obs)
                    obs = prefetched[1]
                train_metrics = supervisor.trained(self, train, train_ref)  # restores a dead actor
                self.rollout_version = supervisor.synced(self)  # restarts a dead rollout worker or actor
                t2 = time.time()
                self.iteration += 1
                self.env_steps += steps
                bar.update(steps)
                self._log(logger, bar, {
                    **{f"train/{k}": v for k, v in train_metrics.items()},
                    **reward_metrics,  # already "reward/..." keys
                    "rollout/chunk_reward": traj.chunk_reward,
                    "perf/env_steps_per_s": steps / max(t2 - t0, 1e-9),
                    "perf/collect_s": t1 - t0,
                    "perf/train_s": t2 - t1,
                    **self._phase_metrics(t2 - t0),
                    **supervisor.metrics(),  # faults/*
                    "perf/wall_s": self.wall_offset + time.time() - t_start,
                })
                if self.iteration % cfg.checkpoint_every == 0:
                    self.save(time.time() - t_start)
        finally:
            bar.close()
        self.save(time.time() - t_start)
        final = self._evaluate(self.run_dir / "eval", videos=cfg.eval.video_episodes)
        final.update(stop_reason=stop_reason, iterations=self.iteration, env_steps=self.env_steps,
                     train_wall_s=self.wall_offset + time.time() - t_start)
        (self.run_dir / "eval" / "eval.json").write_text(json.dumps(
            {**json.loads((self.run_dir / "eval" / "eval.json").read_text()), **final}, indent=2))
        logger.log(self.env_steps, {f"final_eval/{k}": v for k, v in final.items() if isinstance(v, (int, float))}
                   | per_task_metrics(final, "final_eval"))
        logger.close()
        return final

    def _log(self, logger: MetricLogger, bar: RunProgress, metrics: dict[str, float]) -> None:
        """One iteration's metrics (+ rollout episode statistics, + a periodic evaluation) to the logger."""
        cfg, summ = self.cfg, self.stats.summary()
        # perf/eval_wall_s: seconds of periodic evaluations so far in this process, inside perf/wall_s, so the
        # training time alone is their difference (scripts/bench_sample_efficiency.py)
        metrics = {**metrics, **{f"rollout/{k}": v for k, v in summ.items()},
                   "iteration": self.iteration, "env_steps": self.env_steps, "perf/eval_wall_s": self.eval_wall}
        if cfg.eval.every_iterations > 0 and self.iteration % cfg.eval.every_iterations == 0:
            t0 = time.time()
            metrics.update(self._periodic_evaluation())
            self.eval_wall += time.time() - t0
        logger.log(self.env_steps, metrics)
        bar.set_postfix(sps=f"{metrics['perf/env_steps_per_s']:.0f}", success=f"{summ['success_once']:.2f}",
                        ret=f"{summ['return']:.1f}", it=self.iteration)

    def save(self, segment_wall_s: float) -> Path:
        extra = {"iteration": self.iteration, "env_steps": self.env_steps,
                 "wall_s": self.wall_offset + segment_wall_s}
        return save_checkpoint(
            self.run_dir, self.iteration,
            lambda d: ray.get([self.actor.save.remote(str(d), extra),
                               self.actor.save_reference.remote(str(d))]),  # reference: KL on
            env_cfg=self.cfg.env, keep=self.cfg.keep_checkpoints,
        )

    def _periodic_evaluation(self, attempts: int = 2) -> dict[str, float]:
        """The periodic held-out evaluation's ``eval/*`` metrics. Its simulator is built anew each time; a build
        that fails (e.g. the physics device briefly unavailable while other simulators start) is tried again, and
        if every attempt fails the run goes on without this point (``eval/failed`` = 1) rather than ending."""
        from simulators.base import EnvError

        for attempt in range(1, attempts + 1):
            try:
                ev = self._evaluate(None, videos=0, episodes=self.cfg.eval.periodic_episodes)
                return {f"eval/{k}": v for k, v in ev.items() if isinstance(v, (int, float))} | per_task_metrics(ev, "eval")
            except EnvError as e:
                print(f"[vlarl] periodic evaluation at iteration {self.iteration}, attempt {attempt}/{attempts}: "
                      f"{e}", flush=True)
        return {"eval/failed": 1.0}

    def _evaluate(self, out_dir: Path | None, videos: int, episodes: int = 0) -> dict[str, Any]:
        """Held-out evaluation in this process with the latest weights."""
        from policies.registry import make_policy
        from vlarl.evaluation import evaluate

        policy = make_policy(self.cfg.policy, self.policy_spec)
        policy.load_state_dict(ray.get(self.actor.get_weights.remote()))
        policy.eval()
        ev = self.cfg.eval
        n = ev.num_envs or self.per_worker
        return evaluate(policy, self.cfg.env, episodes or ev.episodes, ev.seed, n, out_dir, videos, ev.deterministic,
                        progress=self.cfg.logger.progress_bar, extra={"iteration": self.iteration})

    def close(self) -> None:
        for w in getattr(self, "env_workers", []):
            try:
                ray.get(w.close.remote())
            except Exception:
                pass
        scheduler.stop_ray()


def init_from_note(policy_cfg: Any, init_from: str) -> str | None:
    """A note for a run started from saved weights whose state statistics RL would keep re-estimating: the saved
    policy learned under its SFT statistics, and rollouts that wander more than the demonstrations widen them (the
    OFT of issue 36: some state sds 2-6x wider within 3k env steps)."""
    if not init_from or getattr(policy_cfg, "freeze_state_norm", True):  # a family without the key keeps none
        return None
    return (f"[vlarl] note: init_from={init_from} with policy.freeze_state_norm=false: rollouts keep folding into "
            f"the state statistics the saved policy was trained with, which changes what it sees; set "
            f"policy.freeze_state_norm=true to keep them")


def per_task_metrics(summary: dict[str, Any], prefix: str) -> dict[str, float]:
    """``<prefix>/success_once/<task>`` (and ``success_at_end``) of an evaluation over several tasks (its ``tasks``
    dict, e.g. a multi-task env's); {} for one task, whose numbers are the summary's own."""
    tasks = summary.get("tasks") or {}
    if len(tasks) < 2:
        return {}
    return {f"{prefix}/{k}/{t}": float(r[k]) for t, r in tasks.items() for k in ("success_once", "success_at_end")}


def _as_dict(cfg: Any) -> dict[str, Any]:
    try:
        return json.loads(json.dumps(asdict(cfg), default=str))
    except Exception:
        return {}


def score_trajectory(traj: Any, worker: Any, gamma: float, fresh_episodes: bool) -> tuple[TrajectoryRef, dict[str, float]]:
    """The process reward, computed on the reward worker: ``traj`` goes there by reference, the scored
    trajectory stays there (a new reference), the driver reads the reward metrics only."""
    ref, info_ref = worker.score_trajectory.options(num_returns=2).remote(payload(traj), gamma, fresh_episodes)
    info = ray.get(info_ref)
    return TrajectoryRef(ref, info), info["metrics"]


def run_training(cfg: Any, run_dir: str | Path) -> dict[str, Any]:
    # library warnings that repeat per env go to <run_dir>/library.log, here and in the Ray workers started below
    # (they inherit the variable); the terminal keeps the progress bar, the evaluation and the paths
    previous = os.environ.get(LIBRARY_LOG_ENV)
    os.environ[LIBRARY_LOG_ENV] = str(route_library_logs(Path(run_dir) / LIBRARY_LOG))
    runner = Runner(cfg, run_dir)
    try:
        runner.setup()
        return runner.train()
    except ray.exceptions.RayActorError as e:  # a simulator process died: say which one, with its seeds
        named = describe_dead_env_worker(e, getattr(runner, "env_workers", []), str(cfg.env.task),
                                         getattr(runner, "reset_seeds", []), runner.iteration, str(runner.run_dir))
        if named is None:  # another of the run's workers, outside the phases the supervisor restarts
            named = describe_dead_worker(e, dead_worker(e, runner), runner.iteration, str(runner.run_dir))
        raise named from e
    finally:
        runner.close()
        if previous is None:
            os.environ.pop(LIBRARY_LOG_ENV, None)
        else:
            os.environ[LIBRARY_LOG_ENV] = previous
        route_library_logs(previous)  # this process's later envs: the caller's file, or once per message


__all__ = ["Runner", "policy_spec_from_env", "run_training"]
