"""Scripted ManiSkill3 experts (PushCube-v1, PickCube-v1) and a recorder of their demonstrations as ManiSkill
trajectory HDF5 or as a LeRobot v3.0 dataset (the same writer ``vlarl-collect`` uses, with the same per-episode
quality statistics). ``--failures K`` (PushCube, .h5) adds K failed episodes: the expert pushing sideways
(``fail_dir`` +1 / -1 alternating) until the time limit, interleaved with the successes in an order drawn from
``--seed``, as a mixed-quality dataset (real teleoperation holds failures) for offline RL and its filters.

The experts read privileged simulator state (TCP, cube and goal poses), so they are demonstrators, not
policies. Demonstrations are recorded through vlarl's own ``ManiSkillEnv`` with the control mode and
observation the VLA policy will be trained on, so SFT sees exactly what RL and evaluation see:

    python scripts/pushcube_expert.py --out data/demos/pushcube.h5 --episodes 20 --seed 0
    python scripts/pushcube_expert.py --out data/demos/pushcube_lerobot --format lerobot --episodes 20
    python scripts/pushcube_expert.py --task pickcube --out outputs/demos/pickcube_20.h5 --episodes 20 --seed 0
    python scripts/pushcube_expert.py --out outputs/demos/pushcube_mixed.h5 --episodes 15 --failures 15

The .h5 file has ManiSkill's layout (``traj_<i>/actions [L, A]``, ``traj_<i>/obs [L + 1, D]``); the LeRobot
dataset has ``observation.state`` [L, D] (before each action), ``action``, ``next.reward`` and, per episode,
``success``, ``seed`` and ``quality/{length,return,mean_squared_jerk}``. Only successful episodes are written,
unless ``--failures``: then each .h5 episode also has ``success [L]`` (bool per step, as ManiSkill's trajectory
files; a successful episode ends True) and the file's attrs ``successes`` / ``failures`` count them.
Seeds must stay below the evaluation seeds (1,000,000+).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EVAL_SEED_START = 1_000_000

from vlarl.collect import episode_quality, mean_squared_jerk  # noqa: E402  (after the sys.path line above)


def scripted_pushcube_action(u, phase: int, fail_dir: float, rng: np.random.Generator, speed: float):
    """A privileged PushCube controller for pd_ee_delta_pos: hover behind the cube, descend, push +x.

    ``fail_dir`` != 0 turns the push sideways (y) so the episode fails while looking similar.
    Returns (action [4], next phase).
    """
    tcp = u.agent.tcp.pose.p[0].clone()
    cube = u.obj.pose.p[0].clone()
    behind = cube.clone()
    behind[0] -= 0.06
    behind[2] = 0.025
    if phase == 0:
        tgt = behind.clone()
        tgt[2] = 0.1
        if (tcp[:2] - behind[:2]).norm() < 0.012:
            phase = 1
    if phase == 1:
        tgt = behind.clone()
        if abs(float(tcp[2] - behind[2])) < 0.01:
            phase = 2
    if phase == 2:
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


EXPERTS = {
    "pushcube": Expert("PushCube-v1", _pushcube_success),
    "pickcube": Expert("PickCube-v1", scripted_pickcube_action),
}
FORMATS = ("h5", "lerobot")


def failures_problem(task: str, failures: int, fmt: str = "h5") -> str | None:
    """Why ``failures`` failed episodes cannot be recorded for ``task`` in ``fmt`` (one line naming the fix), or None."""
    if failures < 0:
        return f"--failures {failures} must be >= 0"
    if failures and task != "pushcube":
        return f"--failures {failures}: only the PushCube expert has a failing variant; use --task pushcube"
    if failures and fmt != "h5":
        return (f"--failures {failures} needs --format h5: a LeRobot dataset keeps no final observation for a "
                f"failed episode to bootstrap from")
    return None


def record_demos(out: str | Path, episodes: int, seed: int = 0, control_mode: str = "pd_ee_delta_pos",
                 max_steps: int = 0, speed: tuple[float, float] = (0.4, 0.8), log=print, fmt: str = "h5",
                 fps: int = 20, overwrite: bool = False, task: str = "pushcube", failures: int = 0) -> dict:
    """Record ``episodes`` successful expert episodes (state obs) into ``out`` (.h5, or a LeRobot v3.0 dataset
    folder with ``fmt="lerobot"``); returns a summary.

    Episodes run with ManiSkill's time limit (``max_steps`` = 0) and stop at the first success, like
    the demonstrations ManiSkill ships. Failed attempts are skipped (their seeds are reported). ``task`` names
    the expert (``EXPERTS``). ``failures`` > 0 (PushCube, .h5 only) also records that many episodes of the
    sideways-pushing expert that fail at the time limit, at positions drawn from ``seed``; an attempt that
    succeeds anyway is skipped. With ``failures`` = 0 the file is the one recorded before failures existed."""
    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv

    if fmt not in FORMATS:
        raise ValueError(f"fmt='{fmt}' is unknown; choose one of {list(FORMATS)}")
    if task not in EXPERTS:
        raise ValueError(f"task='{task}' has no scripted expert; choose one of {list(EXPERTS)}")
    expert = EXPERTS[task]
    problem = failures_problem(task, failures, fmt)
    if problem:
        raise ValueError(problem)

    if control_mode != "pd_ee_delta_pos":
        raise ValueError(f"control_mode='{control_mode}': the scripted experts drive the end effector; "
                         f"use env.control_mode=pd_ee_delta_pos")
    total = episodes + failures
    if seed + 4 * total >= EVAL_SEED_START:
        raise ValueError(f"demonstration seeds from {seed} would reach the evaluation seeds "
                         f"({EVAL_SEED_START}+); choose a smaller --seed")
    cfg = ManiSkillConfig(task=expert.env_id, control_mode=control_mode, obs_mode="state", reward_mode="sparse",
                          max_episode_steps=max_steps)
    env = ManiSkillEnv(cfg, num_envs=1)
    u = env.envs[0].unwrapped
    rng = np.random.default_rng(seed)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # which slots are failures: a permutation drawn from its own generator, so failures=0 leaves rng untouched
    wanted = np.ones(total, bool)
    if failures:
        wanted[np.random.default_rng([seed, 1]).permutation(total)[:failures]] = False
    sink = (_LeRobotSink(out, fps, overwrite) if fmt == "lerobot"
            else _H5Sink(out, expert.env_id, control_mode, flags=failures > 0))
    kept, failed, s, t0, lengths, jerks, n_fail, skipped_ok = 0, [], seed, time.time(), [], [], 0, []
    fail_steps = 0
    try:
        while kept < total:
            want_ok = bool(wanted[kept])
            if s >= seed + 4 * total:
                raise RuntimeError(f"the expert gave {kept} of the wanted episodes in {s - seed} attempts; "
                                   f"check the env config")
            obs = env.reset(seed=[s])
            states, actions, rewards, phase, ok = [obs["state"][0].numpy()], [], [], 0, False
            v = float(rng.uniform(*speed))
            fail_dir = 0.0 if want_ok else (1.0 if n_fail % 2 == 0 else -1.0)
            while True:
                if want_ok:
                    a, phase = expert.act(u, phase, rng, v)
                else:
                    a, phase = scripted_pushcube_action(u, phase, fail_dir, rng, v)
                res = env.chunk_step(a.reshape(1, 1, -1))
                actions.append(a.numpy())
                rewards.append(float(res.rewards[0, 0]))
                last = res.final_obs if res.final_obs is not None else res.obs
                states.append(last["state"][0].numpy())
                if bool(res.done.any()):
                    ok = bool(res.episode["success_once"][0] > 0)
                    break
            if ok == want_ok:
                acts = np.stack(actions).astype(np.float32)
                sink.add(kept, np.stack(states).astype(np.float32), acts, np.asarray(rewards, np.float32), s,
                         env.instruction, success=ok)
                if ok:
                    lengths.append(len(actions))
                    jerks.append(mean_squared_jerk(acts))
                else:
                    n_fail += 1
                    fail_steps += len(actions)
                kept += 1
            else:
                (failed if want_ok else skipped_ok).append(s)
            s += 1
        sink.close()
    except BaseException:
        sink.abort()
        raise
    finally:
        env.close()
    attempts = s - seed - n_fail - len(skipped_ok)  # attempts of the successful expert
    summary = {"task": expert.env_id, "episodes": episodes, "failed_seeds": failed, "seeds": [seed, s - 1],
               "success_rate": episodes / max(1, attempts), "env_steps": int(sum(lengths)),
               "mean_len": float(np.mean(lengths)) if lengths else 0.0,
               "mean_squared_jerk": float(np.mean(jerks)) if jerks else 0.0, "failures": n_fail,
               "failed_env_steps": fail_steps,
               "failed_order": [int(i) for i in np.flatnonzero(~wanted)], "failures_that_succeeded": skipped_ok,
               "control_mode": control_mode, "instruction": env.instruction, "format": fmt,
               "wall_s": time.time() - t0}
    log(f"[demos] {episodes} successful {expert.env_id} expert episodes"
        + (f" + {n_fail} failed ones (sideways push, at {summary['failed_order']})" if failures else "")
        + f" ({len(failed)} failed attempts skipped, success rate "
        f"{summary['success_rate']:.2f}, mean length {summary['mean_len']:.1f}) -> {out} "
        f"({summary['env_steps']} steps, {summary['wall_s']:.0f}s)")
    return summary


class _H5Sink:
    """ManiSkill trajectory layout: obs [L + 1, D] (the final observation kept), actions [L, A]."""

    def __init__(self, out: Path, env_id: str, control_mode: str, flags: bool = False):
        import h5py

        self.flags = flags  # write success [L] per episode and the counts (files that may hold failures)
        self.counts = {"successes": 0, "failures": 0}
        self.f = h5py.File(out, "w")
        self.f.attrs["env_kwargs"] = json.dumps({"env_id": env_id, "control_mode": control_mode,
                                                 "obs_mode": "state"})

    def add(self, i: int, states, actions, rewards, seed: int, instruction: str, success: bool = True) -> None:
        g = self.f.create_group(f"traj_{i}")
        g.create_dataset("actions", data=actions)
        g.create_dataset("obs", data=states)
        if self.flags:  # as ManiSkill's info["success"] per step: sparse reward 1 is the success step
            flags = np.zeros(len(actions), bool)
            flags[-1] = success
            g.create_dataset("success", data=flags)
        g.attrs["seed"] = seed
        self.counts["successes" if success else "failures"] += 1

    def close(self) -> None:
        if self.flags:
            self.f.attrs.update(self.counts)
        self.f.close()

    def abort(self) -> None:
        self.f.close()


class _LeRobotSink:
    """LeRobot v3.0 through vlarl's writer: the state before each action, the same quality columns as
    ``vlarl-collect`` writes."""

    def __init__(self, out: Path, fps: int, overwrite: bool):
        from policies.datasets.lerobot_writer import LeRobotDatasetWriter

        self.w = LeRobotDatasetWriter(out, fps, robot_type="maniskill", overwrite=overwrite)

    def add(self, i: int, states, actions, rewards, seed: int, instruction: str, success: bool = True) -> None:
        self.w.add_episode(instruction, state=states[: len(actions)], actions=actions, rewards=rewards, success=success,
                           extra={"seed": seed, **episode_quality(actions, rewards)})

    def close(self) -> None:
        self.w.close()

    def abort(self) -> None:
        self.w.abort()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--task", default="pushcube", choices=sorted(EXPERTS), help="which scripted expert")
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--failures", type=int, default=0,
                   help="also record this many failed episodes (PushCube, .h5), interleaved with the successes")
    p.add_argument("--format", default="h5", choices=FORMATS, help="ManiSkill .h5 or a LeRobot v3.0 dataset folder")
    p.add_argument("--overwrite", action="store_true", help="replace an existing LeRobot dataset at --out")
    args = p.parse_args(argv)
    from vlarl import system_env

    problem = failures_problem(args.task, args.failures, args.format)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    system_env.apply()
    torch.set_num_threads(1)
    print(json.dumps(record_demos(args.out, args.episodes, args.seed, fmt=args.format, overwrite=args.overwrite,
                                  task=args.task, failures=args.failures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
