"""MuJoCo scenes through robosuite 1.4 (the version LIBERO pins) behind the batched env interface.

For users who bring robosuite tasks or their own MuJoCo scenes (a robosuite environment class
registered with robosuite's ``REGISTERED_ENVS``). Panda with an OSC_POSE controller by default.

* action: robosuite's own action vector (OSC_POSE: [dx, dy, dz, droll, dpitch, dyaw, gripper] in
  [-1, 1]; gripper -1 opens, +1 closes).
* state: ``robot0_proprio-state`` followed by ``object-state`` (float32, task-dependent length).
* images: the cameras in ``cameras`` (uint8 [H, W, 3], flipped vertically so that up is up).
* seeds: robosuite samples object placements and joint noise from numpy's global RNG; each reset
  seeds it from the env's seed (or reset-state id) and restores it afterwards, so a seed or an id
  fully determines the initial state.
* reward: ``sparse`` (1 on success), ``dense`` (robosuite's staged shaping) or ``normalized_dense``
  (the same divided by its maximum, ``reward_scale=1``, so rewards lie in [0, 1]).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulators.base import EnvError, EnvSpec
from simulators.mujoco_render import (
    RenderQuality,
    apply_render_quality,
    release_render_context,
    select_gl_backend,
)
from simulators.registry import EnvConfig, register_env
from simulators.robosuite_compat import patch_robosuite
from simulators.serial import SceneObs, SceneStep, SerialBatchedEnv

INSTRUCTIONS: dict[str, str] = {
    "Lift": "lift the red cube",
    "Stack": "stack the red cube on top of the green cube",
    "PickPlace": "put each object into its bin",
    "PickPlaceCan": "put the can into its bin",
    "PickPlaceMilk": "put the milk carton into its bin",
    "PickPlaceBread": "put the bread into its bin",
    "PickPlaceCereal": "put the cereal box into its bin",
    "NutAssembly": "put the nuts onto their pegs",
    "NutAssemblySquare": "put the square nut onto its peg",
    "NutAssemblyRound": "put the round nut onto its peg",
    "Door": "open the door",
    "Wipe": "wipe the markings off the table",
}


@dataclass
class RobosuiteConfig(EnvConfig):
    name: str = "robosuite"
    task: str = "Lift"
    robots: list[str] = field(default_factory=lambda: ["Panda"])
    controller: str = "OSC_POSE"
    num_envs: int = 1
    obs_mode: str = "state"
    image_size: int = 128
    cameras: list[str] = field(default_factory=lambda: ["agentview", "robot0_eye_in_hand"])
    reward_mode: str = "normalized_dense"
    control_freq: int = 20
    max_episode_steps: int = 200
    shadows: bool = False
    reflections: bool = False
    msaa: bool = False
    mujoco_gl: str = ""  # "" = MUJOCO_GL from the environment (egl); or egl / osmesa
    render_size: int = 256  # video frames (render_camera)
    render_camera: str = "frontview"
    model_seed: int = 0  # numpy seed while building scenes (task details drawn at construction)


def _import_robosuite() -> Any:
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            import robosuite
    except ImportError as e:
        raise EnvError(
            f"robosuite is not installed ({e}); install it with `pip install torch==2.13.0 -e .[robosuite]`"
        ) from e
    patch_robosuite()
    return robosuite


def clear_gripper_state(env: Any) -> None:
    """robosuite grippers integrate their command in ``current_action``, which only a hard reset
    clears; clear it on soft resets so the same initial state always leads to the same rollout."""
    for robot in env.robots:
        g = getattr(robot, "gripper", None)
        if g is not None and hasattr(g, "current_action"):
            g.current_action = np.zeros_like(g.current_action)


@contextlib.contextmanager
def seeded_global_numpy(seed: int | None):
    """Seed numpy's global RNG for robosuite's samplers, then put the caller's state back."""
    if seed is None:
        yield
        return
    state = np.random.get_state()
    np.random.seed(seed % 2**32)
    try:
        yield
    finally:
        np.random.set_state(state)


