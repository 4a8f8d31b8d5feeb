"""The one chunk stepper: ``chunk_step`` written once over any per-step vector env.

Every batched env (CPU scenes stepped one at a time, ManiSkill's ``physx_cuda`` batch, the real arm)
promises the same chunk semantics (``simulators.base``): action checks, clipping to the action box,
per-step rewards into ``[B, chunk]``, early stop inside a chunk, auto-reset at the chunk boundary,
``final_obs``, the episode metrics and the step mask. That bookkeeping lives here; an env says only how
to do one control step of all its envs, what they observe, and how to restart finished episodes:

    class MyEnv(SteppedEnv):
        def begin_chunk(self) -> None: ...                       # optional: before the first step
        def step_once(self, actions, active) -> StepOutcome: ... # one control step, actions [B, A]
        def observe(self) -> Obs: ...                            # each env as of its last executed step
        def end_chunk(self, done, episode) -> None: ...          # after the last step: auto-reset ``done``

A chunk of ``T`` actions runs time-major: step ``t`` is one ``step_once`` call for all envs, with
``active: bool [B]`` saying which envs are still inside their episode. An env that can pause a scene
(a serial simulator, the arm) steps only active rows; a GPU batch steps all and its inactive rows are
masked out here. The loop stops once every env's episode has ended.

Per-step observers (video frames, say) are a declared argument: ``chunk_step(actions, observer=fn)``
calls ``fn(t, stepped)`` after control step ``t`` with ``stepped: bool [B]`` (which envs executed it),
before any auto-reset, so the frame of an episode's last step is the state its last action reached.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from simulators.base import BatchedEnv, ChunkStepResult, EnvError, Obs

#: ``observer(t, stepped)``: called after control step ``t`` of a chunk; ``stepped: bool [B]``
StepObserver = Callable[[int, torch.Tensor], None]


@dataclass
class StepOutcome:
    """One control step of every env; tensors ``[B]`` on the env's stepper device. Rows of envs that were
    not active are ignored.

    reward:     float [B]; any float dtype (episode returns are summed in float64, rewards stored float32).
    terminated: bool [B]; the task ended (success, or a failure the task defines).
    truncated:  bool [B]; the env's own limit ended the episode (a simulator's time limit, a robot fault).
                ``max_episode_steps`` is applied by the stepper, not here.
    success:    bool [B]; the per-step success signal.
    executed:   bool [B] or None (= every active env): whether the action ran. An env that ends its
                episode without running the action (the arm stopped first) reports ``executed`` False and
                ``truncated`` True; that step is then masked out and the episode ends there.
    """

    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    success: torch.Tensor
    executed: torch.Tensor | None = None


def check_actions(actions: torch.Tensor | np.ndarray, num_envs: int, action_dim: int,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """float32 [B, T, action_dim] on ``device`` with no NaN/inf, or a one-line error naming the problem."""
    a = torch.as_tensor(actions, dtype=torch.float32, device=device)  # no host copy for a tensor on the device
    if a.ndim != 3 or a.shape[0] != num_envs or a.shape[2] != action_dim:
        raise EnvError(
            f"chunk_step expects actions [B={num_envs}, chunk, action_dim={action_dim}], got {tuple(a.shape)}"
        )
    if not bool(torch.isfinite(a).all()):
        bad = (~torch.isfinite(a)).nonzero()[0].tolist()
        raise EnvError(
            f"chunk_step got a non-finite action (NaN/inf) at [env, step, dim]={bad}; check the policy's output "
            "and its action normalization stats"
        )
    return a


class ChunkStepper:
    """The chunk bookkeeping of ``num_envs`` envs on ``device``: the action box, the time limit and the
    running episodes' return (float64), length and ``success_once``, carried across chunks.

    ``max_episode_steps`` <= 0 means no time limit of ours; ``ignore_terminations`` runs every episode to
    the time limit (a task's success or failure does not end it).
    """

    def __init__(self, num_envs: int, action_low: np.ndarray, action_high: np.ndarray, max_episode_steps: int,
                 device: torch.device | str = "cpu", ignore_terminations: bool = False):
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.low = torch.as_tensor(np.asarray(action_low), dtype=torch.float32, device=self.device)
        self.high = torch.as_tensor(np.asarray(action_high), dtype=torch.float32, device=self.device)
        self.max_episode_steps = int(max_episode_steps)
        self.ignore_terminations = bool(ignore_terminations)
        self.ret = torch.zeros(self.num_envs, dtype=torch.float64, device=self.device)
        self.length = torch.zeros(self.num_envs, dtype=torch.long, device=self.device)
        self.success_once = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)

    def start_episodes(self, rows: torch.Tensor | None = None) -> None:
        """Forget the running episodes of ``rows`` (bool [B] or indices; None = all): after a reset."""
        sel = slice(None) if rows is None else rows
        self.ret[sel] = 0.0
        self.length[sel] = 0
        self.success_once[sel] = False

    def actions(self, actions: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Checked actions clipped to the action box: float32 [B, T, A] on the stepper's device."""
        a = check_actions(actions, self.num_envs, int(self.low.shape[0]), self.device)
        return torch.maximum(torch.minimum(a, self.high), self.low)

    def run(self, env: SteppedEnv, actions: torch.Tensor | np.ndarray,
            observer: StepObserver | None = None) -> ChunkStepResult:
        """Execute ``actions: [B, T, A]`` on ``env`` (see the module docstring) and restart finished episodes."""
        a = self.actions(actions)
        env.begin_chunk()
        B, T, _ = a.shape
        dev = self.device
        rewards = torch.zeros(B, T, dtype=torch.float32, device=dev)
        terminated = torch.zeros(B, T, dtype=torch.bool, device=dev)
        truncated = torch.zeros(B, T, dtype=torch.bool, device=dev)
        step_mask = torch.zeros(B, T, dtype=torch.bool, device=dev)
        success = torch.zeros(B, T, dtype=torch.bool, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        for t in range(T):
            active = ~done
            out = env.step_once(a[:, t], active)
            stepped = active if out.executed is None else active & out.executed
            r = torch.where(stepped, out.reward.to(torch.float64), 0.0)
            step_mask[:, t] = stepped
            rewards[:, t] = r
            success[:, t] = out.success & stepped
            self.ret += r
            self.length += stepped
            term = active & out.terminated if not self.ignore_terminations else torch.zeros_like(active)
            trunc = out.truncated
            if self.max_episode_steps > 0:
                trunc = trunc | (self.length >= self.max_episode_steps)
            trunc = active & trunc & ~term
            terminated[:, t] = term
            truncated[:, t] = trunc
            done |= term | trunc
            if observer is not None:
                observer(t, stepped)
            if bool(done.all()):
                break
        return self._finish(env, rewards, terminated, truncated, step_mask, success, done)

    def _finish(self, env: SteppedEnv, rewards: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor,
                step_mask: torch.Tensor, success: torch.Tensor, done: torch.Tensor) -> ChunkStepResult:
        """Episode metrics of the envs in ``done``, ``final_obs``, then the env's auto-reset."""
        self.success_once |= success.any(1)
        ended = terminated | truncated  # one True per finished env: its episode's last step
        nan = float("nan")
        episode = {
            "success_once": torch.where(done, self.success_once.float(), nan),
            "success_at_end": torch.where(done, (success & ended).any(1).float(), nan),
            "return": torch.where(done, self.ret.float(), nan),
            "episode_len": torch.where(done, self.length.float(), nan),
        }
        any_done = bool(done.any())
        final_obs = env.observe() if any_done else None
        if any_done:
            self.start_episodes(done)
        env.end_chunk(done, episode)
        return ChunkStepResult(obs=env.observe(), rewards=rewards, terminated=terminated, truncated=truncated,
                               step_mask=step_mask, final_obs=final_obs, done=done, episode=episode, success=success)


class SteppedEnv(BatchedEnv):
    """A batched env built from a per-step vector env: subclasses implement the per-step protocol and set
    ``self.stepper`` (a ``ChunkStepper``) in their constructor; ``chunk_step`` is the one stepper's.
    ``reset`` must call ``self.stepper.start_episodes()``."""

    stepper: ChunkStepper

    def begin_chunk(self) -> None:  # noqa: B027 - optional hook
        """Called once per chunk after the actions were checked, before the first step (the arm recovers
        from a stop here)."""

    @abc.abstractmethod
    def step_once(self, actions: torch.Tensor, active: torch.Tensor) -> StepOutcome:
        """One control step: ``actions: float32 [B, A]`` (clipped) for every env, ``active: bool [B]`` the
        envs still inside their episode (the rest may be stepped or not; their rows are ignored)."""

    @abc.abstractmethod
    def observe(self) -> Obs:
        """The batched observation, each env as of its last executed step (or its reset)."""

    @abc.abstractmethod
    def end_chunk(self, done: torch.Tensor, episode: dict[str, torch.Tensor]) -> None:
        """After a chunk's last step: reset the envs in ``done: bool [B]`` (auto-reset) so that ``observe``
        shows their next episode. ``episode``: the finished episodes' metrics ({name: float32 [B]}, NaN
        where not done), for an env that records them."""

    def render_rows(self, rows: list[int]) -> list[np.ndarray] | None:
        """uint8 [H, W, 3] frames of the envs ``rows`` now, or None when the env was built without rendering.
        Default: rows of ``render()``; an env that renders scene by scene renders only these."""
        frames = self.render()
        if frames is None:
            return None
        return [np.asarray(frames[i], dtype=np.uint8) for i in rows]

    def chunk_step(self, actions: torch.Tensor | np.ndarray, observer: StepObserver | None = None) -> ChunkStepResult:
        """Execute ``actions: float32 [B, T, action_dim]`` and auto-reset finished envs; ``observer(t, stepped)``
        (optional) runs after every control step."""
        return self.stepper.run(self, actions, observer)
