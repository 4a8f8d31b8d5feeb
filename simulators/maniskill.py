"""ManiSkill3 behind the batched chunk-aware env interface.

CPU backend (``sim_backend="cpu"``): ManiSkill simulates one scene per process-local env, so one
``ManiSkillEnv`` holds ``num_envs`` single-scene envs and steps them in turn on the shared chunk loop of
``simulators.serial``; vectorization across cores comes from running several env workers. Everything
returned is a CPU torch tensor. Under ``obs_mode=rgb`` the cameras are rendered once per scene and chunk, not in
every control step (``_step_unrendered``; ``ManiSkillConfig.render_every_step``).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simulators.assets import load_json
from simulators.base import EnvError, EnvSpec, GroundedTask, InstructedTask
from simulators.light_meshes import check_detail
from simulators.maniskill_tasks import (  # noqa: F401  (INSTRUCTIONS, check_task: re-exported)
    INSTRUCTIONS,
    _asset_paths,
    asset_for_path,
    assets_named_in,
    check_task,
    check_task_config,
    import_maniskill,
    instruction_for,
    missing_asset_message,
    missing_assets,
    task_instructions,
)
from simulators.registry import EnvConfig, register_env, register_suites
from simulators.serial import SceneObs, SceneStep, SerialBatchedEnv


@dataclass
class ManiSkillConfig(EnvConfig):
    name: str = "maniskill"
    task: str = "PushCube-v1"
    control_mode: str = "pd_joint_delta_pos"  # "" = the task robot's default controller
    sim_backend: str = "cpu"  # "cpu" here; "physx_cuda" on GPU machines
    render_size: int = 256  # video frames (human render camera), pixels
    ignore_terminations: bool = False  # True: run to the time limit even after success
    # Policy cameras for obs_mode=rgb, by ManiSkill sensor name. Empty: the first sensor, named
    # "base_camera". A wrist camera needs a robot that has one: robot_uids=panda_wristcam, cameras=
    # [base_camera, hand_camera].
    cameras: list[str] = field(default_factory=list)
    robot_uids: str = ""  # "" = the task's default robot
    # A camera rendered only at chunk boundaries (after reset and at the end of each chunk) into
    # obs["images"], at image_size px, for a reward critic, while the policy keeps obs_mode (e.g. state):
    # one render per chunk instead of one per step. Reported in EnvSpec.critic_cameras, not in image_keys
    # (the policy does not read it).
    critic_camera: str = ""
    # obs_mode=rgb renders the policy cameras once per chunk: after a reset, at each chunk boundary and at the
    # last step of an episode that ends inside a chunk (its final_obs), the only observations a chunked policy
    # or an off-policy learner reads; ManiSkill itself renders every sensor inside every control step. The
    # images are the same (tests/simulators/test_maniskill_render_once.py). True: ManiSkill's every-step
    # rendering, kept to measure the difference (scripts/bench_rollout.py --pixels). CPU backend only.
    render_every_step: bool = False
    # The share of triangles kept in the scene's large untextured visual meshes (the robot's links): CPU rendering
    # costs per triangle, and the Panda's ~135k are most of a picture's cost; 0.1 cut a 64 px picture about 5x with
    # the images 0.46 / 255 apart on average (simulators/light_meshes.py). 1.0: ManiSkill's own meshes, the default,
    # so checkpoints trained on them see what they saw. CPU backend only.
    mesh_detail: float = 1.0
    # Keyword arguments of the ManiSkill task's own constructor, e.g. ``env.task_kwargs.instruction=other`` for
    # the language task (simulators/language_tasks.py: report the instruction that names the other goal).
    task_kwargs: dict[str, Any] = field(default_factory=dict)


# kept under their old names: the GPU adapter and scripts import them from here
_import_maniskill = import_maniskill


#: parts of ManiSkill's state observation that are the robot's own (besides everything under ``agent``)
PROPRIO_EXTRA = ("tcp_pose",)


def state_layout(env: Any) -> list[tuple[str, int]]:
    """(name, width) of each part of ManiSkill's flat state observation, in its order: ``agent/qpos``,
    ``agent/qvel``, then the task's ``extra/...`` (``tcp_pose``, ``goal_pos``, ``obj_pose``, ...), as
    ``flatten_state_dict`` concatenates them (insertion order; empty parts dropped)."""
    raw = env.unwrapped.get_obs(unflattened=True)
    out: list[tuple[str, int]] = []

    def walk(d: dict, prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}/")
            else:
                t = torch.as_tensor(v)
                width = 1 if t.ndim <= 1 else int(t[0].numel())  # [B] scalars / [B, n] vectors, batch of 1
                if width:
                    out.append((prefix + k, width))

    walk({k: raw[k] for k in ("agent", "extra") if k in raw}, "")
    return out


def proprio_dims(env: Any, state_dim: int) -> tuple[int, ...]:
    """Indices of the flat state that are proprioception (``agent/*`` and ``extra/tcp_pose``); () when the
    layout does not add up to ``state_dim`` (then the whole state counts as proprioception)."""
    idx, start = [], 0
    layout = state_layout(env)
    for name, width in layout:
        if name.startswith("agent/") or name.split("/")[-1] in PROPRIO_EXTRA:
            idx += range(start, start + width)
        start += width
    return tuple(idx) if start == state_dim and len(idx) < state_dim else ()


# evaluation suites over ManiSkill3 task ids (assets/tasks/maniskill_suites.json)
register_suites("maniskill", load_json("tasks/maniskill_suites.json"))


@register_env("maniskill", ManiSkillConfig)
class ManiSkillEnv(SerialBatchedEnv):
    """ManiSkill's CPU backend on the shared chunk loop (``simulators.serial``): this class says how to
    reset, step and observe one scene; the loop, auto-reset, metrics and action checks are serial's."""

    @staticmethod
    def validate_config(cfg: ManiSkillConfig) -> None:
        """Start-up checks (before a run directory is made): task id, observation mode, backend."""
        if cfg.obs_mode not in ("state", "rgb"):
            raise EnvError(f"env.obs_mode='{cfg.obs_mode}' is not supported; use 'state' or 'rgb'")
        if cfg.sim_backend != "cpu":
            raise EnvError(
                f"env.sim_backend='{cfg.sim_backend}': env=maniskill runs ManiSkill's CPU backend; use "
                "env.sim_backend=cpu, or env=maniskill_gpu for physx_cuda on a CUDA machine"
            )
        check_detail(cfg.mesh_detail)
        check_task_config(cfg)  # task id, reward mode, assets

    @staticmethod
    def instructions(cfg: ManiSkillConfig) -> list[str]:
        """Every instruction the task reports (checked against a policy's prompt before a run starts)."""
        return task_instructions(cfg.task)

    def __init__(self, cfg: ManiSkillConfig, num_envs: int, worker_index: int = 0, render: bool = False):
        gym = _import_maniskill()
        self.validate_config(cfg)
        self.cfg = cfg
        self.num_envs = num_envs
        self.worker_index = worker_index
        self.instruction = instruction_for(cfg.task)
        self.instructions = [self.instruction] * num_envs
        self.ignore_terminations = cfg.ignore_terminations
        self._render = render
        self._render_at_boundaries = cfg.obs_mode == "rgb" and not cfg.render_every_step
        # a camera the task lacks fails on the first env, before more are built
        self.envs = [make_scene_env(gym, cfg, render, check_cameras=k == 0) for k in range(num_envs)]
        e0 = self.envs[0]
        self._camera_slices: dict[str, slice] | None = None
        if cfg.obs_mode == "rgb" and cfg.cameras:
            self._camera_slices = _camera_slices(e0, cfg)
        space = e0.action_space
        low = np.asarray(space.low, dtype=np.float32).reshape(-1)
        high = np.asarray(space.high, dtype=np.float32).reshape(-1)
        self.max_episode_steps = int(cfg.max_episode_steps or _time_limit(e0))
        obs, _ = e0.reset(seed=0)
        first = self._convert(obs)
        if cfg.critic_camera and cfg.critic_camera not in e0.unwrapped.scene.sensors:
            raise EnvError(f"env.critic_camera='{cfg.critic_camera}' is not a camera of ManiSkill task '{cfg.task}'; "
                           f"its cameras are {list(e0.unwrapped.scene.sensors)}")
        self.spec = EnvSpec(
            state_dim=int(first.state.shape[-1]),
            action_dim=int(low.shape[0]),
            action_low=low,
            action_high=high,
            image_keys=tuple(first.images.keys()),
            image_size=(cfg.image_size, cfg.image_size) if cfg.obs_mode == "rgb" else None,
            max_episode_steps=self.max_episode_steps,
            task=cfg.task,
            instruction=self.instruction,
            critic_cameras=(cfg.critic_camera,) if cfg.critic_camera else (),
            proprio_dims=proprio_dims(e0, int(first.state.shape[-1])),
        )
        self._init_batch()

    # -- one scene --------------------------------------------------------------------------------
    def _convert(self, obs: Any) -> SceneObs:
        """ManiSkill obs of one env (batch 1, CPU tensors) -> ``SceneObs`` (numpy views, no copy)."""
        if isinstance(obs, dict) and self._camera_slices is not None:
            state = obs["state"].float().reshape(-1)
            hw = obs["rgb"].shape[-3:-1]
            images = {k: obs["rgb"][..., sl].to(torch.uint8).reshape(*hw, 3).numpy()
                      for k, sl in self._camera_slices.items()}
        elif isinstance(obs, dict):
            state = obs["state"].float().reshape(-1)
            images = {"base_camera": obs["rgb"][..., :3].to(torch.uint8).reshape(*obs["rgb"].shape[-3:-1], 3).numpy()}
        else:
            state = obs.float().reshape(-1)
            images = {}
        return SceneObs(state=state.numpy(), images=images)

    def reset_scene(self, i: int, seed: int | None, state_id: int | None) -> SceneObs:
        """A pinned reset-state id is the seed of that state; without one, ``seed`` (None: ManiSkill's RNG).
        Explicit resets and chunk_step's auto-resets alike go through ``fresh_reset``: the first observation of
        an episode is that of a new env, whatever the previous episode left in the contact buffer."""
        if state_id is not None:
            self._seeds[i] = state_id  # the seed ManiSkill got, named in crash reports
        obs, _ = fresh_reset(self.envs[i], state_id if state_id is not None else seed)
        task = self.envs[i].unwrapped
        if isinstance(task, InstructedTask):  # a language task draws its instruction per episode
            self.instructions[i] = task.episode_instructions()[0]
        return self._critic_frame(i, self._convert(obs))

    def grounding_targets(self) -> np.ndarray | None:
        """Where each scene's words point now (``GroundedTask.grounding_target``), float32 [num_envs, K], a row of
        NaN for a scene whose task names nothing; None when no scene's task does (vision pretraining's labels)."""
        rows = [e.unwrapped.grounding_target().reshape(-1).numpy() if isinstance(e.unwrapped, GroundedTask)
                else None for e in self.envs]
        width = next((len(r) for r in rows if r is not None), 0)
        if not width:
            return None
        return np.stack([np.full(width, np.nan, np.float32) if r is None else r.astype(np.float32) for r in rows])

    def step_scene(self, i: int, action: np.ndarray) -> SceneStep:
        """One ManiSkill step; its raw observation is converted once per chunk (``scene_obs``): per-step
        conversion costs more than a PushCube physics step (scripts/bench_envs.py: vlarl / plain). Under
        obs_mode=rgb the step renders nothing (``_step_unrendered``); ``scene_obs`` renders the cameras."""
        a = torch.from_numpy(action[None])
        if self._render_at_boundaries:
            raw, r, term, trunc, info = _step_unrendered(self.envs[i], a)
            raw = _Unrendered(info)
        else:
            raw, r, term, trunc, info = self.envs[i].step(a)
        success = bool(info["success"].reshape(-1)[0]) if "success" in info else False
        return SceneStep(obs=raw, reward=float(r.reshape(-1)[0]), terminated=bool(term.reshape(-1)[0]),
                         success=success, truncated=bool(trunc.reshape(-1)[0]))

    def scene_obs(self, i: int, raw: Any) -> SceneObs:
        """Scene ``i`` as of its last step, once per chunk (and for an episode's ``final_obs``). After an
        unrendered step the cameras are rendered here, through the same ManiSkill ``get_obs`` (with that step's
        ``info``) and FlattenRGBD conversion as a rendering step uses: the scene has not moved since."""
        if isinstance(raw, _Unrendered):
            env = self.envs[i]
            raw = env.observation(env.unwrapped.get_obs(raw.info))
        return self._critic_frame(i, self._convert(raw))

    def _critic_frame(self, i: int, obs: SceneObs) -> SceneObs:
        """Add ``cfg.critic_camera``'s RGB frame (uint8 [H, W, 3]) to scene ``i``'s obs (see ManiSkillConfig)."""
        cam = self.cfg.critic_camera
        if not cam or cam in obs.images:
            return obs
        return SceneObs(state=obs.state, images={**obs.images, cam: self._sensor_frame(i, cam)})

    def _sensor_frame(self, i: int, cam: str) -> np.ndarray:
        """Scene ``i``'s camera ``cam`` now, uint8 [H, W, 3] (rendered as ManiSkill's sensor observations are)."""
        u = self.envs[i].unwrapped
        for actor in u._hidden_objects:
            actor.hide_visual()
        u.scene.update_render(update_sensors=True, update_human_render_cameras=False)
        sensor = u.scene.sensors[cam]
        sensor.capture()
        rgb = sensor.get_obs(rgb=True, depth=False, position=False, segmentation=False)["rgb"]
        return rgb[..., :3].to(torch.uint8).reshape(*rgb.shape[-3:-1], 3).numpy()

    def render_scene(self, i: int, camera: str | None = None) -> np.ndarray | None:
        """Scene ``i``'s human-camera frame (uint8 [H, W, 3]) when built with ``render=True``, else the frame of
        ``camera`` (default: the first policy camera); None for a state-only env. Videos call it once per
        control step (``chunk_step``'s observer, through ``render_rows``), so they show every env step, not one frame per chunk."""
        if self._render and camera is None:
            f = self.envs[i].render()
            f = f.cpu().numpy() if isinstance(f, torch.Tensor) else np.asarray(f)
            return f.reshape(-1, *f.shape[-3:])[0].astype(np.uint8)
        cam = camera or (self.spec.image_keys[0] if self.spec.image_keys else None)
        if cam is None:
            return None
        if cam not in self.envs[i].unwrapped.scene.sensors:
            raise EnvError(f"camera '{cam}' is not a camera of ManiSkill task '{self.cfg.task}'; its cameras are "
                           f"{list(self.envs[i].unwrapped.scene.sensors)}")
        return self._sensor_frame(i, cam)

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []


def make_scene_env(gym: Any, cfg: ManiSkillConfig, render: bool, check_cameras: bool = True) -> Any:
    """One CPU scene of ``cfg.task`` as vlarl steps it: built quietly, its cameras checked against ``cfg.cameras``
    (one line naming the task's cameras), and under ``obs_mode=rgb`` flattened into a state vector plus frames."""
    env = _make_quietly(gym, cfg.task, make_kwargs(cfg, sim_backend="cpu", num_envs=1, render=render))
    if check_cameras and cfg.cameras:
        _camera_slices(env, cfg)
    if cfg.mesh_detail < 1.0:
        from simulators.light_meshes import lighten_env

        lighten_env(env, cfg.mesh_detail)
    if cfg.obs_mode == "rgb":
        from mani_skill.utils.wrappers.flatten import FlattenRGBDObservationWrapper

        env = FlattenRGBDObservationWrapper(env, rgb=True, depth=False, state=True)
    return env


def fresh_reset(env: Any, seed: int | list[int] | None) -> tuple[Any, dict]:
    """``env.reset(seed=seed)`` (``env``: a ManiSkill gym env, any wrappers) whose observation is the one a new env
    gives for ``seed``; returns ManiSkill's (obs, info).

    ManiSkill reads contact forces (PickCube's ``is_grasped``, in the state observation and the reward) from the
    last physics step, which right after a reset is still the previous episode's: a reset after an episode that
    ended holding the cube reports the new, untouched cube as grasped. So the task is reset once without making
    an observation (no camera is rendered), the physics stepped once from that reset state (fingers apart, objects
    at rest: the contacts of the new episode), and the env reset again from the same seed, which puts back the
    reset state exactly. Restoring a saved state instead (``set_state_dict``) is cheaper but not exact: the TCP
    pose comes back one float32 ulp off. An unseeded reset (``seed`` None) draws its episode from ManiSkill's RNGs
    and the global torch / numpy ones; they are put back before the second reset, so it draws the same episode
    and the unseeded sequence is the one ManiSkill gives. Costs one reset without observation and one physics
    step: medians on a 2-core CPU, PickCube 2.9 -> 5.8 ms per reset (state), 33.1 -> 36.7 ms (rgb, 64 px),
    PushCube 1.5 -> 3.0 ms (state)."""
    u = env.unwrapped
    rngs = _rng_state(u) if seed is None else None

    def no_obs(info: dict | None = None, unflattened: bool = False) -> None:
        return None

    u.get_obs = no_obs  # the throw-away reset makes no observation (renders nothing under obs_mode=rgb)
    try:
        u.reset(seed=seed)
    finally:
        del u.get_obs
    if u.reconfiguration_freq != 0:  # the second reset counts as the only one towards a reconfiguration
        u._reconfig_counter += 1
    u.scene.step()
    if rngs is not None:
        _set_rng_state(u, rngs)
    return env.reset(seed=seed)


def _rng_state(u: Any) -> tuple:
    """Every RNG an unseeded ManiSkill reset draws from (its main and episode RNGs, torch's and numpy's), as the
    states of those generators: ``_set_rng_state`` winds the same objects back."""
    gens = _generators(u)
    return [g.get_state() for g in gens], np.array(u._episode_seed, copy=True), torch.get_rng_state(), \
        np.random.get_state()


def _set_rng_state(u: Any, state: tuple) -> None:
    states, episode_seed, torch_state, np_state = state
    for g, st in zip(_generators(u), states, strict=True):
        g.set_state(st)
    u._episode_seed = episode_seed
    torch.set_rng_state(torch_state)
    np.random.set_state(np_state)


def _generators(u: Any) -> list[np.random.RandomState]:
    """ManiSkill's numpy generators: ``_main_rng`` and those inside its batched main and episode RNGs (the
    episode's ``_episode_rng`` is one of the latter)."""
    gens = [u._main_rng] + list(u._batched_main_rng.rngs) + list(u._batched_episode_rng.rngs)
    return list({id(g): g for g in gens}.values())


@dataclass
class _Unrendered:
    """A step's observation not rendered yet: the ``info`` ManiSkill's ``get_obs`` needs to make it later."""

    info: dict[str, Any]


def _step_unrendered(env: Any, action: torch.Tensor) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
    """``env.step(action)`` of an obs_mode=rgb env (``env``: FlattenRGBD over the task's wrappers) without
    rendering its sensors; returns ManiSkill's (obs, reward, terminated, truncated, info) with ``obs`` holding
    only the state parts (``agent``, ``extra``).

    ManiSkill's ``step`` calls ``get_obs``, which under obs_mode=rgb updates the render scene and takes a
    picture with every sensor camera: 85-95% of a step on CPU. For this one call the task's
    ``_get_obs_with_sensor_data`` is shadowed by an instance attribute that returns the state parts it would
    have returned (the same ``_get_obs_agent`` / ``_get_obs_extra(info)``), so physics, ``info``, the reward
    (which ManiSkill computes from ``info`` and that dict) and the time limit run exactly as in ``step``; the
    wrapper below FlattenRGBD is stepped, since FlattenRGBD expects sensor data to flatten."""
    task = env.unwrapped

    def state_parts(info: dict, apply_texture_transforms: bool = True) -> dict[str, Any]:
        return dict(agent=task._get_obs_agent(), extra=task._get_obs_extra(info))

    task._get_obs_with_sensor_data = state_parts
    try:
        return env.env.step(action)
    finally:
        del task._get_obs_with_sensor_data


def _camera_slices(env: Any, cfg: ManiSkillConfig) -> dict[str, slice]:
    """Channel slices of FlattenRGBD's stacked rgb ([..., 3 * n_sensors], in sensor order) per camera."""
    sensors = list(env.unwrapped.scene.sensors.keys())  # the order of obs["sensor_data"]
    missing = [c for c in cfg.cameras if c not in sensors]
    if missing:
        hint = " (a wrist camera needs env.robot_uids=panda_wristcam)" if "hand_camera" in missing else ""
        raise EnvError(
            f"env.cameras has {missing}, which ManiSkill task '{cfg.task}' does not have; "
            f"its cameras are {sensors}{hint}"
        )
    return {c: slice(3 * sensors.index(c), 3 * sensors.index(c) + 3) for c in cfg.cameras}



def make_kwargs(cfg: ManiSkillConfig, sim_backend: str, num_envs: int, render: bool) -> dict[str, Any]:
    """``gym.make`` keyword arguments for a ManiSkill task, shared by the CPU and GPU adapters."""
    kwargs: dict[str, Any] = dict(
        obs_mode="state" if cfg.obs_mode == "state" else "rgb",
        control_mode=cfg.control_mode or None,
        sim_backend=sim_backend,
        num_envs=num_envs,
        reward_mode=cfg.reward_mode,
    )
    if cfg.obs_mode == "rgb" or getattr(cfg, "critic_camera", ""):
        kwargs["sensor_configs"] = dict(width=cfg.image_size, height=cfg.image_size)
    if render:
        kwargs["render_mode"] = "rgb_array"
        kwargs["human_render_camera_configs"] = dict(width=cfg.render_size, height=cfg.render_size)
    if cfg.max_episode_steps > 0:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    if cfg.robot_uids:
        kwargs["robot_uids"] = cfg.robot_uids
    kwargs.update(getattr(cfg, "task_kwargs", None) or {})
    return kwargs

def _time_limit(env: Any) -> int:
    e = env
    while e is not None:
        if hasattr(e, "_max_episode_steps") and e._max_episode_steps:
            return int(e._max_episode_steps)
        e = getattr(e, "env", None)
    return 0


PHYSX_GPU_DOWNLOAD = "physx-precompiled"  # in the URL SAPIEN fetches its GPU PhysX library from on first use


def physx_gpu_library_message(task: str, error: str) -> str:
    """One line for a physx_cuda scene on a machine that cannot download SAPIEN's GPU PhysX library (seen on
    the lent H200, which reaches no network: docs/gpu.md)."""
    m = re.search(r"download/([^/\s]+)/", error)
    version = m.group(1) if m else "<physx version>"
    return (f"ManiSkill task '{task}' on physx_cuda needs SAPIEN's GPU PhysX library, which SAPIEN downloads on "
            f"first use and this machine cannot reach; on a machine with network and a GPU run "
            f"`python -c 'import sapien.physx as p; p.enable_gpu()'` once, then copy "
            f"~/.sapien/physx/{version}/libPhysXGpu_64.so to the same path here (scripts/gpu/env.sh installs "
            f"gpu_wheels/physx/{version}/ there), or use env.sim_backend=cpu")


def _make_quietly(gym: Any, task: str, kwargs: dict[str, Any]) -> Any:
    """gym.make with stdin closed and ManiSkill's prints captured, so that an asset ManiSkill finds
    missing only while building (a scene or robot file) becomes a clear error, not a ``(y|n)``
    prompt; an unsupported control mode becomes a clear error, not an ``assert``. Multi-agent tasks
    (a dict of action spaces) get one flat action vector, as every vlarl policy emits."""
    import contextlib
    import io

    old_stdin = sys.stdin
    printed = io.StringIO()
    try:
        sys.stdin = open(os.devnull)
        with contextlib.redirect_stdout(printed):
            env = gym.make(task, **kwargs)
    except (EOFError, SystemExit) as e:  # a download prompt read EOF (or ManiSkill called exit())
        named = assets_named_in(printed.getvalue())
        missing = [(a, paths[0][1]) for a in named if (paths := _asset_paths(a))]
        missing = missing or missing_assets(task, kwargs.get("robot_uids", ""))
        raise EnvError(missing_asset_message(task, missing) if missing else (
            f"ManiSkill task '{task}' asked to download assets ({_last_line(printed.getvalue())}); fetch them "
            f"with `python -m mani_skill.utils.download_asset {task}` on a machine with network and copy "
            "~/.maniskill/data here (or set MS_ASSET_DIR), or pick a task that works offline "
            f"(docs/maniskill_tasks.md)"
        )) from e
    except TypeError as e:  # a keyword the task's constructor lacks: most likely one of env.task_kwargs
        bad = re.search(r"unexpected keyword argument '([^']+)'", str(e))
        if bad is None:
            raise
        raise EnvError(f"ManiSkill task '{task}' takes no argument '{bad.group(1)}' (from env.task_kwargs?); drop it "
                       f"or name one its constructor has") from e
    except ImportError as e:
        raise EnvError(
            f"ManiSkill task '{task}' could not import a package it needs ({e}); install it with "
            f"`pip install {e.name or '<that package>'}`"
        ) from e
    except AssertionError as e:
        if "supported modes" in str(e):
            raise EnvError(
                f"env.control_mode='{kwargs.get('control_mode')}' is not a controller of ManiSkill task '{task}''s "
                f"robot ({e}); set env.control_mode to one of those, or env.control_mode='' for its default"
            ) from e
        raise EnvError(f"ManiSkill task '{task}' could not be created (AssertionError: {e})") from e
    except (OSError, RuntimeError) as e:
        if PHYSX_GPU_DOWNLOAD in str(e):
            raise EnvError(physx_gpu_library_message(task, str(e))) from e
        asset = asset_for_path(e.filename) if isinstance(e, OSError) and e.filename else None
        if asset:
            raise EnvError(missing_asset_message(task, [(asset, Path(e.filename))])) from e
        raise EnvError(
            f"ManiSkill task '{task}' could not be created ({type(e).__name__}: {e}). If it needs assets, fetch "
            f"them with `python -m mani_skill.utils.download_asset {task}` and copy ~/.maniskill/data here"
        ) from e
    finally:
        sys.stdin.close()
        sys.stdin = old_stdin
    if printed.getvalue():
        sys.stdout.write(printed.getvalue())
    from gymnasium import spaces

    if isinstance(env.action_space, spaces.Dict):
        from mani_skill.utils.wrappers.flatten import FlattenActionSpaceWrapper

        env = FlattenActionSpaceWrapper(env)
    return env


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("---")]
    return lines[-1] if lines else "no message"
