"""Trajectories assembled where the data is: on the rollout worker, from what it already holds.

The rollout worker sees every observation it samples actions for and every env reply it reads the
next observation from. A ``TrajectoryBuilder`` keeps both, per (chunk step, pipeline stage), and
``build`` stacks them into one time-major ``Trajectory`` in global row order. The trajectory then goes
to the actor (and the reward worker) as an object reference: images never pass through the driver.
The driver reads only ``step_summary`` of every env reply: which envs ended an episode, how many env
steps ran, the metrics of the finished episodes.

Layout: W env workers, S stages, m rows per (worker, stage); a stage batch is [W*m, ...] in worker
order and the global row of (worker k, stage s, row j) is ``k*S*m + s*m + j`` (``stage_to_global``),
the order of one unstaged batch, so trajectories keep their layout whatever S is.
"""

from __future__ import annotations

from typing import Any

import torch

from policies.base import ActionSample
from simulators.base import ChunkStepResult
from vlarl.data.trajectory import Trajectory, cat_obs, row_tensors, stack_obs


def stage_to_global(parts: list[torch.Tensor], workers: int) -> torch.Tensor:
    """S stage tensors [W*m, ...] (worker order) -> one [W*S*m, ...] tensor in global row order."""
    S = len(parts)
    if S == 1:
        return parts[0]
    x = torch.stack(parts)  # [S, W*m, ...]
    m = x.shape[1] // workers
    x = x.view(S, workers, m, *x.shape[2:]).transpose(0, 1)
    return x.reshape(workers * S * m, *x.shape[3:])


def stages_to_global(parts: list[torch.Tensor | None], workers: int) -> torch.Tensor | None:
    """Per-stage optional values -> global row order; a stage without values contributes zeros."""
    if all(p is None for p in parts):
        return None
    ref = next(p for p in parts if p is not None)
    return stage_to_global([p if p is not None else torch.zeros_like(ref) for p in parts], workers)


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


