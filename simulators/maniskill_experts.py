"""Scripted ManiSkill3 experts (PushCube-v1, PickCube-v1, vlarl's PushCubeToColor-v1): demonstrators, not policies.

They read privileged simulator state (TCP, cube and goal poses of the unwrapped ManiSkill env) and drive the end
effector (``control_mode=pd_ee_delta_pos``). ``vlarl.data.expert_demos.record_demos`` runs them through vlarl's
own ``ManiSkillEnv`` and writes their episodes; ``scripts/train_critic.py`` records critic frames with the
PushCube one. A controller is ``(unwrapped env, phase, rng, speed) -> (action [4] float32 tensor, next phase)``,
starting from phase 0 after each reset.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from simulators.pushing import push_target


def scripted_pushcube_action(u, phase: int, fail_dir: float, rng: np.random.Generator, speed: float):
    """A privileged PushCube controller for pd_ee_delta_pos: hover behind the cube, descend, push +x.

    ``fail_dir`` != 0 turns the push sideways (y) so the episode fails while looking similar.
    Returns (action [4], next phase).
    """
    tcp = u.agent.tcp.pose.p[0].clone()
    cube = u.obj.pose.p[0].clone()
    tgt, phase = push_target(tcp, cube, torch.tensor([1.0, 0.0, 0.0]), phase)
    if phase == 2:  # along +x, written out so the recorded demonstrations stay bit-identical; or sideways
        tgt = tcp.clone()
        if fail_dir == 0.0:
            tgt[0] += 0.05
            tgt[1] = cube[1]
        else:
            tgt[1] += 0.05 * fail_dir
            tgt[0] -= 0.01
        tgt[2] = 0.025
    d = (tgt - tcp) / 0.1 * 1.5 + torch.from_numpy(rng.normal(0, 0.05, 3)).float()
    a = torch.cat([d.clamp(-speed, speed), torch.tensor([-1.0])])
    return a, phase


HOVER_Z = 0.06  # m above the cube centre before descending
CARRY_Z = 0.07  # m, the lowest cube centre while carrying it towards the goal


def scripted_pickcube_action(u, phase: int, rng: np.random.Generator, speed: float):
    """A privileged PickCube controller for pd_ee_delta_pos (gripper 1 = open, -1 = closed): hover above the
    cube with the gripper open, descend, close, then carry the cube to the goal and hold it there.

    Phases: 0 hover, 1 descend, 2-4 close (three steps), 5 carry. The carry aims the TCP at the goal shifted by
    the grasp offset (so an off-centre grasp still brings the cube, not the TCP, to the goal) and keeps the cube
    at least ``CARRY_Z`` high until it is above the goal: dragged along the table it slips out of the fingers.
    Returns (action [4], next phase).
    """
    tcp = u.agent.tcp.pose.p[0].clone()
    cube = u.cube.pose.p[0].clone()
    goal = u.goal_site.pose.p[0].clone()
    grip = 1.0
    if phase == 0:
        tgt = cube.clone()
        tgt[2] += HOVER_Z
        if (tcp[:2] - cube[:2]).norm() < 0.008:
            phase = 1
    if phase == 1:
        tgt = cube.clone()
        speed = min(speed, 0.5)  # slow down: overshooting the cube centre gives an edge grasp
        if float(tcp[2] - cube[2]) < 0.005:
            phase = 2
    if 2 <= phase < 5:
        tgt, grip = cube.clone(), -1.0
        phase += 1
    if phase == 5:
        tgt, grip = tcp + (goal - cube), -1.0
        if (goal[:2] - cube[:2]).norm() > 0.02:
            tgt[2] = tcp[2] + max(float(goal[2]), CARRY_Z) - cube[2]
    d = (tgt - tcp) / 0.1 * 1.5 + torch.from_numpy(rng.normal(0, 0.05, 3)).float()
    return torch.cat([d.clamp(-speed, speed), torch.tensor([grip])]), phase


class Expert(NamedTuple):
    """A scripted expert: the ManiSkill task it solves and its controller (u, phase, rng, speed) ->
    (action [4], next phase), starting from phase 0 after each reset."""

    env_id: str
    act: Callable


def _pushcube_success(u, phase: int, rng: np.random.Generator, speed: float):
    """The PushCube expert pushing towards the goal (``fail_dir`` 0)."""
    return scripted_pushcube_action(u, phase, 0.0, rng, speed)


def _push_to_colour(u, phase: int, rng: np.random.Generator, speed: float):
    """The language task's expert (``simulators/language_tasks.py``; imported here on first use, with ManiSkill)."""
    from simulators.language_tasks import scripted_push_to_colour_action

    return scripted_push_to_colour_action(u, phase, rng, speed)


EXPERTS = {
    "pushcube": Expert("PushCube-v1", _pushcube_success),
    "pushcube_color": Expert("PushCubeToColor-v1", _push_to_colour),
    "pickcube": Expert("PickCube-v1", scripted_pickcube_action),
}


__all__ = ["CARRY_Z", "EXPERTS", "HOVER_Z", "Expert", "scripted_pickcube_action", "scripted_pushcube_action"]
