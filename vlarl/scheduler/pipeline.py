"""Pipeline stages: route every env sub-batch's observations to the rollout worker and its actions back.

Each of the W env workers holds S sub-batches (``EnvWorker.chunk_step_stage``). Stage s of the whole
batch is sub-batch s of every worker (M = W x m rows, worker order); the rollout worker samples one
chunk per stage and step, and worker k steps rows ``[k*m, (k+1)*m)`` of that reply. In a mode with
overlap the driver submits the whole dependency graph of an iteration at once, so while the env
workers simulate stage s the rollout worker already infers stage s+1. Without overlap (collocated)
each inference also depends on the previous stage's simulation, so the components take turns.

The data never passes through the driver: observations, actions and env replies move between the
workers through Ray's object store (as numpy, ``transport``), and the rollout worker assembles the
trajectory from what it saw (``vlarl.data.builder``). The driver reads only each env reply's
``step_summary`` (episode ends, env steps, finished episodes' metrics) and ends with ``finish``, which
returns a ``TrajectoryRef``.

Row order: global env row ``k*P + s*m + j`` (worker k, stage s, row j; P = S*m rows per worker), the
same order as one unstaged batch, so trajectories keep their layout whatever S is. The rollout worker
processes stages in the order (step, stage) in every mode, so on a fixed seed all modes with the same
S draw the same samples.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ray
import torch

from vlarl.data.builder import cat_results, next_inputs, stage_to_global
from vlarl.scheduler.transport import TrajectoryRef


def stage_rows(worker: int, stage: int, per_stage: int, stages: int) -> range:
    """Global rows of sub-batch ``stage`` of env worker ``worker``."""
    start = worker * stages * per_stage + stage * per_stage
    return range(start, start + per_stage)


@dataclass
class EnvObs:
    """Where the envs' current observations are: object references (or values), never pulled to the driver.

    ``per_stage=False``: ``refs[0]`` holds one reset reply per env worker (its stages' rows concatenated).
    ``per_stage=True``: ``refs[s]`` holds the env workers' last ``ChunkStepResult`` of stage s."""

    refs: list[list[Any]]
    per_stage: bool = False


@dataclass
class StepRecord:
    """One chunk step of the whole batch as the driver sees it: summaries and references, no arrays."""

    summaries: list[list[dict[str, Any]]]  # [S][W] ``vlarl.data.builder.step_summary`` of each env reply
    result_refs: list[list[Any]]  # [S][W] references to the env replies

    def _by_worker(self) -> list[dict[str, Any]]:
        S, W = len(self.summaries), len(self.summaries[0])
        return [self.summaries[s][k] for k in range(W) for s in range(S)]  # global row order

    @property
    def ended(self) -> torch.Tensor:
        """bool [B] (global row order): an episode ended in this chunk step."""
        return torch.cat([x["ended"] for x in self._by_worker()])

    @property
    def env_steps(self) -> int:
        return sum(x["env_steps"] for x in self._by_worker())

    def episodes(self) -> list[dict[str, torch.Tensor]]:
        """Metrics of the episodes that ended in this step, per env reply in global row order."""
        return [x["episode"] for x in self._by_worker()]

    def next_obs(self) -> EnvObs:
        return EnvObs(self.result_refs, per_stage=True)


class StagedRollout:
    """Drives W env workers (S sub-batches each) and one rollout worker for ``num_steps`` chunk steps.

    The driver submits step t+1's whole dependency graph before it reads step t's summaries, so it never
    waits on a phase. With ``overlap`` the graph has only the data edges (stage s+1 infers while stage s
    simulates); without it every inference also waits for the previous stage's simulation, so the
    components take turns exactly as before, but with no driver round trip in between. The rollout worker
    builds the trajectory as it goes; ``finish`` hands back its reference."""

    def __init__(self, env_workers: list[Any], rollout: Any, stages: int, overlap: bool, tail: bool = True):
        self.env_workers = env_workers
        self.rollout = rollout
        self.stages = stages
        self.overlap = overlap
        self.tail = tail  # compute the last step's bootstrap values (the trajectory's tail); profiling needs none

    def run(self, obs: EnvObs, num_steps: int) -> Iterator[StepRecord]:
        """``obs``: where the env workers' current observations are (an ``EnvObs``, or a list of the env
        workers' reset replies or their references). Yields one ``StepRecord`` per chunk step, in order."""
        W, S = len(self.env_workers), self.stages
        if not isinstance(obs, EnvObs):
            obs = EnvObs([list(obs)])
        self.rollout.begin_trajectory.remote(S, W)  # actor calls run in submission order: before step 0
        summaries: list[list[list[Any]]] = []  # [t][S][W] refs of the env replies' summaries
        steps: list[list[list[Any]]] = []  # [t][S][W] refs of the env replies
        last: list[Any] = []  # env replies of the stage simulated last (turn-taking edge when not overlapping)
        for t in range(num_steps):
            summaries.append([])
            steps.append([])
            for s in range(S):
                # turn-taking: wait for the previous stage's simulation unless it is already a data input
                after = [] if self.overlap or (S == 1) else last
                if t == 0 and not obs.per_stage:  # reset replies: the rollout takes sub-batch s of each
                    ref = self.rollout.sample_split.remote(s, *obs.refs[0], *after, wait_only=len(after))
                else:
                    data = steps[t - 1][s] if t > 0 else obs.refs[s]
                    extra = [r for r in after if all(r is not d for d in data)]
                    ref = self.rollout.sample_after.remote(s, t, *data, *extra, wait_only=len(extra))
                pairs = [w.chunk_step_stage.options(num_returns=2).remote(s, ref, k, t)
                         for k, w in enumerate(self.env_workers)]
                steps[t].append([p[0] for p in pairs])
                summaries[t].append([p[1] for p in pairs])
                last = steps[t][-1]
            if self.tail and t == num_steps - 1:  # the tail values of stage s overlap the simulation of stages > s
                for s in range(S):
                    after = [] if self.overlap or (S == 1) else [r for r in last if all(r is not d for d in steps[t][s])]
                    self.rollout.values_after.remote(s, t + 1, *steps[t][s], *after, wait_only=len(after))
            if t >= 1:  # step t-1 is no longer needed for submitting: free its references
                rec = self._record(summaries[t - 1], steps[t - 1])
                summaries[t - 1], steps[t - 1] = None, None  # type: ignore[call-overload]
                yield rec
        yield self._record(summaries[-1], steps[-1])

    def _record(self, summary_refs: list[list[Any]], step_refs: list[list[Any]]) -> StepRecord:
        got = ray.get([ref for refs in summary_refs for ref in refs])
        W = len(self.env_workers)
        return StepRecord(summaries=[got[s * W:(s + 1) * W] for s in range(self.stages)], result_refs=step_refs)

    def finish(self, num_steps: int) -> TrajectoryRef:
        """The trajectory of the first ``num_steps`` chunk steps, built and kept on the rollout side."""
        traj_ref, info_ref = self.rollout.finish_trajectory.options(num_returns=2).remote(num_steps)
        return TrajectoryRef(traj_ref, ray.get(info_ref))


__all__ = ["EnvObs", "StagedRollout", "StepRecord", "cat_results", "next_inputs", "stage_rows", "stage_to_global"]
