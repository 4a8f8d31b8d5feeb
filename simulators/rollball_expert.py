"""A scripted RollBall-v1 expert and its demonstrations: ManiSkill ships no motion-planning solution for RollBall,
so ``vlarl-demos env=maniskill_rollball env.control_mode=pd_ee_delta_pose`` records this one instead
(``simulators.maniskill_demos`` dispatches to it through ``EXPERT_TASKS``).

RollBall puts a ball (radius 0.035 m) at x in [-0.4, 0.2], y in [0.5, 0.7] and a goal disc (radius 0.1 m) at
y in [-0.9, -0.7], 1.2-1.6 m away; the Panda stands at (-0.1, 1.0) facing -y, so the ball lies between its base
and its resting hand. Success is the ball's centre inside the disc (xy) at any step of the 80 allowed. Measured
here: the ball barely slows once it rolls (0.69 m/s held over 20 steps), so the strike needs direction, not force;
and the ball leaves along the normal of the closed fingers' face it is pushed by, not along the hand's path, so
the hand must turn (about z) until that face looks at the goal: this is why the expert drives
``pd_ee_delta_pose`` (7-d: translation in the robot's base frame, rotation, gripper; 1 = open, -1 = closed).
With d the unit vector from the ball to the goal (xy) and n its side, from privileged state (TCP, ball and goal
poses of the unwrapped ManiSkill env):

0. rise to ``HOVER`` over a point ``SIDE`` beside the ball's strike point (on the side away from the base's axis,
   where the arm reaches lower), turning the hand until its x axis lies along d;
1. descend there to the strike height ``STRIKE_Z``, where the fingers' flat faces, not their rounded tips, meet
   the ball's equator (at 0.025 m instead, the ball left up to 10 degrees off the line; at 0.045 m within 2);
2. slide sideways behind the ball (``GAP`` from its surface, on the ball -> goal line), until the TCP is within
   ``BEHIND_TOL`` of that point and the hand's yaw within ``YAW_TOL`` of d: the goal disc is +-4 degrees wide
   seen from the ball;
3. push along d at the largest step, from contact (no run-up: the arm cannot get far behind a ball near its base,
   and the ball leaves at the hand's speed either way), steering the hand back onto the line, until it is
   ``FOLLOW`` past the ball's start; the ball then rolls on at ~0.85 m/s;
4. hold still while it rolls.

A ball the arm cannot get behind stalls in phase 2 and the episode fails; ``record_expert_demos`` keeps successes
only. Measured (seeds 0-39, noise drawn from seed 0): 40 of 40, the ball leaving within 1.9 degrees of the goal's bearing
(mean 0.7), 48-69 steps per episode.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simulators.base import EnvError
from simulators.expert_recording import play_episode, record_successes
from simulators.maniskill_traj_file import SolvedEpisode

TASK = "RollBall-v1"
CONTROL = "pd_ee_delta_pose"  # the one control mode the expert drives
TIME_LIMIT = 80  # RollBall-v1's own step limit
BALL_RADIUS = 0.035  # m (ManiSkill's RollBallEnv.ball_radius)
STRIKE_Z = 0.045  # m, TCP height of the push: the fingers' flat faces meet the ball's equator (0.035); at 0.025
#                   the rounded fingertips did, and the ball left up to 10 degrees off (0.045: within 1.9 degrees)
HOVER = 0.12  # m, TCP height while passing over the ball (its top is at 0.07)
SIDE = 0.11  # m beside the strike point where the hand comes down, clear of the ball
GAP = 0.025  # m from the ball's surface to the TCP on the line before the push
FOLLOW = 0.15  # m past the ball's start (along d) where the push ends
YAW_TOL = 0.005  # rad: the push starts only with the hand's face this close to d
GAIN = 1.5  # action = GAIN * (target - TCP) / STEP, clamped to +-1
STEP = 0.1  # m, the controller's largest translation per action (ManiSkill's pos_lower/upper)
ROT_STEP = 0.1  # rad, the controller's largest rotation per action
LINE_GAIN = 15.0  # per m of height error, added to the push
SIDE_GAIN = 15.0  # per m of sideways error, added to the push
BEHIND_TOL = 0.004  # m: the push starts only with the TCP this close to its point behind the ball
NOISE = 0.05  # std of the translation noise while approaching (not during the push)


def _yaw(q: torch.Tensor) -> float:
    """The heading (radians, about world z) of a pose's x axis; ``q`` [4] is (w, x, y, z)."""
    w, x, y, z = (float(v) for v in q)
    return math.atan2(2 * (x * y + w * z), 1 - 2 * (y * y + z * z))


def _wrap_half(a: float) -> float:
    """``a`` wrapped to [-pi/2, pi/2): the closed fingers' face is the same turned by pi."""
    return (a + math.pi / 2) % math.pi - math.pi / 2


