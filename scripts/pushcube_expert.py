"""A scripted PushCube-v1 expert and a recorder of its demonstrations as ManiSkill trajectory HDF5.

The expert reads privileged simulator state (TCP and cube poses), so it is a demonstrator, not a
policy. Demonstrations are recorded through vlarl's own ``ManiSkillEnv`` with the control mode and
observation the VLA policy will be trained on, so SFT sees exactly what RL and evaluation see:

    python scripts/pushcube_expert.py --out data/demos/pushcube.h5 --episodes 20 --seed 0

The file has ManiSkill's layout (``traj_<i>/actions [L, A]``, ``traj_<i>/obs [L + 1, D]``), and only
successful episodes are written. Seeds must stay below the evaluation seeds (1,000,000+).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EVAL_SEED_START = 1_000_000


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


def record_demos(out: str | Path, episodes: int, seed: int = 0, control_mode: str = "pd_ee_delta_pos",
                 max_steps: int = 0, speed: tuple[float, float] = (0.4, 0.8), log=print) -> dict:
    """Record ``episodes`` successful expert episodes (state obs) into ``out`` (.h5); returns a summary.

    Episodes run with ManiSkill's time limit (``max_steps`` = 0) and stop at the first success, like
    the demonstrations ManiSkill ships. Failed attempts are skipped (their seeds are reported)."""
    import h5py

    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv

    if control_mode != "pd_ee_delta_pos":
        raise ValueError(f"control_mode='{control_mode}': the PushCube expert drives the end effector; "
                         f"use env.control_mode=pd_ee_delta_pos")
    if seed + 4 * episodes >= EVAL_SEED_START:
        raise ValueError(f"demonstration seeds from {seed} would reach the evaluation seeds "
                         f"({EVAL_SEED_START}+); choose a smaller --seed")
    cfg = ManiSkillConfig(task="PushCube-v1", control_mode=control_mode, obs_mode="state", reward_mode="sparse",
                          max_episode_steps=max_steps)
    env = ManiSkillEnv(cfg, num_envs=1)
    u = env.envs[0].unwrapped
    rng = np.random.default_rng(seed)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    kept, failed, s, t0, lengths = 0, [], seed, time.time(), []
    with h5py.File(out, "w") as f:
        while kept < episodes:
            if s >= seed + 4 * episodes:
                raise RuntimeError(f"the expert succeeded in only {kept} of {s - seed} episodes; check the env config")
            obs = env.reset(seed=[s])
            states, actions, phase, ok = [obs["state"][0].numpy()], [], 0, False
            v = float(rng.uniform(*speed))
            while True:
                a, phase = scripted_pushcube_action(u, phase, 0.0, rng, v)
                res = env.chunk_step(a.reshape(1, 1, -1))
                actions.append(a.numpy())
                last = res.final_obs if res.final_obs is not None else res.obs
                states.append(last["state"][0].numpy())
                if bool(res.done.any()):
                    ok = bool(res.episode["success_once"][0] > 0)
                    break
            if ok:
                g = f.create_group(f"traj_{kept}")
                g.create_dataset("actions", data=np.stack(actions).astype(np.float32))
                g.create_dataset("obs", data=np.stack(states).astype(np.float32))
                g.attrs["seed"] = s
                lengths.append(len(actions))
                kept += 1
            else:
                failed.append(s)
            s += 1
        summary = {"episodes": kept, "failed_seeds": failed, "seeds": [seed, s - 1], "env_steps": int(sum(lengths)),
                   "mean_len": float(np.mean(lengths)), "control_mode": control_mode, "instruction": env.instruction,
                   "wall_s": time.time() - t0}
        f.attrs["env_kwargs"] = json.dumps({"env_id": "PushCube-v1", "control_mode": control_mode, "obs_mode": "state"})
    env.close()
    log(f"[demos] {kept} successful expert episodes ({len(failed)} failed) -> {out} "
        f"({summary['env_steps']} steps, {summary['wall_s']:.0f}s)")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from vlarl import system_env

    system_env.apply()
    torch.set_num_threads(1)
    print(json.dumps(record_demos(args.out, args.episodes, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
