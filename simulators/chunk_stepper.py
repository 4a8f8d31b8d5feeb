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
masked out here. The loop stops once every env's episode has ended. An env that sets
``one_env_at_a_time`` (the serial simulators) is run env by env instead: env 0's chunk, then env 1's, with
one active row per call, and the same bookkeeping.

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

#: an array of the stepper's kind: numpy on the host, a torch tensor on a device (see ``ChunkStepper``)
Array = np.ndarray | torch.Tensor
#: ``observer(t, stepped)``: called after control step ``t`` of a chunk; ``stepped: bool [B]``
StepObserver = Callable[[int, Array], None]


@dataclass
class StepOutcome:
    """One control step of every env: arrays ``[B]`` of the stepper's kind (numpy for a host stepper, torch
    on the device otherwise). Rows of envs that were not active are ignored.

    reward:     float [B]; any float dtype (episode returns are summed in float64, rewards stored float32).
    terminated: bool [B]; the task ended (success, or a failure the task defines).
    truncated:  bool [B]; the env's own limit ended the episode (a simulator's time limit, a robot fault).
                ``max_episode_steps`` is applied by the stepper, not here.
    success:    bool [B]; the per-step success signal.
    executed:   bool [B] or None (= every active env): whether the action ran. An env that ends its
                episode without running the action (the arm stopped first) reports ``executed`` False and
                ``truncated`` True; that step is then masked out and the episode ends there.
    """

    reward: Array
    terminated: Array
    truncated: Array
    success: Array
    executed: Array | None = None


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


class _Host:
    """numpy arrays: a chunk's per-step bookkeeping costs ~1 us an operation instead of a torch op's ~5."""

    where = staticmethod(np.where)

    @staticmethod
    def zeros(shape: tuple[int, ...], dtype: str) -> np.ndarray:
        return np.zeros(shape, dtype=getattr(np, dtype))

    @staticmethod
    def f32(x: np.ndarray) -> np.ndarray:
        return x.astype(np.float32)

    @staticmethod
    def out(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x)


class _Device:
    """torch tensors on one device (a GPU batch): nothing leaves the device."""

    where = staticmethod(torch.where)

    def __init__(self, device: torch.device):
        self.device = device

    def zeros(self, shape: tuple[int, ...], dtype: str) -> torch.Tensor:
        return torch.zeros(shape, dtype=getattr(torch, dtype), device=self.device)

    @staticmethod
    def f32(x: torch.Tensor) -> torch.Tensor:
        return x.float()

    @staticmethod
    def out(x: torch.Tensor) -> torch.Tensor:
        return x


