"""A scripted PokeCube-v1 expert and its demonstrations: ManiSkill ships no motion-planning solution for PokeCube,
so ``vlarl-demos env=maniskill_pokecube`` records this one instead (``simulators.maniskill_demos`` dispatches to it).

PokeCube lays a peg (0.24 m long, 0.05 m square) flat on the table along +x, a cube 0.1 m beyond the peg's head
at an independent y (yaw within +-30 degrees), and the goal 0.1 m beyond the cube along +x; success is the cube
within 0.05 m of the goal (xy) with the robot static. The peg already points along the push direction, so the
expert needs no wrist rotation and drives ``pd_ee_delta_pos`` (gripper 1 = open, -1 = closed), reading
privileged state (TCP, peg, cube and goal poses of the unwrapped ManiSkill env):

0. hover above the grasp point (on the peg's axis, ``GRASP_BACK`` behind its centre), gripper open;
1. descend to it; 2. close the fingers (``CLOSE_STEPS`` steps, in place);
3. lift the peg ``LIFT`` and carry it sideways until its head sits ``BEHIND`` the cube's centre on the cube-goal
   line (the target is the head's, moved into a TCP target through the measured TCP-to-head offset, so a peg
   that slipped or tilted in the fingers still lines up);
4. push along +x until the head is ``PUSH_SHORT`` before the goal; 5. hold still until the robot is static.

``record_expert_demos`` plays it in vlarl's own env from seeds ``seed, seed + 1, ...`` (far below the evaluation
seeds, 1,000,000+) and writes the episodes that succeed, each ending at its first success, as a ManiSkill
trajectory file (``simulators.maniskill_traj_file``): the file ``algorithm.demos=`` reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from simulators.base import EnvError
from simulators.expert_recording import play_episode, record_successes
from simulators.maniskill_traj_file import SolvedEpisode

TASK = "PokeCube-v1"
CONTROL = "pd_ee_delta_pos"  # the one control mode the expert drives
GRASP_BACK = 0.06  # m behind the peg's centre (towards its tail) where the fingers close
GRASP_Z = 0.022  # m, TCP height of the grasp (the peg's centre is at 0.025)
HOVER = 0.06  # m above the grasp point before descending
CLOSE_STEPS = 3
LIFT = 0.012  # m the peg is lifted off the table while carried
BEHIND = 0.055  # m from the cube's centre to the peg head before the push (the cube reaches 0.028 at 30 degrees)
PUSH_SHORT = 0.02  # m before the goal's centre where the head stops (the cube's half size ahead of it)
PUSH_SPEED = 0.5  # the largest action while pushing: faster, the struck cube slides past the goal
SETTLE = 0.02  # m from the goal at which the push stops and the arm holds still (success needs it static)
GAIN = 1.5  # action = GAIN * (target - TCP) / 0.1 m (the controller's largest step), clamped to +-speed


def _peg_head(u: Any) -> torch.Tensor:
    """The centre of the peg's head face [3] (ManiSkill's ``peg_head_pos``)."""
    return u.peg_head_pos[0].clone()


def scripted_pokecube_action(u: Any, phase: int, rng: np.random.Generator, speed: float):
    """A privileged PokeCube controller for ``pd_ee_delta_pos`` (module doc; phases 0 hover, 1 descend, 2 ..
    2 + ``CLOSE_STEPS`` - 1 close, then carry, push, hold). ``u`` is the unwrapped ManiSkill env, ``speed`` the
    largest action per axis. Returns (action [4] float32 tensor, next phase)."""
    tcp = u.agent.tcp.pose.p[0].clone()
    peg = u.peg.pose.p[0].clone()
    cube = u.cube.pose.p[0].clone()
    goal = u.goal_region.pose.p[0].clone()
    axis = torch.nn.functional.normalize(_peg_head(u) - peg, dim=0)  # the peg's long axis, tail -> head
    grasp = peg - GRASP_BACK * axis
    grasp[2] = GRASP_Z
    carry, push, hold = 2 + CLOSE_STEPS, 3 + CLOSE_STEPS, 4 + CLOSE_STEPS
    grip = -1.0
    if phase == 0:
        tgt, grip = grasp.clone(), 1.0
        tgt[2] += HOVER
        if (tcp[:2] - grasp[:2]).norm() < 0.008:
            phase = 1
    if phase == 1:
        tgt, grip = grasp.clone(), 1.0
        speed = min(speed, 0.5)
        if float(tcp[2] - grasp[2]) < 0.005:
            phase = 2
    if 2 <= phase < carry:  # close in place
        return torch.tensor([0.0, 0.0, 0.0, -1.0]), phase + 1
    head = _peg_head(u)
    if phase == carry:
        want = torch.stack([cube[0] - BEHIND, cube[1], torch.tensor(0.025 + LIFT)])
        tgt = tcp + (want - head)
        if (want[:2] - head[:2]).norm() < 0.008:
            phase = push
    if phase == push:
        want = torch.stack([goal[0] - PUSH_SHORT, goal[1], torch.tensor(0.025 + LIFT)])
        tgt = tcp + (want - head)
        speed = min(speed, PUSH_SPEED)
        if (cube[:2] - goal[:2]).norm() < SETTLE or float(head[0]) >= float(goal[0]) - PUSH_SHORT - 0.005:
            phase = hold
    if phase == hold:
        return torch.tensor([0.0, 0.0, 0.0, -1.0]), phase
    d = (tgt - tcp) / 0.1 * GAIN + torch.from_numpy(rng.normal(0, 0.05, 3)).float()
    return torch.cat([d.clamp(-speed, speed), torch.tensor([grip])]).float(), phase


def play(env: Any, u: Any, seed: int, rng: np.random.Generator, speed: float, time_limit: int) -> SolvedEpisode:
    """One expert episode from ``seed`` until the env ends it or ``time_limit`` steps, cut at its first success
    (``success`` all False when it never succeeds): ``states`` [L + 1, D], ``actions`` [L, 4]."""
    def start():
        phase = 0

        def act():
            nonlocal phase
            a, phase = scripted_pokecube_action(u, phase, rng, speed)
            return a
        return act

    return play_episode(env, seed, start, time_limit,
                        "vlarl's scripted PokeCube expert (simulators/pokecube_expert.py)")


def check_request(control_mode: str, retime: bool) -> None:
    """One-line refusals (``EnvError``) for what the expert cannot record; runs nothing."""
    if control_mode != CONTROL:
        raise EnvError(f"{TASK}'s demonstrations come from vlarl's scripted expert, which drives {CONTROL}, not "
                       f"env.control_mode='{control_mode}'; set env.control_mode={CONTROL}")
    if retime:
        raise EnvError(f"retime=true re-times a motion planner's path; {TASK}'s scripted expert already moves in "
                       f"large end-effector steps (17-30 per episode); use retime=false")


def record_expert_demos(env_cfg: Any, episodes: int, dst: Path, seed: int = 0, max_attempts: int = 0,
                        speed: float = 1.0, time_limit: int = 50, log=print) -> tuple[list[int], int]:
    """Play the expert from ``seed`` on in vlarl's env for ``env_cfg`` until ``episodes`` succeed (at most
    ``max_attempts`` seeds, 0 = 3 x ``episodes``) and write the successes to ``dst`` (.h5 + .json, ManiSkill's
    trajectory layout, each terminated at its first success). ``speed`` is the largest action per axis (the
    expert's noise is drawn from ``seed``). Returns (the kept episodes' seeds, seeds tried). Raises ``EnvError``
    when none succeeds or the seeds would reach the evaluation seeds."""
    check_request(env_cfg.control_mode, False)
    return record_successes(env_cfg, dst, lambda env, u, s, rng: play(env, u, s, rng, speed, time_limit),
                            task=TASK, control=CONTROL, name="pokecube expert", episodes=episodes, seed=seed,
                            attempts=max_attempts or 3 * episodes, time_limit=time_limit, log=log)


__all__ = ["CONTROL", "TASK", "check_request", "play", "record_expert_demos", "scripted_pokecube_action"]
