"""ManiSkill task variants where only the instruction says what success is.

``PushCubeToColor-v1``: one cube and two goal discs, one red and one blue, placed diagonally ahead of the cube
(left and right, which colour is where drawn per episode). Each episode also draws the target colour, and the
instruction names it: "push the cube to the red goal" or "push the cube to the blue goal". The observation holds
both goals (red first, then blue) but not which one is the target, so a policy that ignores the instruction
succeeds in about half the episodes at best. Success: the cube's centre within ``goal_radius`` of the named goal
and still on the table. The dense reward is PushCube's, measured towards the named goal and from a push pose
behind the cube along the cube-to-goal direction.

The episode's instruction is read by vlarl's ManiSkill env through ``InstructedTask`` after every reset.
Importing this module registers the task with ManiSkill (``simulators.maniskill_tasks.import_maniskill`` does).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sapien
import torch
from mani_skill.envs.tasks.tabletop.push_cube import PushCubeEnv
from mani_skill.utils.building import actors
from mani_skill.utils.registration import REGISTERED_ENVS, register_env
from mani_skill.utils.structs import Pose

from simulators.base import GroundedTask, InstructedTask
from simulators.pushing import push_target

COLOURS = ("red", "blue")
RGBA = {"red": np.array([200, 30, 30, 255]) / 255, "blue": np.array([30, 60, 220, 255]) / 255}
TASK_ID = "PushCubeToColor-v1"


def instruction_for_colour(colour: str) -> str:
    return f"push the cube to the {colour} goal"


INSTRUCTIONS = tuple(instruction_for_colour(c) for c in COLOURS)
#: ``target`` modes: the goal each seed draws, or the other one in the same scene (``PushCubeToColorEnv``)
TARGETS = ("drawn", "flipped")


class PushCubeToColorEnv(PushCubeEnv):
    """PushCube with a red and a blue goal; the instruction names the one that counts (see the module doc)."""

    goal_radius = 0.05
    goal_ahead = 0.12  # m in +x from the cube to both goals
    goal_side = 0.09  # m in y from the cube to each goal (the goals are 0.18 m apart, 0.1 m of disc)

    def __init__(self, *args: Any, instruction: str = "named", target: str = "drawn", **kwargs: Any):
        """``instruction``: "named" reports the instruction naming the goal that counts; "other" reports the one
        naming the other goal (success still counts at the drawn goal): does a policy follow the words?
        ``target``: "drawn" counts the goal the episode's seed draws; "flipped" counts the other one, in the same
        scene (cube, goals and sides as "drawn" places them for that seed), so the words and the goal that counts
        both change while the frame stays the same: recorded beside "drawn" on the same seeds, the two make
        demonstration pairs that differ only in their words and what they do (``paired_words``)."""
        if instruction not in ("named", "other"):
            raise ValueError(f"instruction='{instruction}' is not a mode of {TASK_ID}; use 'named' or 'other'")
        if target not in TARGETS:
            raise ValueError(f"target='{target}' is not a mode of {TASK_ID}; use 'drawn' or 'flipped'")
        self.instruction_mode = instruction
        self.target_mode = target
        super().__init__(*args, **kwargs)

    def _load_scene(self, options: dict) -> None:
        super()._load_scene(options)  # table, cube, and PushCube's own goal disc (kept out of sight below)
        self.goals = {
            c: actors.build_cylinder(
                self.scene, radius=self.goal_radius, half_length=1e-4, color=RGBA[c], name=f"goal_{c}",
                body_type="kinematic", add_collision=False, initial_pose=sapien.Pose(p=[0, 0, 1e-3]),
            )
            for c in COLOURS
        }

    def _initialize_episode(self, env_idx: torch.Tensor, options: dict) -> None:
        super()._initialize_episode(env_idx, options)
        with torch.device(self.device):
            b = len(env_idx)
            hidden = self.goal_region.pose.p[env_idx].clone()
            hidden[..., 2] = -1.0  # PushCube's goal region, under the table: its success is not this task's
            self.goal_region.set_pose(Pose.create_from_pq(p=hidden, q=self.goal_region.pose.q[env_idx]))
            cube = self.obj.pose.p[env_idx]
            red_left = torch.rand(b) < 0.5
            side = torch.where(red_left, 1.0, -1.0)
            upright = torch.tensor([0.7071068, 0.0, 0.7071068, 0.0]).expand(b, 4)  # cylinder axis along z
            for colour, sign in (("red", side), ("blue", -side)):
                p = cube.clone()
                p[..., 0] += self.goal_ahead
                p[..., 1] += sign * self.goal_side
                p[..., 2] = 1e-3
                self.goals[colour].set_pose(Pose.create_from_pq(p=p, q=upright))
            if not hasattr(self, "target_is_red"):
                self.target_is_red = torch.zeros(self.num_envs, dtype=torch.bool)
            drawn = torch.rand(b) < 0.5
            self.target_is_red[env_idx] = ~drawn if self.target_mode == "flipped" else drawn

    def target_goal(self) -> torch.Tensor:
        """The named goal's position per env: [num_envs, 3]."""
        red, blue = self.goals["red"].pose.p, self.goals["blue"].pose.p
        return torch.where(self.target_is_red.to(red.device)[:, None], red, blue)

    def other_goal(self) -> torch.Tensor:
        """The goal the instruction does not name, [num_envs, 3] (for failing demonstrations and tests)."""
        red, blue = self.goals["red"].pose.p, self.goals["blue"].pose.p
        return torch.where(self.target_is_red.to(red.device)[:, None], blue, red)

    def grounding_target(self) -> torch.Tensor:
        """Where the named goal is from the cube, in the table's plane: [num_envs, 2] (``GroundedTask``). At a reset
        it is (0.12, +-0.09): the sign is which side the words name, the one bit a policy must bind to them."""
        return (self.target_goal() - self.obj.pose.p)[..., :2]

    def episode_instructions(self) -> list[str]:
        flip = self.instruction_mode == "other"
        return [INSTRUCTIONS[0] if bool(r) != flip else INSTRUCTIONS[1] for r in self.target_is_red]

    def evaluate(self) -> dict[str, torch.Tensor]:
        dist = torch.linalg.norm(self.obj.pose.p[..., :2] - self.target_goal()[..., :2], axis=1)
        on_table = self.obj.pose.p[..., 2] < self.cube_half_size + 5e-3
        return {"success": (dist < self.goal_radius) & on_table}

    def _get_obs_extra(self, info: dict) -> dict[str, torch.Tensor]:
        obs = dict(tcp_pose=self.agent.tcp.pose.raw_pose)
        if self.obs_mode_struct.use_state:
            obs.update(red_goal_pos=self.goals["red"].pose.p, blue_goal_pos=self.goals["blue"].pose.p,
                       obj_pose=self.obj.pose.raw_pose)
        return obs

    def push_pose(self) -> torch.Tensor:
        """Where the TCP pushes from: behind the cube, opposite the named goal, [num_envs, 3]."""
        cube = self.obj.pose.p
        d = self.target_goal() - cube
        d[..., 2] = 0
        d = d / torch.linalg.norm(d, axis=1, keepdim=True).clamp_min(1e-6)
        return cube - d * (self.cube_half_size + 0.005)

    def compute_dense_reward(self, obs: Any, action: torch.Tensor, info: dict) -> torch.Tensor:
        to_push = torch.linalg.norm(self.push_pose() - self.agent.tcp.pose.p, axis=1)
        reward = 1 - torch.tanh(5 * to_push)
        reached = to_push < 0.01
        to_goal = torch.linalg.norm(self.obj.pose.p[..., :2] - self.target_goal()[..., :2], axis=1)
        place = 1 - torch.tanh(5 * to_goal)
        z_reward = 1 - torch.tanh(5 * torch.abs(self.obj.pose.p[..., 2] - self.cube_half_size))
        reward = reward + place * reached + place * z_reward * reached
        reward[info["success"]] = 4
        return reward


