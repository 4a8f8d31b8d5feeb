"""Rollout worker: runs the policy forward to sample action chunks (a Ray actor in training).

It holds a policy version: ``set_weights(weights, version)`` loads the actor's synced tensors (only
trainable parameters and buffers travel) and every sample reports the version that produced it.
Observations arrive in wire form (numpy from the object store, ``vlarl.scheduler.transport``) and are
wrapped without a copy; replies leave the same way. It also builds the trajectory of every rollout from
the observations it samples for and the env replies it reads (``vlarl.data.builder``): the pipeline calls
``begin_trajectory``, the sampling calls record, and ``finish_trajectory`` returns it (to go on by reference). With ``placement.weight_sync=collective`` weights
arrive instead by ``receive_weights`` over a torch.distributed group (``vlarl.scheduler.collective``).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from policies.base import ActionSample, PolicySpec
from policies.registry import make_policy
from simulators.base import ChunkStepResult
from vlarl.data.builder import TrajectoryBuilder, next_inputs
from vlarl.data.trajectory import Trajectory, cat_obs, row_tensors, split_obs
from vlarl.scheduler import collective
from vlarl.scheduler.placement import WorkerPlacement, bind
from vlarl.scheduler.timeline import Spans
from vlarl.scheduler.transport import from_wire, to_device, to_wire, trajectory_info


def synchronize(device: torch.device) -> None:
    """Wait for the kernels queued on ``device`` (CUDA only), so a wall-clock timing covers them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
        self.builder: TrajectoryBuilder | None = None
        self.camera = ""  # a process reward's camera: its end-of-chunk frames go into the trajectory
        self.next_images = False  # a copy of every camera's next frame: only a replay's pixel critic reads it

    def set_reward_camera(self, camera: str) -> None:
        """Keep ``camera``'s frame at the end of every chunk step in the trajectories (the critic reads them)."""
        self.camera = camera

    def record_next_images(self, on: bool) -> None:
        """Record each step's next camera frames in the trajectories (``Trajectory.next_images``): the runner turns it
        on for the algorithms that keep a replay (their pixel critics bootstrap from the next images)."""
        self.next_images = bool(on)

    def begin_trajectory(self, stages: int, workers: int) -> None:
        """Start a new trajectory of ``workers`` env workers in ``stages`` stages (sampled by the weights held now)."""
        self.builder = TrajectoryBuilder(stages, workers, self.version, self.next_images, self.camera)

    def finish_trajectory(self, num_steps: int) -> tuple[Trajectory, dict[str, Any]]:
        """(the trajectory of chunk steps ``0 .. num_steps-1`` in wire form, its ``TrajectoryRef.info``).
        Called with two returns, so the trajectory stays in the object store while the driver reads the info.
        A rollout that stopped early (GRPO: every episode ended) gets its tail values here, in one forward."""
        b = self.builder
        assert b is not None, "begin_trajectory first"
        tail = None  # the per-stage tail values computed as each stage ended (values_after)
        if not b.has_tail(num_steps):
            tail = tuple(self.values(*next_inputs(b.worker_results(num_steps - 1))))
        traj = to_device(b.build(num_steps, tail), "cpu")  # GPU-simulator replies + CPU samples: one device
        self.builder = None
        return to_wire(traj), trajectory_info(traj)

    def transform_trajectories(self, fn: Any, *trajs: Any, **kwargs: Any) -> tuple[Trajectory, dict[str, Any]]:
        """``fn(trajectories, **kwargs) -> (trajectory, info)`` run here, where the trajectories were built (they
        arrive from the object store without a copy). Called with two returns: the result stays in the object
        store, the driver reads ``{"trajectory": its TrajectoryRef.info, "info": info}`` (a few numbers)."""
        out, info = fn([from_wire(t) for t in trajs], **kwargs)
        return to_wire(out), {"trajectory": trajectory_info(out), "info": info}

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
            **{k: obs[k].to(self.device) for k in row_tensors(obs)},  # the state, and a critic's privileged one
            "images": {k: v.to(self.device) for k, v in obs["images"].items()},
            "instruction": obs["instruction"],
        }

    @torch.no_grad()
    def sample(self, obs: dict[str, Any], bootstrap_obs: dict[str, Any] | None = None, stage: int = -1,
               step: int = -1, *after: Any):
        """Sample a chunk for ``obs``; also return V(bootstrap_obs) (final obs of truncated episodes)
        in the same call so bootstrapping costs no extra round trip. Returns (ActionSample, values|None)
        in wire form. ``after``: replies this call only waits for (turn-taking order), unused. Inside a
        trajectory (``stage`` >= 0), the observation and the sample are recorded for it."""
        obs = from_wire(obs)
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
        if self.builder is not None and stage >= 0:
            self.builder.add_sample(step, stage, obs, out, boot)
        return to_wire((out, boot))

    def sample_split(self, stage: int, *obs_parts: dict[str, Any], wait_only: int = 0):
        """Step 0 from reset replies: ``sample`` on sub-batch ``stage`` of every env worker's observation
        (worker order). The last ``wait_only`` arguments are only waited for (turn-taking order)."""
        parts = from_wire(obs_parts[:len(obs_parts) - wait_only])
        S = self.builder.stages if self.builder is not None else 1
        return self.sample(cat_obs([split_obs(o, S)[stage] for o in parts]), None, stage, 0)

    def sample_after(self, stage: int, step: int, *results: ChunkStepResult, wait_only: int = 0):
        """``sample`` on the observations of the env workers' last ``chunk_step_stage`` replies for one
        stage (worker order), bootstrapping truncated episodes from their final obs. The replies come
        from the object store, so the driver never holds them on the critical path. The last
        ``wait_only`` arguments are only waited for (turn-taking order) and are not used. At step 0 the
        replies are those of the last rollout (episodes go on) and nothing is bootstrapped."""
        results = from_wire(results[:len(results) - wait_only])
        obs, boot = next_inputs(results)
        if step > 0 and self.builder is not None:
            self.builder.add_results(step - 1, stage, results)
        return self.sample(obs, boot if step > 0 else None, stage, step)

    @torch.no_grad()
    def values_after(self, stage: int, step: int, *results: ChunkStepResult, wait_only: int = 0):
        """The rollout's tail for one stage: (V(next obs), V(final obs) of truncated episodes | None) of
        the env workers' last replies for ``stage``. Submitted per stage right after the last chunk step,
        so the values of stage s are computed while later stages still simulate, instead of after the
        whole batch has ended. ``wait_only`` as in ``sample_after``."""
        results = from_wire(results[:len(results) - wait_only])
        obs, boot = next_inputs(results)
        with self.spans("value", stage=stage, step=step):  # not "infer": per-step costs stay per step
            values = self.values(obs, boot)
        if self.builder is not None:
            self.builder.add_results(step - 1, stage, results)
            self.builder.add_tail(stage, step, *values)
        return to_wire(tuple(values))

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
            synchronize(self.device)  # CUDA runs asynchronously: time the kernels, not their launches
            t = time.perf_counter()
            for _ in range(repeats):
                for part in parts:
                    self.policy.sample(part)
            synchronize(self.device)
            out[int(S)] = (time.perf_counter() - t) / repeats
        return out

    def time_inference_of(self, stages: list[int], per_stage: bool, *parts: Any) -> dict[int, float]:
        """``time_inference`` on the env workers' current observations: their reset replies, or (``per_stage``)
        their last ``ChunkStepResult`` of an unstaged rollout, in worker order. S that do not divide the batch
        are skipped."""
        parts = from_wire(parts)
        obs = cat_obs([p.obs for p in parts] if per_stage else list(parts))
        B = obs["state"].shape[0]
        return self.time_inference(obs, [S for S in stages if B % S == 0])

    def get_version(self) -> int:
        return self.version

    def pop_spans(self):
        return self.spans.pop()
