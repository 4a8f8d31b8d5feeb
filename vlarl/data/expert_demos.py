"""Record the scripted ManiSkill experts' demonstrations as ManiSkill trajectory HDF5 or as a LeRobot v3.0 dataset
(the same writer ``vlarl-collect`` uses, with the same per-episode quality statistics).

``failures`` K (PushCube, .h5) adds K failed episodes: the expert pushing sideways (``fail_dir`` +1 / -1
alternating) until the time limit, interleaved with the successes in an order drawn from ``seed``, as a
mixed-quality dataset (real teleoperation holds failures) for offline RL and its filters. Demonstrations are
recorded through vlarl's own ``ManiSkillEnv`` with the control mode and observation the policy will be trained
on, so SFT sees exactly what RL and evaluation see. The experts themselves are ``simulators.maniskill_experts``.

The .h5 file has ManiSkill's layout (``traj_<i>/actions [L, A]``, ``traj_<i>/obs [L + 1, D]``); the LeRobot
dataset has ``observation.state`` [L, D] (before each action), ``action``, ``next.reward`` and, per episode,
``success``, ``seed`` and ``quality/{length,return,mean_squared_jerk}``. Only successful episodes are written,
unless ``failures``: then each .h5 episode also has ``success [L]`` (bool per step, as ManiSkill's trajectory
files; a successful episode ends True) and the file's attrs ``successes`` / ``failures`` count them.
Seeds must stay below the evaluation seeds (``EVAL_SEED_START``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from simulators.base import HELD_OUT_SEED_START
from simulators.maniskill_experts import EXPERTS, scripted_pushcube_action
from vlarl.data.metrics import episode_quality, mean_squared_jerk

#: the first held-out evaluation seed: demonstration seeds stay below it
EVAL_SEED_START = HELD_OUT_SEED_START
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
                 fps: int = 20, overwrite: bool = False, task: str = "pushcube", failures: int = 0,
                 task_kwargs: dict | None = None) -> dict:
    """Record ``episodes`` successful expert episodes (state obs) into ``out`` (.h5, or a LeRobot v3.0 dataset
    folder with ``fmt="lerobot"``); returns a summary.

    Episodes run with ManiSkill's time limit (``max_steps`` = 0) and stop at the first success, like
    the demonstrations ManiSkill ships. Failed attempts are skipped (their seeds are reported). ``task`` names
    the expert (``EXPERTS``). ``failures`` > 0 (PushCube, .h5 only) also records that many episodes of the
    sideways-pushing expert that fail at the time limit, at positions drawn from ``seed``; an attempt that
    succeeds anyway is skipped. With ``failures`` = 0 the file is the one recorded before failures existed.
    ``task_kwargs`` go to the ManiSkill task's constructor (``env.task_kwargs``), e.g. the language task's
    ``target="flipped"``."""
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
                          max_episode_steps=max_steps, task_kwargs=dict(task_kwargs or {}))
    env = ManiSkillEnv(cfg, num_envs=1)
    u = env.envs[0].unwrapped
    rng = np.random.default_rng(seed)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # which slots are failures: a permutation drawn from its own generator, so failures=0 leaves rng untouched
    wanted = np.ones(total, bool)
    if failures:
        wanted[np.random.default_rng([seed, 1]).permutation(total)[:failures]] = False
    sink = (_LeRobotSink(out, fps, overwrite, env.spec.proprio_dims) if fmt == "lerobot"
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
            episode_instruction = obs["instruction"][0]  # a language task draws it per episode
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
                         episode_instruction, success=ok)
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
        g.attrs["instruction"] = instruction
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

    def __init__(self, out: Path, fps: int, overwrite: bool, proprio_dims: tuple[int, ...] = ()):
        from vlarl.data.lerobot_writer import LeRobotDatasetWriter

        self.w = LeRobotDatasetWriter(out, fps, robot_type="maniskill", overwrite=overwrite, proprio_dims=proprio_dims)

    def add(self, i: int, states, actions, rewards, seed: int, instruction: str, success: bool = True) -> None:
        self.w.add_episode(instruction, state=states[: len(actions)], actions=actions, rewards=rewards, success=success,
                           extra={"seed": seed, **episode_quality(actions, rewards)})

    def close(self) -> None:
        self.w.close()

    def abort(self) -> None:
        self.w.abort()


__all__ = ["EVAL_SEED_START", "FORMATS", "failures_problem", "record_demos"]