def next_inputs(results: list[ChunkStepResult]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """What the rollout needs after env replies ``results`` (concatenated in order): the observations to
    act on, and the final observations to bootstrap truncated episodes from (None when none was truncated)."""
    obs = cat_obs([r.obs for r in results])
    if not any(bool(r.truncated.any()) for r in results):
        return obs, None
    return obs, cat_obs([r.final_obs if r.final_obs is not None else r.obs for r in results])


def step_summary(result: ChunkStepResult) -> dict[str, Any]:
    """What the driver reads of one env reply (a few bytes per env): ``ended`` bool [m] (an episode ended
    in this chunk step), ``env_steps`` (actions executed) and ``episode``: the metrics of the finished
    episodes only, {name: float32 [finished]}."""
    episode = {k: v.detach().cpu() for k, v in result.episode.items()}
    finished = ~torch.isnan(episode["return"]) if "return" in episode else None
    return {
        "ended": (result.terminated.any(-1) | result.truncated.any(-1)).cpu(),
        "env_steps": int(result.step_mask.sum()),
        "episode": {k: v[finished] for k, v in episode.items()} if finished is not None else episode,
    }


def _global_obs(parts: list[dict[str, Any]], workers: int) -> dict[str, Any]:
    """Stage observations [W*m, ...] -> one observation [W*S*m, ...] in global row order."""
    S = len(parts)
    instr = [list(p["instruction"]) for p in parts]
    if S > 1 and instr[0]:
        m = len(instr[0]) // workers
        instr = [[instr[s][k * m + j] for s in range(S) for j in range(m)] for k in range(workers)]
    return {
        **{k: stage_to_global([p[k] for p in parts], workers) for k in row_tensors(parts[0])},
        "images": {k: stage_to_global([p["images"][k] for p in parts], workers) for k in parts[0]["images"]},
        "instruction": [x for row in instr for x in row],
    }


class TrajectoryBuilder:
    """Collects one rollout on the rollout worker; ``build`` gives the ``Trajectory`` (see module doc) with its
    typed per-step facts (``step_mask``, ``step_rewards``, ``episode_return``, ``episode_success``,
    ``policy_version``, ``next_state``) read from the env replies.

    ``next_images``: which cameras' frame after every chunk step goes into ``Trajectory.next_images``: all
    cameras when ``True`` (a replay's pixel critic bootstraps from them), the one camera a process reward's
    critic reads when ``camera`` is set, none otherwise (each is one more copy of a camera's frames)."""

    def __init__(self, stages: int, workers: int, policy_version: int, next_images: bool = False,
                 camera: str = ""):
        self.stages, self.workers, self.version, self.camera = stages, workers, policy_version, camera
        self.all_images = next_images
        self.obs: dict[tuple[int, int], dict[str, Any]] = {}
        self.samples: dict[tuple[int, int], ActionSample] = {}
        self.boots: dict[tuple[int, int], torch.Tensor | None] = {}  # V(final obs) of step t-1's truncations
        self.results: dict[tuple[int, int], list[ChunkStepResult]] = {}
        # stage -> (steps before it, V(next obs), V(final obs) of the last step's truncations)
        self.tail: dict[int, tuple[int, torch.Tensor | None, torch.Tensor | None]] = {}

    def add_sample(self, step: int, stage: int, obs: dict[str, Any], sample: ActionSample,
                   boot: torch.Tensor | None) -> None:
        self.obs[step, stage], self.samples[step, stage], self.boots[step, stage] = obs, sample, boot

    def add_results(self, step: int, stage: int, results: list[ChunkStepResult]) -> None:
        """The W env replies (worker order) of chunk step ``step`` of stage ``stage``."""
        self.results[step, stage] = list(results)

    def add_tail(self, stage: int, num_steps: int, next_value: torch.Tensor | None,
                 boot: torch.Tensor | None) -> None:
        """Stage ``stage``'s bootstrap values after its chunk step ``num_steps - 1`` [W*m] (None: none)."""
        self.tail[stage] = (num_steps, next_value, boot)

    def has_tail(self, num_steps: int) -> bool:
        """Every stage's tail values were computed after step ``num_steps - 1``."""
        return all(self.tail.get(s, (-1,))[0] == num_steps for s in range(self.stages))

    def worker_results(self, step: int) -> list[ChunkStepResult]:
        """Step ``step``'s replies per env worker, its stages concatenated (worker order = global rows)."""
        S, W = self.stages, self.workers
        return [cat_results([self.results[step, s][k] for s in range(S)]) for k in range(W)]

    def build(self, num_steps: int, tail: tuple[torch.Tensor | None, torch.Tensor | None] | None = None
              ) -> Trajectory:
        """Stack steps ``0 .. num_steps-1``; ``tail`` = (V(next obs), V(final obs) of the last step's
        truncated episodes) in global order, or None for the per-stage tail values ``add_tail`` kept."""
        S, W = self.stages, self.workers
        missing = [(t, s) for t in range(num_steps) for s in range(S)
                   if (t, s) not in self.samples or (t, s) not in self.results]
        if missing:
            raise RuntimeError(f"the rollout worker holds no sample or env reply for (step, stage) {missing[:3]}; "
                               f"trajectories are built only from the steps the pipeline ran")
        g = lambda xs: stage_to_global(xs, W)  # noqa: E731
        obs_steps, replays, logprobs, values = [], [], [], []
        rewards, dones, truncs, final_values = [], [], [], []
        facts: dict[str, list[torch.Tensor]] = {}
        images: dict[str, list[torch.Tensor]] = {}
        for t in range(num_steps):
            samples = [self.samples[t, s] for s in range(S)]
            obs_steps.append(_global_obs([self.obs[t, s] for s in range(S)], W))
            value = g([p.value for p in samples]) if samples[0].value is not None else None
            if t > 0:
                boot = stages_to_global([self.boots[t, s] for s in range(S)], W)
                final_values.append(boot if boot is not None else torch.zeros(values[-1].shape))
            # the executed chunk rides along where the sample's replay does not hold it (a flow or diffusion chain):
            # an off-policy update (pa_rl over a flow VLA) replays the chunk the env was given
            kept = {"actions": g([p.actions for p in samples])} if "actions" not in samples[0].replay else {}
            replays.append({**{k: g([p.replay[k] for p in samples]) for k in samples[0].replay}, **kept})
            logprobs.append(g([p.logprob for p in samples]))
            values.append(value if value is not None else torch.zeros(logprobs[-1].shape[0]))
            results = self.worker_results(t)
            rewards.append(torch.cat([r.rewards.sum(-1) for r in results]))
            dones.append(torch.cat([r.terminated.any(-1) for r in results]).float())
            truncs.append(torch.cat([r.truncated.any(-1) for r in results]).float())
            for name, x in self._step_facts(results).items():
                facts.setdefault(name, []).append(x)
            nexts = [r.final_obs if r.final_obs is not None else r.obs for r in results]
            for k in self._image_keys(nexts[0]):
                images.setdefault(k, []).append(torch.cat([torch.as_tensor(o["images"][k]) for o in nexts]))
        if tail is None:
            tail = (stages_to_global([self.tail[s][1] for s in range(S)], W),
                    stages_to_global([self.tail[s][2] for s in range(S)], W))
        next_value, last_boot = tail
        final_values.append(last_boot if last_boot is not None else torch.zeros_like(values[-1]))
        return Trajectory(
            obs=stack_obs(obs_steps),
            replay={k: torch.stack([r[k] for r in replays]) for k in replays[0]},
            logprob=torch.stack(logprobs),
            values=torch.stack(values),
            rewards=torch.stack(rewards),
            dones=torch.stack(dones),
            truncated=torch.stack(truncs),
            final_values=torch.stack(final_values),
            next_value=next_value if next_value is not None else torch.zeros_like(values[-1]),
            **{name: torch.stack(xs) for name, xs in facts.items()},
            next_images={k: torch.stack(xs) for k, xs in images.items()},
        )

    def _step_facts(self, results: list[ChunkStepResult]) -> dict[str, torch.Tensor]:
        """The typed per-step facts of one chunk step from its W replies (worker order), each [B, ...]."""
        nexts = [r.final_obs if r.final_obs is not None else r.obs for r in results]
        mask = torch.cat([r.step_mask.bool() for r in results])
        privileged = ({"next_critic_state": torch.cat([torch.as_tensor(o["critic_state"]).float() for o in nexts])}
                      if "critic_state" in nexts[0] else {})
        return {
            **privileged,
            "step_mask": mask,
            "step_rewards": torch.cat([r.rewards.float() for r in results]),
            "episode_return": torch.cat([r.episode["return"].float() for r in results]),
            "episode_success": torch.cat([r.episode["success_once"].float() for r in results]),
            "policy_version": torch.full((mask.shape[0],), float(self.version)),
            "next_state": torch.cat([torch.as_tensor(o["state"]).float() for o in nexts]),
        }

    def _image_keys(self, obs: dict[str, Any]) -> list[str]:
        """Cameras whose next frames are kept (see the class doc)."""
        cams = list(obs.get("images", {}) or {})
        return cams if self.all_images else [k for k in cams if k == self.camera]

__all__ = ["TrajectoryBuilder", "cat_results", "next_inputs", "stage_to_global", "stages_to_global", "step_summary"]