class RobosuiteScenes(SerialBatchedEnv):
    """What the robosuite-backed envs (robosuite's own tasks, LIBERO's) share around their scenes: the attributes
    every one sets, its cameras, a camera's frame from the last raw observation, and closing the scenes.
    ``FLIP_COLUMNS``: robosuite renders upside down (rows flipped); LIBERO's frames are also mirrored."""

    FLIP_COLUMNS = False

    def _start(self, cfg: Any, num_envs: int, worker_index: int, render: bool, video_camera: str) -> list[str]:
        """Set the common attributes; returns the cameras to render: the observed ones (``env.cameras`` with
        ``obs_mode=rgb``) plus ``video_camera`` when rendering video."""
        self.cfg = cfg
        self.num_envs = num_envs
        self.worker_index = worker_index
        self._render = render
        self.video_camera = video_camera
        self.ignore_terminations = False
        self.cameras = list(cfg.cameras) if cfg.obs_mode == "rgb" else []
        self._rng = np.random.default_rng()
        self._last_raw: list[dict[str, Any]] = [{} for _ in range(num_envs)]
        return self.cameras + ([video_camera] if render and video_camera not in self.cameras else [])

    def _frame(self, raw: dict[str, Any], camera: str) -> np.ndarray:
        """``camera``'s frame ``[H, W, 3]`` upright (and unmirrored), contiguous."""
        img = raw[f"{camera}_image"][::-1]
        return np.ascontiguousarray(img[:, ::-1] if self.FLIP_COLUMNS else img)

    def render_scene(self, i: int, camera: str | None = None) -> np.ndarray | None:
        raw = self._last_raw[i]
        if camera is None and self._render:
            return resize_square(self._frame(raw, self.video_camera), self.cfg.render_size)
        cam = camera or (self.cameras[0] if self.cameras else None)
        if cam is None:
            return None
        return resize_square(self._frame(raw, cam), self.cfg.image_size)

    def close(self) -> None:
        close_scenes(self.envs)
        self.envs = []


