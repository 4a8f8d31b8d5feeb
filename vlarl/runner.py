"""The training loop as a dataflow.

    env workers --obs--> rollout worker --actions--> env workers      (num_steps chunk steps)
         \\______________ trajectory ______________> actor worker       (GAE + PPO)
                                  rollout worker <-- weights ---/

Each iteration: collect a trajectory, train on it, sync weights, log, maybe checkpoint. At the end:
a final checkpoint and an evaluation on held-out seeds (JSON + MP4).
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ray
import torch

from policies.base import PolicySpec
from simulators.base import EnvSpec
from vlarl import scheduler
from vlarl.algorithms.extras import StepExtras
from vlarl.algorithms.registry import algorithm_spec
from vlarl.algorithms.spec import SEED_STRIDE
from vlarl.checkpoint import latest_checkpoint, load_reference, save_checkpoint, save_reference
from vlarl.data.metrics import EpisodeStats
from vlarl.data.trajectory import Trajectory, stack_cat_obs
from vlarl.logging import MetricLogger, RunProgress
from vlarl.rewards import (
    apply_process_reward,
    end_of_chunk_frames,
    next_frames_key,
    reward_camera,
    validate_reward_config,
)
from vlarl.scheduler.transport import from_wire, to_wire
from vlarl.workers import ActorWorker, EnvWorker, RolloutWorker
from vlarl.workers.crash import describe_dead_env_worker
from vlarl.workers.supervisor import WorkerSupervisor


def policy_spec_from_env(spec: EnvSpec) -> PolicySpec:
    return PolicySpec(
        state_dim=spec.state_dim,
        action_dim=spec.action_dim,
        action_low=[float(x) for x in spec.action_low],
        action_high=[float(x) for x in spec.action_high],
        image_keys=list(spec.image_keys),
        image_size=list(spec.image_size) if spec.image_size else None,
        max_episode_steps=spec.max_episode_steps,
        task=spec.task,
        instruction=spec.instruction,
    )


class Runner:
    def __init__(self, cfg: Any, run_dir: str | Path):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.iteration = 0
        self.algorithm_state: dict[str, Any] = {}  # an algorithm's collect keeps its own state here
        self.env_steps = 0
        self.wall_offset = 0.0  # wall seconds spent by earlier (resumed) segments of this run
        self.stats = EpisodeStats(window=max(32, cfg.env.num_envs * 2))
        self._traced_iterations = 0
        self.rollout_version = 0  # version of the weights the rollout worker holds (actor updates so far)
        self.reward_worker, self.reward_cam = None, ""  # set in setup() when reward.enabled

    # -- set-up ---------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        device = self._device()
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
        self.actor = scheduler.remote_on(ActorWorker, self.plan.actor).remote(
            cfg.policy, cfg.algorithm, self.policy_spec, cfg.seed, device, cfg.torch_threads, self.plan.actor)
        if cfg.placement.weight_sync == "collective":  # weights by torch.distributed broadcast, actor = rank 0
            addr, keys = ray.get([self.actor.weight_group_address.remote(), self.actor.weight_keys.remote()])
            ray.get([self.actor.join_weight_group.remote(addr, 2), self.rollout.join_weight_group.remote(addr, 1, 2, keys)])
        if cfg.init_from:  # start from saved policy weights (e.g. SFT); resume= still wins in train()
            from vlarl.init_from import load_init_weights, load_into_worker

            state = load_init_weights(cfg.init_from, cfg.policy, self.policy_spec, cfg.env)
            ray.get([self.actor.__ray_call__.remote(load_into_worker, state), self.rollout.set_weights.remote(state)])
            print(f"[vlarl] policy initialized from {cfg.init_from}")
        # optional dense process reward from a VLM critic (vlarl.rewards, vlarl.workers.reward_worker)
        if cfg.reward.enabled:
            from vlarl.workers.reward_worker import RewardWorker  # loads the critic's model code

            validate_reward_config(cfg.reward)
            # the policy's cameras, or a camera the env renders for the critic only (env.critic_camera)
            critic_cam = [c for c in [getattr(cfg.env, "critic_camera", "")] if c]
            self.reward_cam = reward_camera(cfg.reward, [*self.env_spec.image_keys, *critic_cam])
            # no CPU reservation: the placement plan sizes env/rollout/actor to fill the devices, and the
            # critic runs between rollout steps, taking turns with the rollout worker
            self.reward_worker = scheduler.remote(RewardWorker, 0.0).remote(cfg.reward, cfg.torch_threads)

    def _build_rollout_side(self, device: str) -> None:
        """Env workers and the rollout worker of ``self.plan`` (the actor is built once the plan is final)."""
        cfg = self.cfg
        self.per_worker = cfg.env.num_envs // len(self.plan.env)
        self.env_workers = [
            scheduler.remote_on(EnvWorker, w).remote(cfg.env, self.per_worker, i, cfg.torch_threads, self.plan.stages, w)
            for i, w in enumerate(self.plan.env)
        ]
        self.env_spec: EnvSpec = ray.get(self.env_workers[0].spec.remote())
        self.policy_spec = policy_spec_from_env(self.env_spec)
        self.rollout = scheduler.remote_on(RolloutWorker, self.plan.rollout).remote(
            cfg.policy, self.policy_spec, cfg.seed + 1, device, cfg.torch_threads, self.plan.rollout)

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
        ray.get(self.actor.__ray_call__.remote(load_reference, str(checkpoint)))  # KL reference, if saved
        self.iteration = int(state["iteration"])
        self.env_steps = int(state["env_steps"])
        self.wall_offset = float(state.get("wall_s", 0.0))

    def _reset_envs(self) -> list[dict[str, Any]]:
        """Training seeds: small integers derived from ``seed`` and the iteration (never eval's)."""
        base = self.cfg.seed * SEED_STRIDE + self.iteration * self.cfg.env.num_envs
        if self.reward_worker is not None:
            ray.get(self.reward_worker.reset_state.remote())  # episodes start afresh: forget start frames
        self.reset_seeds = [[base + i * self.per_worker + j for j in range(self.per_worker)]
                            for i in range(len(self.env_workers))]
        return ray.get([w.reset.remote(seeds) for w, seeds in zip(self.env_workers, self.reset_seeds, strict=True)])

    def reset_envs(self, reset_state_ids: list[int] | None) -> list[dict[str, Any]]:
        """Reset every env to ``reset_state_ids`` (one per env; group rollouts) -> obs per env worker."""
        k = self.per_worker
        return ray.get([w.reset.remote(None, reset_state_ids[i * k:(i + 1) * k] if reset_state_ids else None)
                        for i, w in enumerate(self.env_workers)])

    # -- one rollout ----------------------------------------------------------------------------
    def collect(self, obs_parts: list[dict[str, Any]], num_steps: int = 0,
                until_all_ended: bool = False) -> tuple[Trajectory, list[dict[str, Any]], int]:
        """Step every env ``num_steps`` (default ``algorithm.num_steps``) chunks; returns (trajectory, next obs, env steps).
        ``until_all_ended``: stop early once every env has ended an episode (GRPO scores one episode each)."""
        N = num_steps or self.cfg.algorithm.num_steps
        extras = StepExtras()
        obs_hist, replays, logprobs, values = [], [], [], []
        rewards, dones, truncs, final_values = [], [], [], []
        steps, next_frames, results = 0, [], []
        ended: torch.Tensor | bool = False  # per env: an episode ended during this collect
        obs_parts = from_wire(obs_parts)  # env replies arrive as numpy (zero-copy object store buffers)
        # env sub-batches and inference in pipeline stages (vlarl.scheduler.pipeline); rows in global order
        for t, rec in enumerate(scheduler.staged_steps(self.env_workers, self.rollout, obs_parts, N,
                                                       self.plan.stages, self.plan.overlap)):
            sample, boot, results = rec.sample, rec.boot, rec.results
            if t > 0:
                final_values.append(boot if boot is not None else torch.zeros_like(sample.value))
            obs_hist.append(rec.obs_parts)  # worker parts; stacked with one copy at the end
            replays.append(sample.replay)
            logprobs.append(sample.logprob)
            values.append(sample.value if sample.value is not None else torch.zeros(sample.actions.shape[0]))
            rewards.append(torch.cat([r.rewards.sum(-1) for r in results]))
            dones.append(torch.cat([r.terminated.any(-1) for r in results]).float())
            truncs.append(torch.cat([r.truncated.any(-1) for r in results]).float())
            steps += int(sum(int(r.step_mask.sum()) for r in results))
            for r in results:
                self.stats.add(r.episode)
            extras.add(results, policy_version=self.rollout_version)
            if self.reward_worker is not None:
                next_frames.append(end_of_chunk_frames(results, self.reward_cam))
            obs_parts = [r.obs for r in results]
            ended = (dones[-1] + truncs[-1]).bool() | ended
            if until_all_ended and bool(ended.all()):
                break  # the pipeline already submitted one more step; its replies are dropped
        # values of the last step: V(next obs) for GAE, V(final obs) for truncated episodes. The pipeline
        # computed them per stage as each stage ended; a collect that stopped early asks in one round trip
        if rec.tail is not None:
            next_value, last_boot = rec.tail
        else:
            next_obs, boot_obs = scheduler.next_inputs(results)
            next_value, last_boot = ray.get(self.rollout.values.remote(to_wire(next_obs), to_wire(boot_obs)))
        final_values.append(last_boot if last_boot is not None else torch.zeros_like(values[-1]))
        if next_value is None:
            next_value = torch.zeros_like(values[-1])
        traj = Trajectory(
            obs=stack_cat_obs(obs_hist),
            replay={k: torch.stack([r[k] for r in replays]) for k in replays[0]},
            logprob=torch.stack(logprobs),
            values=torch.stack(values),
            rewards=torch.stack(rewards),
            dones=torch.stack(dones),
            truncated=torch.stack(truncs),
            final_values=torch.stack(final_values),
            next_value=next_value,
            extras=extras.stack(),
        )
        if next_frames:
            traj.extras[next_frames_key(self.reward_cam)] = torch.stack(next_frames)
        return traj, obs_parts, steps

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
        obs_parts = self._reset_envs()
        supervisor = WorkerSupervisor(cfg.faults.max_worker_deaths, cfg.faults.death_window_iterations)
        t_start = time.time()
        bar = RunProgress(cfg.total_env_steps, cfg.time_limit_minutes * 60, self.env_steps, self.wall_offset,
                          desc=cfg.experiment_name, disable=not cfg.logger.progress_bar)  # ETA: the binding budget
        stop_reason = "total_env_steps"
        alg_spec = algorithm_spec(cfg.algorithm.name)
        try:
            while self.env_steps < cfg.total_env_steps:
                elapsed = self.wall_offset + time.time() - t_start
                if cfg.time_limit_minutes > 0 and elapsed > cfg.time_limit_minutes * 60:
                    stop_reason = "time_limit_minutes"
                    break
                if cfg.algorithm.anneal_lr:
                    frac = 1.0 - self.env_steps / cfg.total_env_steps
                    self.actor.set_lr.remote(cfg.algorithm.lr * frac)
                t0 = time.time()
                collect = functools.partial(alg_spec.collect, self)  # the algorithm's own way to gather a batch
                traj, obs_parts, steps = prefetched or supervisor.collect(self, collect, obs_parts)  # restarts dead envs
                reward_metrics = {}
                if self.reward_worker is not None:
                    fresh, gamma = alg_spec.fresh_episodes, alg_spec.discount(cfg.algorithm)
                    traj, obs_parts, steps, reward_metrics = supervisor.rewarded(  # restarts a dead critic
                        self, collect, (traj, obs_parts, steps), lambda t, g=gamma, f=fresh: apply_process_reward(
                            t, self.reward_worker, cfg.reward, g, fresh_episodes=f))  # the worker current at call
                t1 = time.time()
                train_ref, prefetched = self.actor.train.remote(traj), None
                if cfg.placement.async_rollout and self.env_steps + steps < cfg.total_env_steps:
                    # the next rollout runs on the current weights while the actor trains: one version stale
                    prefetched = supervisor.collect(self, collect, obs_parts)
                    obs_parts = prefetched[1]
                train_metrics = ray.get(train_ref)
                self.rollout_version = self._sync_weights()
                t2 = time.time()
                phase_metrics = self._phase_metrics(t2 - t0)
                self.iteration += 1
                self.env_steps += steps
                bar.update(steps)
                summ = self.stats.summary()
                sps = steps / max(t2 - t0, 1e-9)
                metrics = {
                    **{f"train/{k}": v for k, v in train_metrics.items()},
                    **{f"rollout/{k}": v for k, v in summ.items()},
                    **reward_metrics,  # already "reward/..." keys
                    "rollout/chunk_reward": float(traj.rewards.mean()),
                    "perf/env_steps_per_s": sps,
                    "perf/collect_s": t1 - t0,
                    "perf/train_s": t2 - t1,
                    **phase_metrics,
                    **supervisor.metrics(),  # faults/*
                    "perf/wall_s": self.wall_offset + time.time() - t_start,
                    "iteration": self.iteration,
                    "env_steps": self.env_steps,
                }
                if cfg.eval.every_iterations > 0 and self.iteration % cfg.eval.every_iterations == 0:
                    metrics.update({f"eval/{k}": v for k, v in self._evaluate(None, videos=0, episodes=cfg.eval.periodic_episodes).items()
                                    if isinstance(v, (int, float))})
                logger.log(self.env_steps, metrics)
                bar.set_postfix(sps=f"{sps:.0f}", success=f"{summ['success_once']:.2f}",
                                ret=f"{summ['return']:.1f}", it=self.iteration)
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
        logger.log(self.env_steps, {f"final_eval/{k}": v for k, v in final.items() if isinstance(v, (int, float))})
        logger.close()
        return final

    def save(self, segment_wall_s: float) -> Path:
        extra = {"iteration": self.iteration, "env_steps": self.env_steps,
                 "wall_s": self.wall_offset + segment_wall_s}
        return save_checkpoint(
            self.run_dir, self.iteration,
            lambda d: ray.get([self.actor.save.remote(str(d), extra),
                               self.actor.__ray_call__.remote(save_reference, str(d))]),  # reference: KL on
            env_cfg=self.cfg.env, keep=self.cfg.keep_checkpoints,
        )

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


def _as_dict(cfg: Any) -> dict[str, Any]:
    try:
        return json.loads(json.dumps(asdict(cfg), default=str))
    except Exception:
        return {}


def run_training(cfg: Any, run_dir: str | Path) -> dict[str, Any]:
    runner = Runner(cfg, run_dir)
    try:
        runner.setup()
        return runner.train()
    except ray.exceptions.RayActorError as e:  # a simulator process died: say which one, with its seeds
        named = describe_dead_env_worker(e, getattr(runner, "env_workers", []), str(cfg.env.task),
                                         getattr(runner, "reset_seeds", []), runner.iteration, str(runner.run_dir))
        if named is None:
            raise
        raise named from e
    finally:
        runner.close()


__all__ = ["Runner", "policy_spec_from_env", "run_training"]
