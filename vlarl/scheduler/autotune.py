"""Auto-tuning: pick the pipeline depth S and the env/rollout device split from measured phase times.

Measured per chunk step of the whole batch B: ``t_env`` device-seconds of simulation (summed over env
workers), ``t_infer`` seconds of inference (one single-threaded rollout worker), ``overhead`` o, the rest
of an unstaged step's wall time (mostly latency: Ray round trips and driver work, which other stages'
compute can hide), and ``stage_cost`` c, the busy time one more call costs a worker (a no-op round trip).
With n devices, env spread over ``par`` of them (k for a split) and S stages, a step is bounded by each
busy resource and by one stage's own loop (its env, its inference and the latency, once per step):

    turns (collocated, S = 1)   t_env / par + t_infer + o
    split (k env devices)       max(t_env / k + S c, t_infer + S c, (t_env / k + t_infer) / S + o)
    shared (collocated overlap) max((t_env + t_infer + 2 S c) / n, t_env / par + S c, t_infer + S c,
                                    (t_env / par + t_infer) / S + o)

Inference is not always linear in the batch: a wide model streams its weights once per call, so S calls on
B/S rows can cost up to S x one call. ``profile`` therefore times the rollout worker on the whole batch cut
into S parts for every candidate S (``RolloutWorker.time_inference``) and ``choose`` uses that measured
t_infer(S) in place of t_infer wherever a step runs S stages.

Bounds over collocated turns, without overhead (``bounds``): the issue's ``(e + i) / max(e, i)`` with
e = t_env / par assumes env and inference each keep all their devices; a disjoint split cannot beat
``min_k max(t_env / k, t_infer)`` per step, and devices shared by both cannot beat
``max((t_env + t_infer) / n, t_infer)``: on 2 cores with env-heavy steps the issue's bound is out of reach.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from vlarl.scheduler.placement import MODES, STAGE_CHOICES


@dataclass
class Choice:
    stages: int
    env_devices: int  # env devices of a split; for "shared"/"turns": the devices env uses in parallel
    predicted_step_s: float
    collocated_step_s: float
    kind: str = "split"  # "split" | "shared" | "turns"

    @property
    def predicted_speedup(self) -> float:
        return self.collocated_step_s / self.predicted_step_s


def pipelined_step(t_env: float, t_infer: float, stages: int, env_devices: int, overhead: float,
                   stage_cost: float = 0.0) -> float:
    """Disjoint split: env on ``env_devices``, inference on its own device (see module doc)."""
    e, c = t_env / env_devices, stages * stage_cost
    return max(e + c, t_infer + c, (e + t_infer) / stages + overhead)


def shared_step(t_env: float, t_infer: float, stages: int, num_devices: int, par: int, overhead: float,
                stage_cost: float = 0.0) -> float:
    """Collocated overlap: env workers (on ``par`` devices in parallel) and inference share all devices."""
    e, c = t_env / par, stages * stage_cost
    return max((t_env + t_infer + 2 * c) / num_devices, e + c, t_infer + c, (e + t_infer) / stages + overhead)


def turns_step(t_env: float, t_infer: float, par: int, overhead: float) -> float:
    return t_env / par + t_infer + overhead


def bounds(t_env: float, t_infer: float, num_devices: int, par: int) -> dict[str, float]:
    """Best speedups over collocated turns, overhead ignored: the issue's, a disjoint split's, shared devices'."""
    e, colloc = t_env / par, t_env / par + t_infer
    split = min(max(t_env / k, t_infer) for k in range(1, max(2, num_devices)))
    shared = max((t_env + t_infer) / num_devices, e, t_infer)
    return {"issue": colloc / max(e, t_infer), "split": colloc / split, "shared": colloc / shared}


