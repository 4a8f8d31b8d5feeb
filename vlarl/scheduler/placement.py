"""Placement as data: which devices each component's workers run on, and what they ask Ray for.

A *device* is a GPU where there are GPUs and a CPU core where there are none; device ``i`` of a node is
its i-th GPU, or the i-th core of the node's CPU affinity set. Modes (``placement.mode``):

    collocated     every component on all devices; they take turns (no overlap), or with
                   ``placement.overlap=true`` and S >= 2 overlap stages on the shared devices
    disaggregated  env on its own set; rollout on another; actor on the rollout's set (never the env's)
    hybrid         env and rollout on disjoint sets; actor on all devices

``resolve`` turns a ``PlacementConfig`` into one ``WorkerPlacement`` per worker (its devices and the
Ray resources it requests, so that every worker of a node fits exactly) or raises ``PlacementError``
with a message that names the key and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

COMPONENTS = ("env", "rollout", "actor", "reward")
STAGE_CHOICES = (1, 2, 4, 8)  # the pipeline depths S that pipeline_stages=auto chooses among
#: share of each device's capacity handed out to Ray, so float rounding never blocks scheduling
DEVICE_FILL = 0.95
#: the CPU a worker on a GPU asks Ray for (it mostly waits on its GPU; the CPU devices are the cores)
GPU_WORKER_CPUS = 0.01
#: the amount of a node label (``placement.<component>.resource``) a worker asks for: pins it to that node
NODE_LABEL_AMOUNT = 0.001


@dataclass(frozen=True)
class Mode:
    """What a placement mode means, as data (``MODES``); ``resolve`` reads only these fields.

    split:        env and rollout on disjoint device sets (>= 2 devices, ``env_split`` applies, workers pinned
                  to their cores, each env worker on its own slice of the env set)
    actor:        the actor's default devices: "all" of them, or the "rollout" set
    actor_off_env: the actor must never share a device with the env workers
    overlap:      stages of different sub-batches run at the same time: "always", or "config"
                  (``placement.overlap``)
    """

    name: str
    split: bool
    actor: str
    actor_off_env: bool
    overlap: str


MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("collocated", split=False, actor="all", actor_off_env=False, overlap="config"),
    Mode("disaggregated", split=True, actor="rollout", actor_off_env=True, overlap="always"),
    Mode("hybrid", split=True, actor="all", actor_off_env=False, overlap="always"),
)}


class PlacementError(ValueError):
    """An impossible placement; the message names the config key and a fix."""


@dataclass
class WorkerPlacement:
    """Where one worker runs. ``devices`` are node-local device indices; ``ray_options`` go to
    ``ray.remote(...).options``."""

    component: str
    index: int
    devices: list[int]
    device_type: str  # "cpu" | "gpu"
    pin: bool
    ray_options: dict[str, Any] = field(default_factory=dict)

    @property
    def torch_device(self) -> str:
        return f"cuda:{self.devices[0]}" if self.device_type == "gpu" else "cpu"


@dataclass
class PlacementPlan:
    mode: str
    device_type: str
    num_devices: int
    stages: int
    overlap: bool  # stages of different sub-batches run at the same time
    env: list[WorkerPlacement]
    rollout: WorkerPlacement
    actor: WorkerPlacement
    reward: WorkerPlacement
    auto_stages: bool = False  # pipeline_stages=auto: the runner profiles and sets ``stages`` at start-up
    stage_candidates: tuple[int, ...] = (1,)  # the S values this batch layout allows (auto picks among them)
    auto_split: bool = False  # env_split=auto: the runner profiles and picks the env device count k
    split_candidates: tuple[int, ...] = ()  # the k (env devices = env workers) the batch layout allows

    def describe(self) -> str:
        def sets(ws: list[WorkerPlacement]) -> str:
            return " ".join(str(w.devices) for w in ws)

        kind = "GPU" if self.device_type == "gpu" else "core"
        stages = f"S={self.stages}" + (" (auto)" if self.auto_stages else "") + (" overlapped" if self.overlap else "")
        stages += " split auto" if self.auto_split else ""
        return (f"placement {self.mode} on {self.num_devices} {kind}s, {stages}: "
                f"env {sets(self.env)} | rollout {self.rollout.devices} | actor {self.actor.devices}")


def detect_device_type(requested: str = "auto") -> str:
    if requested not in ("auto", "cpu", "gpu"):
        raise PlacementError(f"placement.device_type='{requested}' is unknown; choose auto, cpu or gpu")
    if requested != "auto":
        return requested
    try:
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    except Exception:
        return "cpu"


def count_devices(device_type: str) -> int:
    if device_type == "gpu":
        import torch

        return torch.cuda.device_count()
    return len(os.sched_getaffinity(0))


def node_cores() -> list[int]:
    """The CPU cores of this node in device order (device i = cores[i])."""
    return sorted(os.sched_getaffinity(0))


def _default_sets(mode: Mode, n: int, env_devices: int = 0) -> dict[str, list[int]]:
    """The mode's device sets; a split mode gives env the first ``env_devices`` (default half)."""
    alldev = list(range(n))
    if not mode.split:
        return {c: alldev for c in COMPONENTS}
    k = env_devices or max(1, n // 2)
    env, roll = alldev[:k], alldev[k:]
    actor = alldev if mode.actor == "all" else roll
    return {"env": env, "rollout": roll, "actor": actor, "reward": roll}


def resolve(p: Any, num_env_workers: int, num_envs: int, group_size: int = 1,
            device_type: str | None = None, num_devices: int | None = None, env_devices: int = 0,
            with_reward: bool = False) -> PlacementPlan:
    """Validate ``p`` (a PlacementConfig) and assign devices and Ray resources to every worker.
    ``env_devices`` k > 0 (env_split=auto's choice): env on devices 0..k-1, rollout on the rest.
    ``with_reward``: a reward worker runs (``reward.enabled``) and shares its devices' capacity."""
    if p.mode not in MODES:
        raise PlacementError(f"placement.mode='{p.mode}' is unknown; choose one of {list(MODES)}")
    mode = MODES[p.mode]
    dtype = detect_device_type(device_type or p.device_type)
    n = num_devices if num_devices is not None else (p.num_devices or count_devices(dtype))
    if n < 1:
        raise PlacementError(f"no {dtype} devices are visible; set placement.device_type=cpu or placement.num_devices")
    sync = getattr(p, "weight_sync", "object_store")
    if sync not in ("object_store", "collective"):
        raise PlacementError(f"placement.weight_sync='{sync}' is unknown; choose object_store or collective")
    auto = str(p.pipeline_stages).strip().lower() == "auto"
    try:
        S = 1 if auto else int(p.pipeline_stages)
    except (TypeError, ValueError):
        raise PlacementError(f"placement.pipeline_stages={p.pipeline_stages!r} must be an integer >= 1 or auto") from None
    if S < 1:
        raise PlacementError(f"placement.pipeline_stages={S} must be >= 1")
    W = int(num_env_workers)
    split = str(getattr(p, "env_split", "half")).strip().lower()
    if split not in ("half", "auto"):
        raise PlacementError(f"placement.env_split={split!r} is unknown; choose half or auto "
                             f"(or give placement.env.devices / placement.rollout.devices explicitly)")
    auto_split = split == "auto" and mode.split
    defaults = _default_sets(mode, n, env_devices)
    if auto_split:  # one env worker per env device (env.num_workers is not used): k, or the default half
        W = len(defaults["env"])
    overlap = mode.overlap == "always" or bool(getattr(p, "overlap", False))
    if mode.overlap == "config" and overlap and S < 2 and not auto:
        raise PlacementError(
            "placement.overlap=true overlaps pipeline stages, but placement.pipeline_stages=1; "
            "set placement.pipeline_stages>=2 (or auto), or placement.overlap=false"
        )
    unit = W * S * max(1, group_size)
    if num_envs % unit != 0:
        lo = max(unit, num_envs // unit * unit)
        raise PlacementError(
            f"env.num_envs={num_envs} is not divisible by env.num_workers x placement.pipeline_stages x group size "
            f"= {W} x {S} x {group_size} = {unit}; set env.num_envs to a multiple of {unit} (e.g. {lo} or {lo + unit})"
        )
    if auto_split and (list(p.env.devices) or list(p.rollout.devices)):
        raise PlacementError(
            f"placement.env_split=auto picks the env and rollout devices itself, but placement.env.devices="
            f"{list(p.env.devices)} / placement.rollout.devices={list(p.rollout.devices)} are given; remove them "
            f"or set placement.env_split=half")
    if mode.split and n < 2:
        raise PlacementError(
            f"placement.mode={p.mode} needs at least 2 devices (env and rollout on disjoint sets) but {n} "
            f"{dtype} device(s) are available; use placement=collocated or raise placement.num_devices"
        )
    sets: dict[str, list[int]] = {}
    for c in COMPONENTS:
        given = [int(d) for d in getattr(p, c).devices]
        bad = [d for d in given if not 0 <= d < n]
        if bad:
            raise PlacementError(f"placement.{c}.devices={given} names device(s) {bad}, but only 0..{n - 1} exist")
        if len(set(given)) != len(given):
            raise PlacementError(f"placement.{c}.devices={given} lists a device twice")
        if given and not mode.split and sorted(given) != list(range(n)):
            raise PlacementError(
                f"placement.mode=collocated puts every component on all {n} devices, but placement.{c}.devices={given}; "
                f"remove placement.{c}.devices or use placement=disaggregated / hybrid"
            )
        sets[c] = sorted(given) if given else list(defaults[c])
    env, roll, actor = set(sets["env"]), set(sets["rollout"]), set(sets["actor"])
    if mode.split and env & roll:
        raise PlacementError(
            f"placement.mode={p.mode} needs disjoint env and rollout devices, but placement.env.devices={sets['env']} "
            f"and placement.rollout.devices={sets['rollout']} share {sorted(env & roll)}"
        )
    if mode.actor_off_env and env & actor:
        raise PlacementError(
            f"placement.mode=disaggregated keeps the actor off the env devices, but placement.actor.devices="
            f"{sets['actor']} overlaps placement.env.devices={sets['env']}; use placement=hybrid to train on all devices"
        )
    if mode.split and mode.actor == "all" and sets["actor"] != list(range(n)):
        raise PlacementError(
            f"placement.mode=hybrid trains the actor on all {n} devices, but placement.actor.devices={sets['actor']}; "
            f"remove placement.actor.devices or use placement=disaggregated"
        )
    # env workers: each gets its own slice of the env set (or, collocated, all devices)
    if not mode.split:
        env_sets = [sets["env"]] * W
    else:
        if dtype == "cpu" and W > len(sets["env"]):
            raise PlacementError(
                f"env.num_workers={W} env workers do not fit on {len(sets['env'])} env core(s) {sets['env']} in "
                f"placement.mode={p.mode}; set env.num_workers<={len(sets['env'])} or give placement.env.devices more cores"
            )
        E = sets["env"]
        env_sets = ([E[k * len(E) // W:(k + 1) * len(E) // W] for k in range(W)] if W <= len(E)
                    else [[E[k % len(E)]] for k in range(W)])
    pin = bool(p.pin_cpus) and dtype == "cpu" and mode.split
    workers = [WorkerPlacement("env", k, list(s), dtype, pin) for k, s in enumerate(env_sets)]
    workers += [WorkerPlacement(c, 0, list(sets[c]), dtype, pin) for c in ("rollout", "actor", "reward")]
    _assign_resources(workers if with_reward else workers[:-1], n, p, dtype)
    env_w = workers[:W]
    rollout, actor, reward = workers[W:]
    per = num_envs // (W * max(1, group_size))
    # sharing devices, overlap needs S >= 2 stages to overlap
    cands = tuple(c for c in STAGE_CHOICES if per % c == 0 and (c >= 2 or mode.split or not overlap))
    # env_split=auto: k env devices, one env worker each, with some S of the run dividing each worker's envs
    # (k = 1 always qualifies: the checks above passed for W x S)
    stage_opts = STAGE_CHOICES if auto else (S,)
    splits = tuple(k for k in range(1, n) if any(num_envs % (k * s * max(1, group_size)) == 0 for s in stage_opts))
    return PlacementPlan(p.mode, dtype, n, S, overlap, env_w, rollout, actor, reward, auto, cands or (1,),
                         auto_split, splits if auto_split else ())


def _assign_resources(workers: list[WorkerPlacement], n: int, p: Any, dtype: str) -> None:
    """Each device's capacity (1 CPU or 1 GPU) is shared evenly by the ``workers`` on it (the reward worker is
    among them only when one runs); workers on different nodes (different ``resource`` labels) never share
    a device."""
    occupants: dict[tuple[str, int], int] = {}
    label = {c: getattr(p, c).resource for c in COMPONENTS}
    for w in workers:
        for d in w.devices:
            occupants[(label[w.component], d)] = occupants.get((label[w.component], d), 0) + 1
    for w in workers:
        lab = label[w.component]
        share = sum(1.0 / max(1, occupants.get((lab, d), 0)) for d in w.devices)
        # a device's capacity in Ray's logical units: placement.num_cpus may give Ray fewer CPUs than cores
        cap = min(1.0, p.num_cpus / n) if dtype == "cpu" and getattr(p, "num_cpus", 0) else 1.0
        amount = round(DEVICE_FILL * share * cap, 4)
        amount = float(int(amount)) if amount >= 1 else amount  # Ray takes fractions only below 1
        opts: dict[str, Any] = {"num_cpus": amount}
        if dtype == "gpu":  # Ray accounts the fractions; the worker binds the physical GPU index itself
            opts = {"num_cpus": GPU_WORKER_CPUS, "num_gpus": amount,
                    "runtime_env": {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}}
        if lab:
            opts["resources"] = {lab: NODE_LABEL_AMOUNT}
        w.ray_options = opts


def bind(w: WorkerPlacement | None) -> str | None:
    """Called inside a worker process: pin it to its cores (CPU devices) and return its torch device
    ("cpu" / "cuda:i"), or None without a placement (the caller's own device choice stands)."""
    if w is None:
        return None
    if w.device_type == "cpu" and w.pin:
        cores = node_cores()
        os.sched_setaffinity(0, {cores[d % len(cores)] for d in w.devices})
    return w.torch_device


def resolve_for_training(cfg: Any, torch_device: str, env_devices: int = 0) -> PlacementPlan:
    """``resolve`` for a TrainConfig: devices follow ``cfg.device`` unless ``placement.device_type`` is set;
    the GRPO group size enters the divisibility check when sub-batches are split off (S > 1 or a
    non-collocated mode). ``env_devices`` k > 0: env_split=auto chose k env devices, one env worker each."""
    p = cfg.placement
    dtype = p.device_type if p.device_type != "auto" else ("gpu" if str(torch_device).startswith("cuda") else "cpu")
    split = MODES[p.mode].split if p.mode in MODES else True  # an unknown mode is refused by resolve
    staged = str(p.pipeline_stages) != "1" or split  # "auto" may pick S > 1
    group = group_size_of(cfg.algorithm) if staged else 1
    workers = env_devices or cfg.env.num_workers
    return resolve(p, workers, cfg.env.num_envs, group, device_type=dtype, env_devices=env_devices,
                   with_reward=bool(cfg.reward.enabled))


def group_size_of(alg_cfg: Any) -> int:
    """GRPO group size when the algorithm has one (envs of a group share a reset state)."""
    return int(getattr(alg_cfg, "group_size", 1) or 1)


__all__ = ["DEVICE_FILL", "MODES", "STAGE_CHOICES", "Mode", "PlacementError", "PlacementPlan", "WorkerPlacement", "bind", "count_devices", "detect_device_type",
           "group_size_of", "node_cores", "resolve", "resolve_for_training"]
