"""Pipeline stages: route every env sub-batch's observations to the rollout worker and its actions back.

Each of the W env workers holds S sub-batches (``EnvWorker.chunk_step_stage``). Stage s of the whole
batch is sub-batch s of every worker (M = W x m rows, worker order); the rollout worker samples one
chunk per stage and step, and worker k steps rows ``[k*m, (k+1)*m)`` of that reply. In a mode with
overlap the driver submits the whole dependency graph of an iteration at once, so while the env
workers simulate stage s the rollout worker already infers stage s+1 (the data moves through Ray's
object store, never through the driver). Without overlap (collocated) each inference also depends on the
previous stage's simulation, so the components take turns. Arrays travel as numpy (``transport``).

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

from policies.base import ActionSample
from simulators.base import ChunkStepResult
from vlarl.data.trajectory import cat_obs, split_obs
from vlarl.scheduler.transport import from_wire, to_wire


def next_inputs(results: list[ChunkStepResult]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """What the rollout needs after env replies ``results`` (concatenated in order): the observations to
    act on, and the final observations to bootstrap truncated episodes from (None when none was truncated)."""
    obs = cat_obs([r.obs for r in results])
    if not any(bool(r.truncated.any()) for r in results):
        return obs, None
    return obs, cat_obs([r.final_obs if r.final_obs is not None else r.obs for r in results])


def cat_results(results: list[ChunkStepResult]) -> ChunkStepResult:
    """Concatenate the sub-batch results of one worker along the env dim (stage order)."""
    if len(results) == 1:
        return results[0]
    cat = torch.cat
    finals = [r.final_obs if r.final_obs is not None else r.obs for r in results]
    has_final = any(r.final_obs is not None for r in results)
    succ = [r.success for r in results]
    return ChunkStepResult(
        obs=cat_obs([r.obs for r in results]),
        rewards=cat([r.rewards for r in results]),
        terminated=cat([r.terminated for r in results]),
        truncated=cat([r.truncated for r in results]),
        step_mask=cat([r.step_mask for r in results]),
        final_obs=cat_obs(finals) if has_final else None,
        done=cat([r.done for r in results]),
        episode={k: cat([r.episode[k] for r in results]) for k in results[0].episode},
        success=cat(succ) if all(s is not None for s in succ) else None,
    )


@dataclass
class StepRecord:
    """One chunk step of the whole batch in global row order (B = W x S x m)."""

    sample: ActionSample  # [B, ...]
    boot: torch.Tensor | None  # V(final obs) of episodes truncated in the previous step, [B] (None: none)
    results: list[ChunkStepResult]  # one per env worker, its stages concatenated
    obs_parts: list[dict[str, Any]] | None = None  # per env worker: the obs the actions were sampled for
    # last step only: (V(next obs) [B], V(final obs) of episodes truncated in it [B] | None), computed per
    # stage as soon as that stage's last simulation ended (None on every other step)
    tail: tuple[torch.Tensor | None, torch.Tensor | None] | None = None

    @property
    def obs(self) -> dict[str, Any]:
        """The observation the actions were sampled for, [B, ...] (a copy; ``obs_parts`` avoids it)."""
        assert self.obs_parts is not None, "obs_parts is set by staged_steps"
        return cat_obs(self.obs_parts)


def stage_to_global(parts: list[torch.Tensor], workers: int) -> torch.Tensor:
    """S stage tensors [W*m, ...] (worker order) -> one [W*S*m, ...] tensor in global row order."""
    S = len(parts)
    if S == 1:
        return parts[0]
    x = torch.stack(parts)  # [S, W*m, ...]
    m = x.shape[1] // workers
    x = x.view(S, workers, m, *x.shape[2:]).transpose(0, 1)
    return x.reshape(workers * S * m, *x.shape[3:])


def stage_rows(worker: int, stage: int, per_stage: int, stages: int) -> range:
    """Global rows of sub-batch ``stage`` of env worker ``worker``."""
    start = worker * stages * per_stage + stage * per_stage
    return range(start, start + per_stage)


def _stages_to_global(parts: list[torch.Tensor | None], workers: int) -> torch.Tensor | None:
    """Per-stage optional values -> global row order; a stage without values contributes zeros."""
    if all(p is None for p in parts):
        return None
    ref = next(p for p in parts if p is not None)
    return stage_to_global([p if p is not None else torch.zeros_like(ref) for p in parts], workers)


def _sample_to_global(parts: list[ActionSample], workers: int) -> ActionSample:
    if len(parts) == 1:
        return parts[0]
    g = lambda xs: stage_to_global(xs, workers)  # noqa: E731
    return ActionSample(
        actions=g([p.actions for p in parts]),
        logprob=g([p.logprob for p in parts]),
        value=g([p.value for p in parts]) if parts[0].value is not None else None,
        replay={k: g([p.replay[k] for p in parts]) for k in parts[0].replay},
    )


class StagedRollout:
    """Drives W env workers (S sub-batches each) and one rollout worker for ``num_steps`` chunk steps.

    The driver submits step t+1's whole dependency graph before it reads step t, so it never waits on
    a phase. With ``overlap`` the graph has only the data edges (stage s+1 infers while stage s
    simulates); without it every inference also waits for the previous stage's simulation, so the
    components take turns exactly as before, but with no driver round trip in between."""

    def __init__(self, env_workers: list[Any], rollout: Any, stages: int, overlap: bool, tail: bool = True):
        self.env_workers = env_workers
        self.rollout = rollout
        self.stages = stages
        self.overlap = overlap
        self.tail = tail  # compute the last step's bootstrap values (StepRecord.tail); profiling needs none

    def run(self, obs_parts: list[dict[str, Any]], num_steps: int) -> Iterator[StepRecord]:
        """``obs_parts``: the current observation of each env worker (its stages concatenated).
        Yields one ``StepRecord`` per chunk step, in order."""
        W, S = len(self.env_workers), self.stages
        obs_parts = from_wire(obs_parts)
        m = obs_parts[0]["state"].shape[0] // S
        # stage s's first observation: sub-batch s of every worker, in worker order
        stage_obs = [to_wire(cat_obs([split_obs(o, S)[s] for o in obs_parts])) for s in range(S)]
        samples: list[list[Any]] = []
        steps: list[list[list[Any]]] = []
        last: list[Any] = []  # env replies of the stage simulated last (turn-taking edge when not overlapping)
        tail: list[Any] | None = None
        for t in range(num_steps):
            samples.append([])
            steps.append([])
            for s in range(S):
                # turn-taking: wait for the previous stage's simulation unless it is already a data input
                after = [] if self.overlap or (S == 1) else last
                if t == 0:
                    ref = self.rollout.sample.remote(stage_obs[s], None, s, t, *after)
                else:
                    data = steps[t - 1][s]
                    extra = [r for r in after if all(r is not d for d in data)]
                    ref = self.rollout.sample_after.remote(s, t, *data, *extra, wait_only=len(extra))
                samples[t].append(ref)
                refs = [w.chunk_step_stage.remote(s, ref, k * m, t) for k, w in enumerate(self.env_workers)]
                steps[t].append(refs)
                last = refs
            if self.tail and t == num_steps - 1:  # the tail values of stage s overlap the simulation of stages > s
                tail = []
                for s in range(S):
                    after = [] if self.overlap or (S == 1) else [r for r in last if all(r is not d for d in steps[t][s])]
                    tail.append(self.rollout.values_after.remote(s, t + 1, *steps[t][s], *after,
                                                                 wait_only=len(after)))
            if t >= 1:  # step t-1 is no longer needed for submitting: free its references
                rec = self._record(samples[t - 1], steps[t - 1], W)
                samples[t - 1], steps[t - 1] = None, None  # type: ignore[call-overload]
                yield rec
        yield self._record(samples[-1], steps[-1], W, tail)

    def _record(self, sample_refs: list[Any], step_refs: list[list[Any]], W: int,
                tail_refs: list[Any] | None = None) -> StepRecord:
        tail_refs = tail_refs or []
        got = from_wire(ray.get([*sample_refs, *(ref for refs in step_refs for ref in refs), *tail_refs]))
        replies, flat = got[:self.stages], got[self.stages:len(got) - len(tail_refs)]  # [(sample, boot)], [S*W]
        tails = got[len(got) - len(tail_refs):]
        results = [flat[s * W:(s + 1) * W] for s in range(self.stages)]  # [S][W] ChunkStepResult
        per_worker = [cat_results([results[s][k] for s in range(self.stages)]) for k in range(W)]
        boot = _stages_to_global([b for _, b in replies], W)
        sample = _sample_to_global([s for s, _ in replies], W)
        tail = None
        if tails:
            tail = (_stages_to_global([v for v, _ in tails], W), _stages_to_global([b for _, b in tails], W))
        return StepRecord(sample=sample, boot=boot, results=per_worker, tail=tail)


def staged_steps(runner_envs: list[Any], rollout: Any, obs_parts: list[dict[str, Any]], num_steps: int,
                 stages: int, overlap: bool) -> Iterator[StepRecord]:
    """``StagedRollout.run`` with every record's ``obs_parts`` filled in (the previous step's worker obs)."""
    prev = from_wire(obs_parts)
    for rec in StagedRollout(runner_envs, rollout, stages, overlap).run(prev, num_steps):
        rec.obs_parts = prev
        prev = [r.obs for r in rec.results]
        yield rec


__all__ = ["StagedRollout", "StepRecord", "cat_results", "next_inputs", "stage_rows", "stage_to_global",
           "staged_steps"]
