"""Re-time ManiSkill's motion-planner demonstrations into the few, large end-effector steps RLPD learns from.

The planner's converted episodes (``pd_ee_delta_pos``) follow a good path at a poor pace for RL: two smooth
accelerate-decelerate motions, still steps while the gripper closes, mean actions a fifth of the scripted
expert's, and the success 36-43 steps away (PushCube, docs/tasks.md "Why planner demonstrations fail RLPD").
Re-timing keeps the planner as the source of the path and changes only how it is followed:

1. ``tcp_path``: the converted actions replayed in vlarl's env from the episode's seed give the TCP
   (end-effector) position after every step and the gripper command of every step.
2. ``waypoints``: the path subsampled every ``spacing`` metres of TCP travel (still steps add no travel, so they
   drop out), plus a waypoint wherever the gripper command changes, held there ``grip_hold`` steps so the
   fingers close or open in place.
3. ``follow``: closed loop in vlarl's env from the same seed: action = ``gain`` x (waypoint - TCP) / the
   controller's largest step, scaled into [-1, 1] keeping its direction; the next waypoint is taken once the TCP
   is within ``reach`` metres. The episode ends where the env ends it (success, or the task's time limit).

Per task (``TASK_CONFIG``): PullCube's last waypoint lies 2 cm past the path's end, where the cube only just
reached the goal radius; StackCube and PlaceSphere open the gripper there, which their success needs. Only the re-timed episodes that succeed are kept, each ending at its first success. With the defaults a PushCube
episode takes 8-11 steps with mean actions 0.4-0.6 per axis (the scripted expert: 11-14 steps, 0.4-0.6).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from simulators.base import EnvError
from simulators.maniskill_traj_file import SolvedEpisode, write_episodes

#: the one control mode a waypoint follower can drive: end-effector position deltas (+ the gripper)
RETIME_CONTROL = "pd_ee_delta_pos"


@dataclass(frozen=True)
class RetimeConfig:
    """How the planner's TCP path is followed (defaults measured on PushCube, docs/tasks.md)."""

    spacing: float = 0.06  # metres of TCP travel between waypoints
    gain: float = 1.5  # action = gain * (waypoint - tcp) / the controller's largest step (then scaled into [-1, 1])
    reach: float = 0.03  # metres: a waypoint between corners this close counts as reached
    corner_tolerance: float = 0.01  # metres the corner-to-corner polyline may leave the path (``corners``)
    corner_reach: float = 0.01  # metres: how close the TCP must come to a corner before turning
    grip_hold: int = 3  # steps spent in place where the gripper command changes
    overshoot: float = 0.0  # metres the last waypoint is moved on along the path's last direction (``extend``)
    release: bool = False  # open the gripper at the last waypoint (``grip_hold`` steps, then kept open)


#: per-task settings where the defaults fall short (docs/tasks.md): PullCube's path ends with the cube exactly at
#: the goal radius, so 14 of 23 re-timed episodes stopped a few millimetres short; 2 cm on made it 20 of 23. The
#: same 2 cm lost a PickCube episode (the cube carried past the goal) and changed nothing on PushCube.
#: StackCube's path ends at the first success, which needs the gripper open, and the planner's ended with the
#: command still closed (the grip had already slackened); followed, the fingers kept squeezing the cube: 7 of 10
#: kept, 9 of 10 with an opening at the last waypoint (``release``). PlaceSphere's success too needs the sphere let
#: go (and still, in the bin): with the opening, 21 of 22 converted episodes kept (23-34 steps; docs/tasks.md).
TASK_CONFIG = {"PullCube-v1": RetimeConfig(overshoot=0.02), "StackCube-v1": RetimeConfig(release=True),
               "PlaceSphere-v1": RetimeConfig(release=True)}


def config_for(task: str) -> RetimeConfig:
    """The follower's settings for ``task``: ``TASK_CONFIG``'s, else the defaults."""
    return TASK_CONFIG.get(task, RetimeConfig())


@dataclass(frozen=True)
class Waypoint:
    """A point of the planner's TCP path: ``pos`` [3] (m, world frame), the gripper command on the way there,
    the distance at which it counts as reached, and ``hold`` steps in place on arrival with ``hold_grip`` (a
    gripper change)."""

    pos: np.ndarray
    grip: float
    reach: float
    hold: int = 0
    hold_grip: float = 0.0


@dataclass
class RetimedEpisode:
    """One closed-loop episode: ``states`` [L + 1, D] (the final observation last), ``actions`` [L, A],
    ``rewards`` [L], ``success`` [L] per step, the seed it ran from and the raw episode's length."""

    seed: int
    states: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    success: np.ndarray
    raw_length: int

    @property
    def solved(self) -> bool:
        return bool(self.success.any())