if TASK_ID not in REGISTERED_ENVS:  # a second import (another module path) must not re-register
    register_env(TASK_ID, max_episode_steps=50)(PushCubeToColorEnv)


def scripted_push_to_colour_action(u: Any, phase: int, rng: np.random.Generator, speed: float,
                                   to_named: bool = True):
    """A privileged controller for ``PushCubeToColor-v1`` (pd_ee_delta_pos): hover above the push pose behind
    the cube, descend, then push along the cube-to-goal direction, towards the named goal (``to_named``) or
    the other one (an episode that looks competent and fails). Returns (action [4], next phase)."""
    tcp = u.agent.tcp.pose.p[0].clone()
    cube = u.obj.pose.p[0].clone()
    goal = (u.target_goal() if to_named else u.other_goal())[0].clone()
    d = goal - cube
    d[2] = 0
    tgt, phase = push_target(tcp, cube, d / d.norm().clamp_min(1e-6), phase)
    step = (tgt - tcp) / 0.1 * 1.5 + torch.from_numpy(rng.normal(0, 0.05, 3)).float()
    return torch.cat([step.clamp(-speed, speed), torch.tensor([-1.0])]), phase


__all__ = ["COLOURS", "INSTRUCTIONS", "TARGETS", "TASK_ID", "GroundedTask", "InstructedTask", "PushCubeToColorEnv",
           "instruction_for_colour", "scripted_push_to_colour_action"]