class ChunkStepper:
    """The chunk bookkeeping of ``num_envs`` envs: the action box, the time limit and the running episodes'
    return (float64), length and ``success_once``, carried across chunks.

    ``device`` None: a host env (scenes stepped in Python, the arm); its per-step arrays (``active``, the
    ``StepOutcome``, the observer's ``stepped``) are numpy and the results CPU tensors over them. A device:
    everything is a torch tensor there, with no copy to the host. ``max_episode_steps`` <= 0 means no time
    limit of ours; ``ignore_terminations`` runs every episode to the time limit.
    """

    def __init__(self, num_envs: int, action_low: np.ndarray, action_high: np.ndarray, max_episode_steps: int,
                 device: torch.device | str | None = None, ignore_terminations: bool = False):
        self.num_envs = int(num_envs)
        self.device = None if device is None else torch.device(device)
        self.xp = _Host() if self.device is None else _Device(self.device)
        self.low = torch.as_tensor(np.asarray(action_low), dtype=torch.float32, device=self.device)
        self.high = torch.as_tensor(np.asarray(action_high), dtype=torch.float32, device=self.device)
        self.max_episode_steps = int(max_episode_steps)
        self.ignore_terminations = bool(ignore_terminations)
        self.ret = self.xp.zeros((self.num_envs,), "float64")
        self.length = self.xp.zeros((self.num_envs,), "int64")
        self.success_once = self.xp.zeros((self.num_envs,), "bool")
        self._group_masks: dict[bool, list[Array]] = {}

    def start_episodes(self, rows: Array | None = None) -> None:
        """Forget the running episodes of ``rows`` (bool [B]; None = all): after a reset."""
        sel = slice(None) if rows is None else rows
        self.ret[sel] = 0.0
        self.length[sel] = 0
        self.success_once[sel] = False

    def actions(self, actions: torch.Tensor | np.ndarray) -> Array:
        """Checked actions clipped to the action box: float32 [B, T, A] (numpy for a host stepper)."""
        a = check_actions(actions, self.num_envs, int(self.low.shape[0]), self.device)
        a = torch.maximum(torch.minimum(a, self.high), self.low)
        return a.numpy() if self.device is None else a

    def run(self, env: SteppedEnv, actions: torch.Tensor | np.ndarray,
            observer: StepObserver | None = None) -> ChunkStepResult:
        """Execute ``actions: [B, T, A]`` on ``env`` (see the module docstring) and restart finished episodes."""
        a = self.actions(actions)
        env.begin_chunk()
        B, T, _ = a.shape
        xp = self.xp
        rewards = xp.zeros((B, T), "float32")
        terminated, truncated, step_mask, success = (xp.zeros((B, T), "bool") for _ in range(4))
        done = xp.zeros((B,), "bool")
        for group in self._groups(env.one_env_at_a_time):
            for t in range(T):
                active = group & ~done
                out = env.step_once(a[:, t], active)
                stepped = active if out.executed is None else active & out.executed
                r = xp.where(stepped, out.reward, 0.0)
                rewards[:, t] += r
                self.ret += r  # in float64, step by step: the return of the rewards as the env gave them
                self.length += stepped
                step_mask[:, t] |= stepped
                success[:, t] |= out.success & stepped
                term, trunc = self.end_flags(active, out.terminated, out.truncated, self.length)
                terminated[:, t] |= term
                truncated[:, t] |= trunc
                done |= term | trunc
                if observer is not None:
                    observer(t, stepped)
                if (done | ~group).all():  # every episode of the group has ended
                    break
        return self._finish(env, rewards, terminated, truncated, step_mask, success, done)

    def end_flags(self, active: Array, terminated: Array, truncated: Array, length: Array) -> tuple[Array, Array]:
        """(terminated, truncated), bool [B]: which ``active`` episodes end at a step the env flagged so, with
        ``length`` steps each after it. The one end rule: a termination unless terminations are ignored, else the
        env's truncation or our time limit (never both)."""
        term = active & terminated if not self.ignore_terminations else active & False
        limit = self.max_episode_steps
        trunc = truncated | (length >= limit) if limit > 0 else truncated
        return term, active & trunc & ~term

    def _groups(self, one_at_a_time: bool) -> list[Array]:
        """bool [B] masks of the envs stepped together: all at once, or each alone (``one_env_at_a_time``)."""
        key = bool(one_at_a_time)
        if key not in self._group_masks:
            eye = self.xp.zeros((self.num_envs, self.num_envs), "bool")
            idx = list(range(self.num_envs))
            eye[idx, idx] = True
            self._group_masks[key] = list(eye) if key else [eye.any(0)]
        return self._group_masks[key]

    def _finish(self, env: SteppedEnv, rewards: Array, terminated: Array, truncated: Array, step_mask: Array,
                success: Array, done: Array) -> ChunkStepResult:
        """Episode metrics of the envs in ``done``, ``final_obs``, then the env's auto-reset."""
        xp = self.xp
        self.success_once |= success.any(1)
        at_end = (success & (terminated | truncated)).any(1)  # success at each finished episode's last step
        nan = float("nan")
        episode = {  # the names of ``simulators.base.EPISODE_METRICS``; NaN where no episode ended
            "success_once": xp.where(done, xp.f32(self.success_once), nan),
            "success_at_end": xp.where(done, xp.f32(at_end), nan),
            "return": xp.where(done, xp.f32(self.ret), nan),
            "episode_len": xp.where(done, xp.f32(self.length), nan),
        }
        episode = {k: xp.f32(v) for k, v in episode.items()}
        any_done = bool(done.any())
        final_obs = env.observe() if any_done else None
        if any_done:
            self.start_episodes(done)
        env.end_chunk(done, episode)
        return ChunkStepResult(obs=env.observe(), rewards=xp.out(rewards), terminated=xp.out(terminated),
                               truncated=xp.out(truncated), step_mask=xp.out(step_mask), final_obs=final_obs,
                               done=xp.out(done), episode={k: xp.out(v) for k, v in episode.items()},
                               success=xp.out(success))


class SteppedEnv(BatchedEnv):
    """A batched env built from a per-step vector env: subclasses implement the per-step protocol and set
    ``self.stepper`` (a ``ChunkStepper``) in their constructor; ``chunk_step`` is the one stepper's.
    ``reset`` must call ``self.stepper.start_episodes()``."""

    stepper: ChunkStepper
    #: False: all envs take control step t together (a GPU batch), the chunk runs time-major. True: the
    #: stepper runs one env's chunk, then the next env's (``step_once`` gets one active env): a serial
    #: simulator's scenes are separate simulators, and one that runs its whole chunk keeps its physics in the
    #: CPU cache (time-major cost 7-20% more CPU per step on 4 ManiSkill PushCube scenes here).
    one_env_at_a_time: bool = False

    def begin_chunk(self) -> None:  # noqa: B027 - optional hook
        """Called once per chunk after the actions were checked, before the first step (the arm recovers
        from a stop here)."""

    @abc.abstractmethod
    def step_once(self, actions: Array, active: Array) -> StepOutcome:
        """One control step: ``actions: float32 [B, A]`` (clipped) for every env, ``active: bool [B]`` the
        envs still inside their episode (the rest may be stepped or not; their rows are ignored). Arrays of
        the stepper's kind (numpy for a host stepper)."""

    @abc.abstractmethod
    def observe(self) -> Obs:
        """The batched observation, each env as of its last executed step (or its reset)."""

    @abc.abstractmethod
    def end_chunk(self, done: Array, episode: dict[str, Array]) -> None:
        """After a chunk's last step: reset the envs in ``done: bool [B]`` (auto-reset) so that ``observe``
        shows their next episode. ``episode``: the finished episodes' metrics ({name: float32 [B]}, NaN
        where not done), for an env that records them. Arrays of the stepper's kind."""

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
