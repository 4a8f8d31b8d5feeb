"""How data crosses Ray: CPU tensors travel as numpy arrays so the object store holds them zero-copy.

Ray pickles a ``torch.Tensor`` (its storage is copied into the pickle stream, and copied again when it is
unpickled), but it writes a numpy array out of band: the producer copies it once into shared memory and
every reader on the node maps that buffer without a copy. So producers call ``to_wire`` on what they
return (observations, ``ChunkStepResult``s, ``ActionSample``s) and consumers call ``from_wire``, which
wraps the arrays with ``torch.from_numpy`` (no copy). Arrays mapped from the object store are read-only:
consumers must not write into these tensors in place (``torch.cat`` / ``stack`` / arithmetic make new
ones, which is all the pipeline does). CUDA tensors (GPU-parallel simulators) are left as they are.

Both functions walk dicts, lists, tuples and dataclasses, and are idempotent, so a value that is
already in the requested form passes through unchanged.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np
import torch

from vlarl.data.trajectory import Trajectory


def to_wire(x: Any) -> Any:
    """Replace every CPU tensor in ``x`` by a numpy view of it (no copy)."""
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu" or x.requires_grad or x.dtype == torch.bfloat16:
            return x  # numpy has no bfloat16; grads and device tensors keep their own transport
        return x.contiguous().numpy()
    return _walk(x, to_wire)


def from_wire(x: Any) -> Any:
    """Replace every numpy array in ``x`` by a tensor sharing its memory (read-only where Ray mapped it)."""
    if isinstance(x, np.ndarray):
        with warnings.catch_warnings():  # the object store's buffers are read-only by design (see module doc)
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return torch.from_numpy(x)
    return _walk(x, from_wire)


def to_device(x: Any, device: torch.device | str) -> Any:
    """Every tensor in ``x`` moved to ``device`` (dicts, lists, tuples and dataclasses walked). A trajectory
    built from a GPU simulator's replies (CUDA) and the rollout's samples (CPU) is put on one device with it."""
    if isinstance(x, torch.Tensor):
        return x.to(device)
    return _walk(x, lambda v: to_device(v, device))


def _walk(x: Any, f) -> Any:
    if isinstance(x, dict):
        return {k: f(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(f(v) for v in x)
    if isinstance(x, list):
        return x if not x or isinstance(x[0], str) else [f(v) for v in x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{fl.name: f(getattr(x, fl.name)) for fl in dataclasses.fields(x) if fl.init})
    return x


_FIELDS = tuple(f.name for f in dataclasses.fields(Trajectory))


class TrajectoryRef(Trajectory):
    """A ``Trajectory`` whose tensors stay where it was built (the rollout or reward worker) until read.

    ``ref``: an object reference to the trajectory in wire form; ``info``: what the driver logs without
    reading it (``num_steps``, ``num_envs``, ``chunk_reward``: the mean chunk reward). Hand ``payload(traj)``
    to the next worker: the reference while nothing was read.

    Reading a field fetches the whole trajectory to the driver once: a test or tool that inspects a batch on
    the driver pays that transfer (algorithms select where the data is: ``Collector.transform``), and what
    it changes is then local and sent on by value. Built with the fields themselves (as
    ``dataclasses.replace`` does), it is a local trajectory."""

    def __init__(self, ref: Any = None, info: dict[str, Any] | None = None, **fields: Any):
        self.ref, self.info = ref, dict(info or {})
        if fields:  # a local trajectory (dataclasses.replace of a fetched one)
            Trajectory.__init__(self, **fields)
        elif ref is None:
            raise ValueError("TrajectoryRef needs an object reference or the trajectory's fields")

    def __getattr__(self, name: str) -> Any:  # reached only for a field not fetched yet
        if name in _FIELDS and self.__dict__.get("ref") is not None and not self.fetched:
            self.fetch()
            return getattr(self, name)
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    @property
    def fetched(self) -> bool:
        return all(f in self.__dict__ for f in _FIELDS)

    def fetch(self) -> TrajectoryRef:
        import ray

        local = from_wire(ray.get(self.ref))
        self.__dict__.update({f: getattr(local, f) for f in _FIELDS})
        return self

    @property
    def num_steps(self) -> int:
        return int(self.info["num_steps"]) if not self.fetched else int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.info["num_envs"]) if not self.fetched else int(self.rewards.shape[1])

    @property
    def chunk_reward(self) -> float:
        return float(self.info["chunk_reward"]) if not self.fetched else float(self.rewards.mean())

    def get(self) -> Trajectory:
        """The trajectory's tensors (fetched once)."""
        return self if self.fetched else self.fetch()


def payload(traj: Any) -> Any:
    """What to pass to a worker for ``traj``: the reference of a ``TrajectoryRef`` that was never fetched,
    else the trajectory itself (a local one, or a fetched copy that the driver may have changed)."""
    if isinstance(traj, TrajectoryRef) and not traj.fetched:
        return traj.ref
    return traj


def trajectory_info(traj: Any) -> dict[str, Any]:
    """``TrajectoryRef.info`` of a ``Trajectory`` (what a worker returns beside the reference)."""
    return {"num_steps": traj.num_steps, "num_envs": traj.num_envs,
            "chunk_reward": float(traj.rewards.mean()) if traj.rewards.numel() else float("nan")}


__all__ = ["TrajectoryRef", "from_wire", "payload", "to_wire", "trajectory_info"]