@register_env("robosuite", RobosuiteConfig)
class RobosuiteEnv(RobosuiteScenes):
    @staticmethod
    def validate_config(cfg: RobosuiteConfig) -> None:
        if cfg.obs_mode not in ("state", "rgb"):
            raise EnvError(f"env.obs_mode='{cfg.obs_mode}' is not supported; use 'state' or 'rgb'")
        if cfg.reward_mode not in ("sparse", "dense", "normalized_dense"):
            raise EnvError(
                f"env.reward_mode='{cfg.reward_mode}' is unknown; use sparse, dense or normalized_dense"
            )
        if cfg.obs_mode == "rgb" and not cfg.cameras:
            raise EnvError("env.obs_mode='rgb' needs at least one camera in env.cameras")

    def __init__(self, cfg: RobosuiteConfig, num_envs: int, worker_index: int = 0, render: bool = False):
        self.validate_config(cfg)
        select_gl_backend(cfg.mujoco_gl)
        suite = _import_robosuite()
        from robosuite.environments.base import REGISTERED_ENVS

        if cfg.task not in REGISTERED_ENVS:
            known = sorted(k for k in REGISTERED_ENVS if not k.startswith("TwoArm"))
            raise EnvError(f"unknown robosuite task env.task='{cfg.task}'; single-arm tasks: {known}")
        cams = self._start(cfg, num_envs, worker_index, render, cfg.render_camera)
        size = max(cfg.image_size, cfg.render_size) if render else cfg.image_size
        self.envs: list[Any] = []
        for _ in range(num_envs):
            # Some tasks draw model details at construction (Lift's cube size) from numpy's global RNG:
            # build every instance from the same seed so that equal reset-state ids mean equal scenes.
            with contextlib.redirect_stdout(io.StringIO()), seeded_global_numpy(cfg.model_seed):
                try:
                    env = suite.make(
                        cfg.task,
                        robots=list(cfg.robots),
                        controller_configs=suite.load_controller_config(default_controller=cfg.controller),
                        has_renderer=False,
                        has_offscreen_renderer=bool(cams),
                        use_camera_obs=bool(cams),
                        camera_names=cams or "agentview",
                        camera_heights=size,
                        camera_widths=size,
                        reward_shaping=cfg.reward_mode != "sparse",
                        reward_scale=1.0 if cfg.reward_mode == "normalized_dense" else None,
                        control_freq=cfg.control_freq,
                        horizon=10**9,  # time limits are ours (max_episode_steps)
                        ignore_done=True,
                        hard_reset=False,
                    )
                except ValueError as e:
                    if "_image" in str(e) or "camera" in str(e).lower():
                        raise EnvError(
                            f"robosuite task '{cfg.task}' has no camera among env.cameras={cams} ({e}); "
                            "typical names: agentview, frontview, birdview, sideview, robot0_eye_in_hand"
                        ) from e
                    raise
            if cams:
                apply_render_quality(env.sim, RenderQuality(cfg.shadows, cfg.reflections, cfg.msaa))
            self.envs.append(env)
        self.instructions = [INSTRUCTIONS.get(cfg.task, _words(cfg.task))] * num_envs
        self.max_episode_steps = int(cfg.max_episode_steps)
        low, high = (np.asarray(x, dtype=np.float32) for x in self.envs[0].action_spec)
        first = self.reset_scene(0, 0, None)
        self.spec = EnvSpec(
            state_dim=int(first.state.shape[0]),
            action_dim=int(low.shape[0]),
            action_low=low,
            action_high=high,
            image_keys=tuple(self.cameras),
            image_size=(cfg.image_size, cfg.image_size) if self.cameras else None,
            max_episode_steps=self.max_episode_steps,
            task=cfg.task,
            instruction=self.instructions[0],
        )
        self._init_batch()

    def _convert(self, i: int, raw: dict[str, Any]) -> SceneObs:
        self._last_raw[i] = raw
        parts = [raw[k] for k in ("robot0_proprio-state", "object-state") if k in raw]
        images = {}
        for c in self.cameras:
            img = raw[f"{c}_image"]
            if img.shape[0] != self.cfg.image_size:
                img = resize_square(img, self.cfg.image_size)
            images[c] = np.ascontiguousarray(img[::-1], dtype=np.uint8)
        return SceneObs(state=np.concatenate(parts).astype(np.float32), images=images)

    def reset_scene(self, i: int, seed: int | None, state_id: int | None) -> SceneObs:
        s = (
            state_id
            if state_id is not None
            else (seed if seed is not None else int(self._rng.integers(2**31)))
        )
        env = self.envs[i]
        with seeded_global_numpy(s):
            clear_gripper_state(env)
            raw = env.reset()
        return self._convert(i, raw)

    def step_scene(self, i: int, action: np.ndarray) -> SceneStep:
        env = self.envs[i]
        raw, reward, _, _ = env.step(action.astype(np.float64))
        success = bool(env._check_success())
        if self.cfg.reward_mode == "sparse":
            reward = float(success)
        return SceneStep(obs=self._convert(i, raw), reward=float(reward), terminated=success, success=success)



def _words(task: str) -> str:
    return "".join(" " + c.lower() if c.isupper() else c for c in task).strip()


def resize_square(img: np.ndarray, size: int) -> np.ndarray:
    """An ``[H, W, 3]`` frame as ``[size, size, 3]`` (area interpolation; returned as is when it already fits)."""
    if img.shape[0] == size and img.shape[1] == size:
        return img
    import cv2

    return cv2.resize(np.ascontiguousarray(img), (size, size), interpolation=cv2.INTER_AREA)


def close_scenes(envs: list[Any]) -> None:
    """Release each robosuite env's render context, then close it; an env that fails either is passed over (a
    worker shutting down must close the rest)."""
    for env in envs:
        with contextlib.suppress(Exception):
            release_render_context(env.sim)
        with contextlib.suppress(Exception):
            env.close()