def retime_env(env_cfg: Any, max_steps: int):
    """vlarl's env for ``env_cfg``'s task in ``pd_ee_delta_pos``/state with a sparse reward and a ``max_steps``
    time limit (long enough for the raw replay); returns (env, the unwrapped ManiSkill env)."""
    from simulators.registry import make_env

    cfg = copy.deepcopy(env_cfg)
    cfg.control_mode, cfg.obs_mode, cfg.reward_mode, cfg.max_episode_steps = RETIME_CONTROL, "state", "sparse", max_steps
    env = make_env(cfg, num_envs=1)
    return env, env.envs[0].unwrapped


def controller_step(u: Any) -> float:
    """The arm controller's largest position step per action (m): ``pd_ee_delta_pos`` maps action 1 to it."""
    arm = u.agent.controller.controllers["arm"]
    return float(np.max(np.abs([arm.config.pos_lower, arm.config.pos_upper])))


def tcp_path(env: Any, u: Any, seed: int, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Replay ``actions`` [L, A] from ``seed``: the TCP position before the first and after every step
    ([L' + 1, 3]) and the gripper command of every step ([L']); L' < L when the env ends the episode earlier
    (its last step, after which the env has already reset, is left out)."""
    env.reset(seed=[seed])
    tcp = [u.agent.tcp.pose.p[0].numpy().copy()]
    for a in actions:
        if bool(env.chunk_step(a[None, None, :]).done[0]):
            break
        tcp.append(u.agent.tcp.pose.p[0].numpy().copy())
    return np.stack(tcp), np.asarray(actions[: len(tcp) - 1, -1], np.float32)


def corners(path: np.ndarray, tolerance: float) -> list[int]:
    """Indices of ``path`` [N, 3] that a polyline through them keeps within ``tolerance`` metres of every point
    (Ramer-Douglas-Peucker): the path's ends and its corners, e.g. where a descent behind the cube turns into
    the push. Cutting such a corner drives the TCP into the cube."""
    if len(path) < 3:
        return list(range(len(path)))
    a, b = path[0], path[-1]
    ab = b - a
    t = np.clip((path - a) @ ab / max(float(ab @ ab), 1e-12), 0.0, 1.0)
    dist = np.linalg.norm(path - (a + t[:, None] * ab), axis=1)
    i = int(np.argmax(dist))
    if dist[i] <= tolerance:
        return [0, len(path) - 1]
    left, right = corners(path[: i + 1], tolerance), corners(path[i:], tolerance)
    return left + [i + j for j in right[1:]]


def waypoints(tcp: np.ndarray, grip: np.ndarray, cfg: RetimeConfig) -> list[Waypoint]:
    """``tcp`` [L + 1, 3] and ``grip`` [L] -> the waypoints: the path's corners (``corners``) and the points
    where the gripper command changes (held there ``grip_hold`` steps), both to be reached within
    ``cfg.corner_reach``, and between them points ``cfg.spacing`` apart along the path, the path's end last
    (moved ``cfg.overshoot`` on along the path's last direction, ``extend``)."""
    change = {i for i in range(1, len(grip)) if np.sign(grip[i]) != np.sign(grip[i - 1])}
    keys = set(corners(tcp, cfg.corner_tolerance)) | change
    out: list[Waypoint] = []
    last = tcp[0]
    for i in range(1, len(tcp)):
        g = float(grip[min(i, len(grip)) - 1])  # the command that moved the TCP to tcp[i]
        if i in change:
            out.append(Waypoint(tcp[i], float(grip[i - 1]), cfg.corner_reach, cfg.grip_hold, float(grip[i])))
        elif i in keys or i == len(tcp) - 1:
            out.append(Waypoint(tcp[i], g, cfg.corner_reach))
        elif np.linalg.norm(tcp[i] - last) >= cfg.spacing:
            out.append(Waypoint(tcp[i], g, cfg.reach))
        else:
            continue
        last = tcp[i]
    out = out or [Waypoint(tcp[-1], float(grip[-1]) if len(grip) else 1.0, cfg.corner_reach)]
    if cfg.overshoot > 0:
        out[-1] = replace(out[-1], pos=extend(tcp, cfg.overshoot))
    if cfg.release:
        out[-1] = replace(out[-1], reach=cfg.corner_reach, hold=cfg.grip_hold, hold_grip=1.0)
    return out


def extend(tcp: np.ndarray, by: float, over: float = 0.03) -> np.ndarray:
    """The end of ``tcp`` [N, 3] moved ``by`` metres on in the direction of the path's last ``over`` metres. The
    planner's path ends at the first success, where the object only just meets the task's threshold (PullCube:
    the cube at the goal radius); a follower that lands a few millimetres short never succeeds."""
    back = np.linalg.norm(tcp - tcp[-1], axis=1)
    far = np.nonzero(back >= over)[0]
    if not len(far):
        return tcp[-1]
    d = tcp[-1] - tcp[far[-1]]
    return tcp[-1] + by * d / np.linalg.norm(d)


def follow(env: Any, u: Any, seed: int, wps: list[Waypoint], cfg: RetimeConfig, time_limit: int,
           raw_length: int = 0) -> RetimedEpisode:
    """Follow ``wps`` closed loop from ``seed`` until the env ends the episode or ``time_limit`` steps."""
    step = controller_step(u)
    obs = env.reset(seed=[seed])  # a new env's first observation (simulators.maniskill.fresh_reset)
    states, actions, rewards, flags = [np.asarray(obs["state"][0], np.float32)], [], [], []
    k, held = 0, 0
    for _ in range(time_limit):
        tcp = u.agent.tcp.pose.p[0].numpy()
        while k < len(wps) - 1 and wps[k].hold == held and np.linalg.norm(wps[k].pos - tcp) < wps[k].reach:
            k, held = k + 1, 0
        wp = wps[k]
        grip = wp.grip
        if wp.hold > held and np.linalg.norm(wp.pos - tcp) < wp.reach:
            grip, held = wp.hold_grip, held + 1
        elif wp.hold and held >= wp.hold:  # the last waypoint's change stays (``release``)
            grip = wp.hold_grip
        d = cfg.gain * (wp.pos - tcp) / step
        d = d / max(1.0, float(np.abs(d).max()))
        a = np.concatenate([d, [grip]]).astype(np.float32)
        res = env.chunk_step(a[None, None, :])
        actions.append(a)
        rewards.append(float(res.rewards[0, 0]))
        flags.append(bool(res.success[0, 0]))
        last = res.final_obs if res.final_obs is not None else res.obs
        states.append(np.asarray(last["state"][0], np.float32))
        if bool(res.done[0]):
            break
    return RetimedEpisode(seed, np.stack(states), np.stack(actions), np.asarray(rewards, np.float32),
                          np.asarray(flags, bool), raw_length)


def retime_file(src: Path, dst: Path, env_cfg: Any, time_limit: int, cfg: RetimeConfig = RetimeConfig(),
                keep: int = 0, log=print) -> list[RetimedEpisode]:
    """Re-time every episode of the converted trajectory file ``src`` (``pd_ee_delta_pos``, state, its seeds in
    the ``.json`` beside it) in vlarl's env for ``env_cfg``; write the first ``keep`` (0 = all) that succeed,
    each ending at its first success, to ``dst`` (ManiSkill's layout: ``obs`` [L + 1, D], ``actions``,
    ``rewards``, ``success``, ``terminated``, ``truncated``; ``.json`` with the seeds). Returns all re-timed
    episodes (kept or not)."""
    meta = json.loads(src.with_suffix(".json").read_text())
    if meta["env_info"]["env_kwargs"].get("control_mode") != RETIME_CONTROL:
        raise EnvError(f"re-timing follows the end effector: the demonstrations must be in {RETIME_CONTROL}; "
                       f"set env.control_mode={RETIME_CONTROL} or retime=false")
    seeds = [int(e["episode_seed"]) for e in meta["episodes"]]
    raw = _actions(src)
    env, u = retime_env(env_cfg, max(len(a) for a in raw) + time_limit + 1)
    done: list[RetimedEpisode] = []
    try:
        for seed, actions in zip(seeds, raw, strict=True):
            tcp, grip = tcp_path(env, u, seed, actions)
            done.append(follow(env, u, seed, waypoints(tcp, grip, cfg), cfg, time_limit, len(actions)))
    finally:
        env.close()
    kept = [e for e in done if e.solved]
    _write(dst, kept[:keep] if keep else kept, meta)
    for e in done:
        log(f"[retime] seed {e.seed}: {e.raw_length} planner steps -> {len(e.actions)} "
            f"({'success' if e.solved else 'failed, dropped'})")
    return done


def _actions(h5: Path) -> list[np.ndarray]:
    """``traj_<i>/actions`` [L, A] of a ManiSkill trajectory file, in episode order."""
    import h5py

    with h5py.File(h5, "r") as f:
        names = sorted((k for k in f if k.startswith("traj_")), key=lambda k: int(k.split("_")[1]))
        return [np.asarray(f[k]["actions"], np.float32) for k in names]


def _write(dst: Path, episodes: list[RetimedEpisode], meta: dict) -> None:
    """Each episode up to its first success: the env may not end there (``ignore_terminations``)."""
    cut = [(e, int(np.argmax(e.success)) + 1) for e in episodes]
    write_episodes(dst, [SolvedEpisode(e.seed, e.states[: n + 1], e.actions[:n], e.rewards[:n], e.success[:n],
                                       f"re-timed from {e.raw_length} planner steps") for e, n in cut],
                   meta, RETIME_CONTROL)
