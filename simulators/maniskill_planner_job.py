"""Record ManiSkill's own motion-planning solutions for one task (``pd_joint_pos``, no observations).

This file runs in the planner's environment, not vlarl's: ManiSkill 3.0.1's solutions need ``mplib==0.1.1``,
which crashes with numpy 2 (vlarl's environment), so ``simulators.maniskill_demos`` starts it with the planner's
interpreter. It therefore imports only gymnasium, numpy and mani_skill, never vlarl. The recorded file is a
ManiSkill trajectory (``.h5`` + ``.json``) that ManiSkill's own ``replay_trajectory`` converts afterwards to the
control and observation mode a policy trains on.

    python maniskill_planner_job.py --task PushCube-v1 --episodes 20 --seed 0 --out-dir DIR --name raw

Prints one JSON line last: ``{"file": ..., "successes": N, "attempts": M, "first_seed": s, "seeds": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import sys


def _solutions() -> dict:
    from mani_skill.examples.motionplanning.panda import solutions as s

    return {
        "PushCube-v1": s.solvePushCube, "PullCube-v1": s.solvePullCube, "PickCube-v1": s.solvePickCube,
        "StackCube-v1": s.solveStackCube, "PegInsertionSide-v1": s.solvePegInsertionSide,
        "PlugCharger-v1": s.solvePlugCharger, "PlaceSphere-v1": s.solvePlaceSphere,
        "LiftPegUpright-v1": s.solveLiftPegUpright, "PullCubeTool-v1": s.solvePullCubeTool,
        "DrawTriangle-v1": s.solveDrawTriangle, "StackPyramid-v1": s.solveStackPyramid,
    }


def _scale_planner_limits(speed: float) -> None:
    """Make every solution's planner move ``speed`` x faster: its joint velocity and acceleration limits (ManiSkill
    sets them to 0.9 of the robot's own in ``BaseMotionPlanningSolver.setup_planner``) scaled by ``speed``. The
    solutions build their planner themselves, so the scaling wraps the one method that sets the limits."""
    import numpy as np
    from mani_skill.examples.motionplanning.base_motionplanner.motionplanner import BaseMotionPlanningSolver

    own = BaseMotionPlanningSolver.setup_planner

    def setup_planner(self):
        planner = own(self)
        planner.joint_vel_limits = np.asarray(planner.joint_vel_limits) * speed
        planner.joint_acc_limits = np.asarray(planner.joint_acc_limits) * speed
        return planner

    BaseMotionPlanningSolver.setup_planner = setup_planner


def _settle(env, steps: int) -> bool:
    """Repeat the solution's last command (recorded, as every step) ``steps`` times; whether the task read
    success at one of them. PlaceSphere's solution ends the step it opens the gripper, with the dropped sphere
    still rolling in the bin: at ManiSkill's own pace 8 of 12 seeds failed only because the sphere was not yet
    static at that step, and every one of them succeeded 2-8 steps later holding the same command. The steps
    are held past the success too: ManiSkill's replay into another control mode reaches the same state a few
    steps later and judges its conversion at the episode's last step (episodes are cut at their first success
    afterwards, ``maniskill_demos.end_at_first_success``)."""
    last = env._trajectory_buffer.action[-1]  # [num_envs (1), action dim]: the solution's last action
    solved = False
    for _ in range(steps):
        *_, info = env.step(last)
        solved = solved or bool(info["success"].item())
    return solved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", required=True)
    ap.add_argument("--episodes", type=int, required=True, help="successful episodes to record")
    ap.add_argument("--seed", type=int, default=0, help="first reset seed; later attempts take the next seeds")
    ap.add_argument("--max-attempts", type=int, default=0, help="give up after this many seeds (0 = 3x episodes)")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--name", default="planner")
    ap.add_argument("--speed", type=float, default=1.0,
                    help="scale the planner's joint velocity and acceleration limits (1 = ManiSkill's own)")
    ap.add_argument("--settle", type=int, default=0,
                    help="hold the solution's last command this many steps; success at one of them counts")
    args = ap.parse_args(argv)
    if args.speed != 1.0:
        _scale_planner_limits(args.speed)

    import gymnasium as gym
    import mani_skill.envs  # noqa: F401 - registers the tasks
    from mani_skill.utils.wrappers.record import RecordEpisode

    solve = _solutions()[args.task]
    env = gym.make(args.task, obs_mode="none", control_mode="pd_joint_pos", render_mode="rgb_array",
                   sim_backend="cpu")
    env = RecordEpisode(env, output_dir=args.out_dir, trajectory_name=args.name, save_video=False,
                        source_type="motionplanning", record_reward=False, save_on_reset=False,
                        source_desc="ManiSkill's motion-planning solution, recorded by vlarl-demos")
    max_attempts = args.max_attempts or 3 * args.episodes
    seeds, attempts, seed = [], 0, args.seed
    while len(seeds) < args.episodes and attempts < max_attempts:
        attempts += 1
        try:
            res = solve(env, seed=seed, debug=False, vis=False)
        except Exception as e:  # the solutions raise on unreachable poses; such a seed counts as a failure
            print(f"seed {seed}: planning failed ({type(e).__name__}: {e})", file=sys.stderr)
            res = -1
        ok = res != -1 and bool(res[-1]["success"].item())
        if res != -1 and args.settle:
            ok = _settle(env, args.settle) or ok
        env.flush_trajectory(save=ok)
        if ok:
            seeds.append(seed)
        print(f"seed {seed}: {'success' if ok else 'failure'} ({len(seeds)}/{args.episodes})", file=sys.stderr)
        seed += 1
    h5 = env._h5_file.filename
    env.close()
    print(json.dumps({"file": h5, "successes": len(seeds), "attempts": attempts, "first_seed": args.seed,
                      "seeds": seeds}))
    return 0 if seeds else 1


if __name__ == "__main__":
    sys.exit(main())
