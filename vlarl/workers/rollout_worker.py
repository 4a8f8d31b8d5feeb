"""Rollout worker: runs the policy forward to sample action chunks (a Ray actor in training).

It holds a policy version: ``set_weights(weights, version)`` loads the actor's synced tensors (only
trainable parameters and buffers travel) and every sample reports the version that produced it.
Observations arrive in wire form (numpy from the object store, ``vlarl.scheduler.transport``) and are
wrapped without a copy; replies leave the same way. With ``placement.weight_sync=collective`` weights
arrive instead by ``receive_weights`` over a torch.distributed group (``vlarl.scheduler.collective``).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from policies.base import ActionSample, PolicySpec
from policies.registry import make_policy
from simulators.base import ChunkStepResult
from vlarl.data.trajectory import split_obs
from vlarl.scheduler import collective
from vlarl.scheduler.pipeline import next_inputs
from vlarl.scheduler.placement import WorkerPlacement, bind
from vlarl.scheduler.timeline import Spans
from vlarl.scheduler.transport import from_wire, to_wire


class RolloutWorker:
    def __init__(self, policy_cfg: Any, spec: PolicySpec, seed: int, device: str = "cpu", torch_threads: int = 1,
                 placement: WorkerPlacement | None = None):
        torch.set_num_threads(torch_threads)
        device = bind(placement) or device
        torch.manual_seed(seed)
        self.device = torch.device(device)
        self.policy = make_policy(policy_cfg, spec).to(self.device).eval()
        self.version = 0
        self.spans = Spans("rollout")

    def set_weights(self, state_dict: Any, version: int | None = None) -> int:
        """Load weights: a full ``state_dict``, or the ``(version, tensors)`` pair of ``ActorWorker.sync_weights``
        (a subset: trainable parameters and buffers). Returns the version now held."""
        with self.spans("sync"):
            if isinstance(state_dict, tuple):
                version, state_dict = state_dict
            full = state_dict.keys() == self.policy.state_dict().keys()
            missing, unexpected = self.policy.load_state_dict(state_dict, strict=full)
            if unexpected:
                raise KeyError(f"weights name parameters this policy does not have: {unexpected[:5]}")
            if version is not None:
                self.version = int(version)
        return self.version

    def join_weight_group(self, address: tuple[str, int], rank: int, world_size: int, keys: list[str]) -> str:
        """Join the actor's weight group as ``rank``; ``keys``: the synced tensors (``ActorWorker.weight_keys``)."""
        state = self.policy.state_dict()  # detached tensors sharing the parameters' storage
        missing = [k for k in keys if k not in state]
        if missing:
            raise KeyError(f"weights name parameters this policy does not have: {missing[:5]}; "
                           f"actor and rollout must build the same policy config")
        self._sync_into = {k: state[k] for k in keys}
        self._weight_group = collective.join(address, rank, world_size, self.device)
        return self._weight_group.backend

    def receive_weights(self) -> int:
        """Receive one broadcast of the actor's synced tensors (in place); returns the version now held."""
        with self.spans("sync"):
            self.version = collective.receive(self._weight_group, self._sync_into)
        return self.version

    def reseed(self, seed: int) -> None:
        """Restart the sampling RNG (after a profiling pass drew samples, so training is reproducible)."""
        torch.manual_seed(seed)

    def _to_device(self, obs: dict[str, Any]) -> dict[str, Any]:
        obs = from_wire(obs)
        return {
            "state": obs["state"].to(self.device),
            "images": {k: v.to(self.device) for k, v in obs["images"].items()},
            "instruction": obs["instruction"],
        }

    @torch.no_grad()
    def sample(self, obs: dict[str, Any], bootstrap_obs: dict[str, Any] | None = None, stage: int = -1,
               step: int = -1, *after: Any):
        """Sample a chunk for ``obs``; also return V(bootstrap_obs) (final obs of truncated episodes)
        in the same call so bootstrapping costs no extra round trip. Returns (ActionSample, values|None)
        in wire form. ``after``: replies this call only waits for (turn-taking order), unused."""
        with self.spans("infer", stage=stage, step=step):
            s = self.policy.sample(self._to_device(obs))
            boot = None
            if bootstrap_obs is not None:
                v = self.policy.value(self._to_device(bootstrap_obs))
                boot = v.cpu() if v is not None else None
            out = ActionSample(
                actions=s.actions.cpu(),
                logprob=s.logprob.cpu(),
                value=s.value.cpu() if s.value is not None else None,
                replay={k: v.cpu() for k, v in s.replay.items()},
            )
        return to_wire((out, boot))

    def sample_after(self, stage: int, step: int, *results: ChunkStepResult, wait_only: int = 0):
        """``sample`` on the observations of the env workers' last ``chunk_step_stage`` replies for one
        stage (worker order), bootstrapping truncated episodes from their final obs. The replies come
        from the object store, so the driver never holds them on the critical path. The last
        ``wait_only`` arguments are only waited for (turn-taking order) and are not used."""
        obs, boot = next_inputs(from_wire(results[:len(results) - wait_only]))
        return self.sample(obs, boot, stage, step)

    @torch.no_grad()
    def values_after(self, stage: int, step: int, *results: ChunkStepResult, wait_only: int = 0):
        """The rollout's tail for one stage: (V(next obs), V(final obs) of truncated episodes | None) of
        the env workers' last replies for ``stage``. Submitted per stage right after the last chunk step,
        so the values of stage s are computed while later stages still simulate, instead of after the
        whole batch has ended. ``wait_only`` as in ``sample_after``."""
        obs, boot = next_inputs(from_wire(results[:len(results) - wait_only]))
        with self.spans("value", stage=stage, step=step):  # not "infer": per-step costs stay per step
            return to_wire(tuple(self.values(obs, boot)))

    @torch.no_grad()
    def value(self, obs: dict[str, Any] | None) -> torch.Tensor | None:
        if obs is None:
            return None
        v = self.policy.value(self._to_device(obs))
        return v.cpu() if v is not None else None

    def values(self, *obs: dict[str, Any] | None) -> list[torch.Tensor | None]:
        """``value`` of several observation batches in one round trip (None stays None)."""
        return [self.value(o) for o in obs]

    @torch.no_grad()
    def time_inference(self, obs: dict[str, Any], stages: list[int], repeats: int = 2) -> dict[int, float]:
        """Seconds to sample the whole batch ``obs`` as S equal sub-batches, for each S in ``stages``
        (autotune's inference cost per S: a wide model streams its weights once per call whatever the
        batch, so S stages can cost up to S x one call). Draws samples: reseed afterwards."""
        full = self._to_device(obs)
        out: dict[int, float] = {}
        for S in stages:
            parts = split_obs(full, S)
            self.policy.sample(parts[0])  # warm-up at this batch size
            t = time.perf_counter()
            for _ in range(repeats):
                for part in parts:
                    self.policy.sample(part)
            out[int(S)] = (time.perf_counter() - t) / repeats
        return out

    def get_version(self) -> int:
        return self.version

    def pop_spans(self):
        return self.spans.pop()