def choose(t_env: float, t_infer: float, overhead: float, num_devices: int, num_envs: int,
           candidates: tuple[int, ...] = (1, 2, 4, 8), env_devices: int | None = None, kind: str = "split",
           par: int | None = None, stage_cost: float = 0.0, infer_by_stages: dict[int, float] | None = None) -> Choice:
    """Best S (and, for a split with ``env_devices`` None, the best env device count) for measured
    ``t_env`` (device-seconds per step of B envs), ``t_infer`` and per-stage ``overhead``; S divides ``num_envs``.
    ``kind``: "split" (hybrid / disaggregated), "shared" (collocated overlap) or "turns" (collocated).
    ``par``: devices the env workers of a collocated run use in parallel (default all), which sets the
    reference, collocated turns. ``infer_by_stages``: measured inference seconds of the whole batch cut
    into S calls (missing S: ``t_infer``)."""
    par = par or num_devices
    by_s = infer_by_stages or {}
    colloc = turns_step(t_env, t_infer, par, overhead)
    options: list[Choice] = []
    for S in candidates:
        if num_envs % S:
            continue
        if kind == "turns":
            options.append(Choice(1, par, colloc, colloc, kind))
            break
        if kind == "shared":
            if S >= 2:
                t = shared_step(t_env, by_s.get(S, t_infer), S, num_devices, par, overhead, stage_cost)
                options.append(Choice(S, par, t, colloc, kind))
            continue
        ks = [env_devices] if env_devices else range(1, max(2, num_devices))
        options += [Choice(S, k, pipelined_step(t_env, by_s.get(S, t_infer), S, k, overhead, stage_cost), colloc, kind)
                    for k in ks]
    if not options:
        raise ValueError(f"no pipeline depth in {candidates} divides {num_envs} envs (and suits kind={kind})")
    return min(options, key=lambda c: c.predicted_step_s)


@dataclass
class Profile:
    t_env: float  # device-seconds of simulation per chunk step (all env workers)
    t_infer: float  # seconds of inference per chunk step
    overhead: float  # wall seconds per step beyond env (in parallel) and inference
    wall: float
    stage_cost: float = 0.0  # seconds of one no-op call to the rollout worker
    infer_by_stages: dict[int, float] = field(default_factory=dict)  # S -> seconds for the batch as S calls


def profile(env_workers: list[Any], rollout: Any, obs_parts: Any, steps: int, par: int,
            stages: tuple[int, ...] = ()) -> Profile:
    """Run ``steps`` unstaged chunk steps (after one warm-up) through the real pipeline and read the workers'
    phase timers; ``par``: env devices the workers simulate on in parallel; ``stages``: the S whose
    inference cost (whole batch as S calls) is timed on the rollout worker."""
    import ray

    from vlarl.scheduler.pipeline import StagedRollout
    from vlarl.scheduler.timeline import phase_totals

    workers = [*env_workers, rollout]
    obs = obs_parts  # where the env workers' observations are (``pipeline.EnvObs``)
    for rec in StagedRollout(env_workers, rollout, 1, True, tail=False).run(obs, 1):
        obs = rec.next_obs()
    ray.get([w.pop_spans.remote() for w in workers])
    t = time.perf_counter()
    for _ in StagedRollout(env_workers, rollout, 1, True, tail=False).run(obs, steps):
        pass
    wall = (time.perf_counter() - t) / steps
    totals = phase_totals(ray.get([w.pop_spans.remote() for w in workers]))
    t_env, t_inf = totals.get("env", 0.0) / steps, totals.get("infer", 0.0) / steps
    cost, by_s = rollout_costs(rollout, obs, stages)
    return Profile(t_env, t_inf, max(0.0, wall - t_env / par - t_inf), wall, cost, by_s)


def rollout_costs(rollout: Any, obs_parts: Any, stages: tuple[int, ...] = (), calls: int = 5
                  ) -> tuple[float, dict[int, float]]:
    """(seconds of one no-op call to the rollout worker, {S: seconds to infer the whole batch of the env
    workers' observations ``obs_parts`` (a ``pipeline.EnvObs`` of an unstaged layout) as S calls} for every S
    in ``stages`` that divides the batch)."""
    import ray

    t = time.perf_counter()
    for _ in range(calls):
        ray.get(rollout.get_version.remote())
    cost = (time.perf_counter() - t) / calls
    if not stages:
        return cost, {}
    return cost, ray.get(rollout.time_inference_of.remote(list(stages), obs_parts.per_stage, *obs_parts.refs[0]))


