"""Reward worker: batched process-reward critic inference on rollouts (a Ray actor in training).

It holds the critic and, between iterations, the state that spans trajectories: the first frame of
every env's running episode and that episode's last potential, so potential-based and terminal rewards
are exact across iteration boundaries. The maths lives in ``vlarl.rewards`` (pure functions).
In training the trajectory reaches it by reference (``score_trajectory``) and the scored one stays in the
object store for the actor: the driver reads the reward metrics only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from policies.critics import Critic
from vlarl import rewards as R
from vlarl.data.trajectory import instruction_rows
from vlarl.scheduler.placement import WorkerPlacement, bind
from vlarl.scheduler.transport import from_wire, to_wire, trajectory_info


def load_reference(path: str, frames: int) -> torch.Tensor:
    """``frames`` evenly spaced frames of the first successful episode in an episodes.npz: uint8 [R, H, W, 3]."""
    from pathlib import Path

    f = Path(path)
    f = f / "episodes.npz" if f.is_dir() else f
    if not f.is_file():
        raise FileNotFoundError(f"reward.reference_path='{path}' has no episodes.npz; record one with "
                                f"scripts/train_critic.py record, or set reward.reference_path=''")
    z = np.load(f)
    ok = np.flatnonzero(z["success"])
    if len(ok) == 0:
        raise ValueError(f"reward.reference_path='{path}' holds no successful episode to use as reference")
    ep = z["frames"][ok[0], : int(z["lengths"][ok[0]])]
    idx = np.linspace(0, len(ep) - 1, frames).round().astype(int)
    return torch.from_numpy(ep[idx])


class RewardWorker:
    """Scores frame pairs with a ``Critic`` loaded from ``cfg.critic_path``."""

    def __init__(self, cfg: R.RewardConfig, torch_threads: int = 1, critic: Critic | None = None,
                 placement: WorkerPlacement | None = None):
        torch.set_num_threads(torch_threads)
        bind(placement)  # pinned to placement.reward's cores; the critic's device is reward.device
        R.validate_reward_config(cfg)
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.critic = (critic if critic is not None else Critic.from_pretrained(cfg.critic_path)).to(self.device).eval()
        self.reference = load_reference(cfg.reference_path, cfg.reference_frames) if cfg.reference_path else None
        self._start: torch.Tensor | None = None  # [B, H, W, 3] first frame of each running episode
        self._phi: torch.Tensor | None = None  # [B] potential of the frame the next trajectory starts from
        self._ended_last: torch.Tensor | None = None  # [B] episode ended in the last step of the last call

    def reset_state(self) -> None:
        """Forget running episodes (call after the envs were reset)."""
        self._start, self._phi, self._ended_last = None, None, None

    def score_trajectory(self, traj: Any, gamma: float, fresh_episodes: bool = False) -> tuple[Any, dict[str, Any]]:
        """``vlarl.rewards.apply_process_reward`` on ``traj`` (a ``Trajectory``, in wire form or not), here.
        Returns (the scored trajectory in wire form, its ``TrajectoryRef.info`` with ``metrics``: the reward
        metrics); called with two returns so the trajectory stays in the object store."""
        traj = from_wire(traj)
        metrics = R.apply_process_reward(traj, self, self.cfg, gamma, fresh_episodes=fresh_episodes)
        return to_wire(traj), {**trajectory_info(traj), "metrics": metrics}

    @torch.no_grad()
    def score(self, earlier: torch.Tensor, later: torch.Tensor, instructions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(progress [M], done_prob [M]) for M frame pairs uint8 [M, H, W, 3], in batches of cfg.batch_size."""
        return self.critic.score(earlier, later, list(instructions), reference=self.reference,
                                 batch_size=self.cfg.batch_size)

    def critic_rewards(self, frames: torch.Tensor, next_frames: torch.Tensor, ended: torch.Tensor,
                       terminated: torch.Tensor, instructions: list[str], gamma: float) -> dict[str, torch.Tensor]:
        """Critic reward for a trajectory: {"reward", "done_prob", "progress"}, each float32 [N, B].

        frames / next_frames: uint8 [N, B, H, W, 3] (start / end of each chunk step); ended, terminated: [N, B];
        instructions: B strings (one per env) or N*B (one per row, time-major: a language task's words change at
        its resets, ``vlarl.data.trajectory.instruction_rows``).
        """
        N, B = frames.shape[:2]
        if next_frames.shape != frames.shape:
            raise ValueError(f"next frames {tuple(next_frames.shape)} must match frames {tuple(frames.shape)} [N, B, H, W, 3]")
        instr = instruction_rows({"instruction": instructions}, N, B)  # one per env or per row; else one line
        if not instr:
            raise ValueError(f"got no instructions for {B} envs; the critic scores each episode against its words")
        ended = ended.bool()
        if self._start is not None and self._start.shape != frames.shape[1:]:
            self.reset_state()  # env batch changed shape: start over
        if self.cfg.mode == "delta":
            prog, done = self.score(frames.reshape(N * B, *frames.shape[2:]),
                                    next_frames.reshape(N * B, *frames.shape[2:]), instr)
            prog, done = prog.view(N, B), done.view(N, B)
            reward = prog
        else:
            carry = None
            if self._start is not None:  # episodes that ended at the last step restart at frames[0]
                carry = torch.where(self._ended_last.view(B, 1, 1, 1), frames[0], self._start)
            start = R.episode_start_frames(frames, ended, carry)
            phi_next, done = self.score(start.reshape(N * B, *frames.shape[2:]),
                                        next_frames.reshape(N * B, *frames.shape[2:]), instr)
            phi_next, done = phi_next.view(N, B), done.view(N, B)
            prog = phi_next
            if self.cfg.mode == "potential":
                phi = R.phi_of_current(phi_next, ended, self._phi)
                reward = R.potential_shaping(phi, phi_next, terminated, gamma)
            else:
                reward = R.terminal_reward(phi_next, ended)
            # carry over to the next call: start frames and potentials of the episodes still running
            self._start = start[-1].clone()
            self._phi = torch.where(ended[-1], torch.zeros(B), phi_next[-1])
            self._ended_last = ended[-1].clone()
        return {"reward": reward.float(), "done_prob": done.float(), "progress": prog.float()}