class RollBallStrike:
    """One episode's privileged controller (module doc): the plan is fixed from the ball's and goal's poses at
    the first call after a reset. ``u`` is the unwrapped ManiSkill env."""

    def __init__(self, u: Any, rng: np.random.Generator):
        self.u, self.rng, self.phase = u, rng, 0
        ball, goal = u.ball.pose.p[0].clone(), u.goal_region.pose.p[0].clone()
        d = goal[:2] - ball[:2]
        d = d / d.norm()
        self.ball0 = ball
        self.d = torch.stack([d[0], d[1], torch.tensor(0.0)])
        n = torch.stack([-d[1], d[0], torch.tensor(0.0)])
        base = u.agent.robot.pose.p[0]
        if float((ball - base)[:2] @ n[:2]) < 0:  # come down on the side away from the base's axis
            n = -n
        self.n = n
        self.behind = ball - self.d * (BALL_RADIUS + GAP)
        self.behind[2] = STRIKE_Z
        self.beside = self.behind + n * SIDE
        self.heading = math.atan2(float(d[1]), float(d[0]))
        q = u.agent.robot.pose.q[0]  # world -> base rotation of the translation part
        self.to_base = _rotation(q).T

    def yaw_error(self) -> float:
        """The turn (rad) that puts the hand's x axis (either sign) on d."""
        return _wrap_half(self.heading - _yaw(self.u.agent.tcp.pose.q[0]))

    def act(self) -> torch.Tensor:
        """The next action [7] float32: base-frame translation, rotation, gripper (-1, closed)."""
        tcp = self.u.agent.tcp.pose.p[0].clone()
        e = self.yaw_error()
        turn = max(-1.0, min(1.0, -e / ROT_STEP))  # measured: the controller's +z turn lowers this heading
        if self.phase == 0:
            target = self.beside.clone()
            target[2] = HOVER
            if (tcp[:2] - self.beside[:2]).norm() < 0.02 and abs(e) < 0.05:
                self.phase = 1
        if self.phase == 1:
            target = self.beside.clone()
            if float(tcp[2]) < STRIKE_Z + 0.01:
                self.phase = 2
        if self.phase == 2:
            target = self.behind.clone()
            if (tcp[:2] - self.behind[:2]).norm() < BEHIND_TOL and abs(e) < YAW_TOL:
                self.phase = 3
        if self.phase == 3 and float((tcp - self.ball0) @ self.d) > FOLLOW:
            self.phase = 4
        if self.phase == 4:
            return self._action(torch.zeros(3), 0.0)
        if self.phase == 3:
            off = float((tcp - self.ball0) @ self.n)
            move = self.d - self.n * off * SIDE_GAIN
            move[2] = (STRIKE_Z - float(tcp[2])) * LINE_GAIN
            return self._action(move.clamp(-1, 1), turn)
        move = (target - tcp) / STEP * GAIN + torch.from_numpy(self.rng.normal(0, NOISE, 3)).float()
        return self._action(move.clamp(-1, 1), turn)

    def _action(self, world_move: torch.Tensor, turn: float) -> torch.Tensor:
        a = torch.zeros(7)
        a[:3] = (self.to_base @ world_move.float()).clamp(-1, 1)
        a[5] = turn
        a[6] = -1.0
        return a


def _rotation(q: torch.Tensor) -> torch.Tensor:
    """The rotation matrix [3, 3] of a unit quaternion ``q`` [4] (w, x, y, z)."""
    w, x, y, z = (float(v) for v in q)
    return torch.tensor([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                         [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                         [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def play(env: Any, u: Any, seed: int, rng: np.random.Generator, time_limit: int) -> SolvedEpisode:
    """One expert episode from ``seed`` until the env ends it or ``time_limit`` steps, cut at its first success
    (``success`` all False when it never succeeds): ``states`` [L + 1, D], ``actions`` [L, 7]."""
    return play_episode(env, seed, lambda: RollBallStrike(u, rng).act, time_limit,
                        "vlarl's scripted RollBall expert (simulators/rollball_expert.py)")


def check_request(control_mode: str, retime: bool) -> None:
    """One-line refusals (``EnvError``) for what the expert cannot record; runs nothing."""
    if control_mode != CONTROL:
        raise EnvError(f"{TASK}'s demonstrations come from vlarl's scripted expert, which drives {CONTROL} (it "
                       f"turns the hand to aim), not env.control_mode='{control_mode}'; set "
                       f"env.control_mode={CONTROL}")
    if retime:
        raise EnvError(f"retime=true re-times a motion planner's path; {TASK}'s scripted expert already moves in "
                       f"large end-effector steps; use retime=false")


def record_expert_demos(env_cfg: Any, episodes: int, dst: Path, seed: int = 0, max_attempts: int = 0,
                        speed: float = 1.0, time_limit: int = TIME_LIMIT, log=print) -> tuple[list[int], int]:
    """Play the expert from ``seed`` on in vlarl's env for ``env_cfg`` until ``episodes`` succeed (at most
    ``max_attempts`` seeds, 0 = 2 x ``episodes``) and write the successes to ``dst`` (.h5 + .json, ManiSkill's
    trajectory layout, each terminated at its first success). ``speed`` is accepted for the demonstrator
    interface and not used: the strike runs at the largest step (the ball's direction, not its speed, decides).
    Returns (the kept episodes' seeds, seeds tried). Raises ``EnvError`` when none succeeds or the seeds would
    reach the evaluation seeds."""
    check_request(env_cfg.control_mode, False)
    time_limit = time_limit or TIME_LIMIT
    return record_successes(env_cfg, dst, lambda env, u, s, rng: play(env, u, s, rng, time_limit),
                            task=TASK, control=CONTROL, name="rollball expert", episodes=episodes, seed=seed,
                            attempts=max_attempts or 2 * episodes, time_limit=time_limit, log=log)


__all__ = ["CONTROL", "TASK", "RollBallStrike", "check_request", "play", "record_expert_demos"]