def same_devices(a: Any, b: Any) -> bool:
    """Do two placement plans put env workers and the rollout worker on the same devices?"""
    return [w.devices for w in a.env] == [w.devices for w in b.env] and a.rollout.devices == b.rollout.devices


def apply(plan: Any, env_workers: list[Any], rollout: Any, obs_parts: list[Any], num_envs: int, seed: int,
          steps: int = 3, group: int = 1, resplit: Any = None) -> Any:
    """``placement.pipeline_stages=auto`` / ``placement.env_split=auto``: profile, pick S (and, for a split
    with env_split=auto, the env device count k) for the plan's mode, and return the plan to run. With the
    same k the env workers switch to S sub-batches and the rollout worker is re-seeded (profiling drew
    samples); with another k, ``resplit(k)`` gives the new plan (the caller rebuilds its workers from it).
    Prints the measurement and the choice."""
    import dataclasses

    import ray

    W = len(env_workers)
    env_devs = sorted({d for w in plan.env for d in w.devices})
    par = max(1, min(W, len(env_devs)))
    # the plan's stage candidates fit its own W; an auto split changes W, so it starts from every choice
    stage_opts = (STAGE_CHOICES if plan.auto_split else plan.stage_candidates) if plan.auto_stages else (plan.stages,)
    # (env devices k, env workers): an auto split runs one env worker per env device
    layouts = [(k, k) for k in plan.split_candidates] if plan.auto_split else [(len(env_devs), W)]
    stages = {workers: tuple(c for c in stage_opts if num_envs % (workers * c * max(1, group)) == 0)
              for _, workers in layouts}
    timed = tuple(sorted({c for cands in stages.values() for c in cands}))
    prof = profile(env_workers, rollout, obs_parts, steps, par, stages=timed)
    split = MODES[plan.mode].split
    if split:
        par = plan.num_devices  # the reference is collocated turns with env on all devices
    kind = "split" if split else ("shared" if plan.overlap else "turns")
    options = []
    for k, workers in layouts:
        if stages[workers]:
            options.append(choose(prof.t_env, prof.t_infer, prof.overhead, plan.num_devices, num_envs // workers,
                                  stages[workers], env_devices=k if kind == "split" else None, kind=kind, par=par,
                                  stage_cost=prof.stage_cost, infer_by_stages=prof.infer_by_stages))
    best = min(options, key=lambda c: c.predicted_step_s)
    b = bounds(prof.t_env, prof.t_infer, plan.num_devices, par)
    by_s = ", ".join(f"S={k} {v * 1e3:.1f}" for k, v in sorted(prof.infer_by_stages.items()))
    split = ""
    if plan.auto_split:
        split = (f", env on {best.env_devices} of {plan.num_devices} devices with one env worker each "
                 f"(placement.env_split=auto; override with placement.env.devices / placement.rollout.devices)")
    print(f"[vlarl] autotune: per chunk step t_env {prof.t_env * 1e3:.1f} ms (device-s), t_infer "
          f"{prof.t_infer * 1e3:.1f} ms (whole batch as S calls, ms: {by_s}), other {prof.overhead * 1e3:.1f} ms, "
          f"call {prof.stage_cost * 1e3:.1f} ms; bounds over collocated: issue {b['issue']:.2f}x, split "
          f"{b['split']:.2f}x, shared {b['shared']:.2f}x -> placement.pipeline_stages={best.stages}{split} "
          f"({best.kind}, predicted {best.predicted_speedup:.2f}x over collocated turns; override with "
          f"placement.pipeline_stages=<S>)")
    if plan.auto_split:
        new = resplit(best.env_devices)
        if not same_devices(new, plan):  # the caller rebuilds env and rollout workers from the new plan
            return dataclasses.replace(new, stages=best.stages, auto_stages=False, auto_split=False)
    if best.stages != plan.stages:
        ray.get([w.set_stages.remote(best.stages) for w in env_workers])
    ray.get(rollout.reseed.remote(seed))
    return dataclasses.replace(plan, stages=best.stages, auto_split=False)


__all__ = ["Choice", "Profile", "apply", "bounds", "choose", "pipelined_step", "profile", "rollout_costs", "same_devices",
           "shared_step", "turns_step"]
