"""A real Franka (FR3/Panda) as a ``BatchedEnv`` with B = 1, so evaluation and deployment share code with sims.

Observation (the shared schema): ``images = {camera: uint8 [1, H, W, 3]}``, ``state = float32 [1, 15]``
= joint positions [7] + EE position [3] + EE quaternion xyzw [4] + gripper width [1],
``instruction = [cfg.instruction]``.

Actions ``[1, T, A]`` (``robot.action_mode``): ``ee_delta`` = base-frame translation [3] + rotation
vector [3] + gripper [1]; ``ee_abs`` = position [3] + rotation vector [3] + gripper [1]; ``joint`` =
joint positions [7] + gripper [1]; gripper 1 = close, 0 = open. Each action passes the safety layer,
becomes the impedance tracker's reference and is held for ``1 / policy_hz`` s (franky tracks it at
1 kHz). Between chunks a watchdog stops the arm if the next chunk is later than
``safety.watchdog_timeout``; the next ``chunk_step`` recovers and resumes from where the arm rests.
No reward exists on the real robot: rewards are 0 and success comes from ``mark_success()`` (operator).
Tasks (``robots.reach_task``) and the human-in-the-loop layer (``robots.interventions``) plug in through
``_command`` (what is sent instead of the policy's action: an operator takeover) and ``_step_reward``; the
command still passes the safety layer.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from robots.cameras import CameraConfig, make_camera
from robots.franky_driver import FrankyConfig, FrankyDriver, RobotLinkError, RobotReading
from robots.safety import ACTION_MODES, Clamp, OperatorStop, SafetyConfig, SafetyLayer, Target, Watchdog
from simulators.base import EnvError, EnvSpec, Obs
from simulators.chunk_stepper import ChunkStepper, StepOutcome, SteppedEnv
from simulators.registry import EnvConfig, register_env

log = logging.getLogger(__name__)

STATE_DIM = 15


@dataclass
class FrankaEnvConfig(EnvConfig):
    name: str = "franka"
    task: str = "franka_real"
    num_envs: int = 1
    instruction: str = ""
    action_mode: str = "ee_delta"  # "ee_delta" | "ee_abs" | "joint"
    policy_hz: float = 10.0  # how often a new reference is set (the tracker itself runs at 1 kHz)
    max_episode_steps: int = 200
    home_on_reset: bool = True
    auto_reset: bool = True  # reset (go home) at the chunk boundary after an episode ends
    recover_on_fault: bool = True  # after a watchdog trip / reflex, recover and resume on the next chunk
    cameras: list[CameraConfig] = field(default_factory=lambda: [CameraConfig()])
    franky: FrankyConfig = field(default_factory=FrankyConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)


@dataclass
class StepRecord:
    """One executed control step (what the recorder stores)."""

    obs: Obs  # observation the action was chosen from (B = 1)
    policy_action: np.ndarray  # [A] as the policy sent it
    action: np.ndarray  # [A] as executed after the safety layer (the SFT label)
    clamps: list[Clamp]
    t: float
    intervened: bool = False  # an operator's action replaced the policy's at this step (policy_action = what it replaced)
    reward: float = 0.0


@register_env("franka", FrankaEnvConfig)
class FrankaEnv(SteppedEnv):
    """B = 1 real-robot env. ``driver`` defaults to franky; ``recorder`` gets every ``StepRecord``."""

    def __init__(self, cfg: FrankaEnvConfig, num_envs: int = 1, worker_index: int = 0, render: bool = False,
                 driver: Any = None, recorder: Any = None, operator_stop: OperatorStop | None = None,
                 operator: Any = None, reward_fn: Any = None):
        if num_envs != 1:
            raise EnvError(f"the Franka env drives one arm: env.num_envs must be 1, got {num_envs}")
        if cfg.action_mode not in ACTION_MODES:
            raise EnvError(f"env.action_mode='{cfg.action_mode}' is unknown; choose one of {sorted(ACTION_MODES)}")
        if cfg.policy_hz <= 0:
            raise EnvError(f"env.policy_hz must be > 0, got {cfg.policy_hz}")
        self.cfg, self.num_envs, self.dt = cfg, 1, 1.0 / cfg.policy_hz
        self.safety = SafetyLayer(cfg.safety, cfg.action_mode, self.dt)
        ws = {"low": cfg.safety.workspace_low, "high": cfg.safety.workspace_high}
        self.cameras = [make_camera(c, ws) for c in cfg.cameras]
        a_dim = ACTION_MODES[cfg.action_mode]
        sizes = {(c.height, c.width) for c in cfg.cameras}
        self.spec = EnvSpec(
            state_dim=STATE_DIM, action_dim=a_dim, action_low=np.full(a_dim, -np.inf, np.float32),
            action_high=np.full(a_dim, np.inf, np.float32), image_keys=tuple(c.name for c in cfg.cameras),
            image_size=sizes.pop() if len(sizes) == 1 else None, max_episode_steps=cfg.max_episode_steps,
            task=cfg.task, instruction=cfg.instruction)
        self.driver = driver if driver is not None else FrankyDriver(cfg.franky)
        self.recorder, self.operator_stop = recorder, operator_stop
        self.operator = operator  # robots.interventions.Operator: may take over mid-episode
        self.reward_fn = reward_fn  # (env) -> (reward, success) after each step; robots.rewards builds them
        self.intervention_steps = self.takeovers = 0
        self._intervening = False
        self.driver.connect()
        self.watchdog = Watchdog(cfg.safety.watchdog_timeout, self._on_watchdog, link_ok=self.driver.link_ok)
        self.elapsed = 0
        self.recoveries = 0
        self._reading: RobotReading | None = None
        self._obs: Obs | None = None
        self._success = False
        self.last_fault: str | None = None  # why the last chunk stopped the arm (None: it did not)
        self._fault: str | None = None
        self._t_next = 0.0
        self.stepper = ChunkStepper(1, self.spec.action_low, self.spec.action_high, cfg.max_episode_steps)

    # -- hooks for tasks and the human in the loop (defaults: the policy acts, no reward) -------------------
    HOOKS = ("operator", "recorder", "reward_fn")

    @contextlib.contextmanager
    def hooks(self, **hooks: Any) -> Iterator[None]:
        """Plug in the human-in-the-loop hooks the constructor takes (``operator``, ``recorder``, ``reward_fn``;
        None unplugs one) for the ``with`` block, and put the previous ones back after it. A learning loop trains
        with its operator and recorder, then evaluates with ``hooks(operator=None, recorder=None)``."""
        unknown = sorted(set(hooks) - set(self.HOOKS))
        if unknown:
            raise TypeError(f"FrankaEnv.hooks: '{unknown[0]}' is not a hook; choose from {list(self.HOOKS)}")
        saved = {name: getattr(self, name) for name in hooks}
        self.__dict__.update(hooks)
        try:
            yield
        finally:
            self.__dict__.update(saved)

    def _command(self, policy_action: np.ndarray) -> tuple[np.ndarray, bool]:
        """The action handed to the safety layer for this step, and whether an operator's replaced the policy's."""
        action = None if self.operator is None else self.operator.act(self._reading, policy_action)
        intervened = action is not None
        self.takeovers += int(intervened and not self._intervening)
        self.intervention_steps += int(intervened)
        self._intervening = intervened
        return (policy_action if action is None else np.asarray(action, np.float32)), intervened

    def _prepare_episode(self, seed: int | list[int] | None) -> None:
        """After homing, with tracking started: bring the task to its start state (a task's random start)."""

    def _step_reward(self) -> tuple[float, bool]:
        """(reward, success) after the step just executed (``self._reading`` is the new state)."""
        if self.reward_fn is None:
            return 0.0, self._success
        reward, success = self.reward_fn(self)
        return float(reward), bool(success) or self._success

    def _episode_extra(self) -> dict[str, Any]:
        """More episode-table columns for the recorder: how much the operator drove."""
        return {"intervention_steps": self.intervention_steps, "takeovers": self.takeovers}

    # -- observation --------------------------------------------------------------------------------
    def _observe(self) -> Obs:
        r = self.driver.read()
        self._reading = r
        state = np.concatenate([r.q, r.pos, r.quat, [r.gripper_width]]).astype(np.float32)[None]
        images = {cam.name: cam.read(r)[None] for cam in self.cameras}
        self._obs = {"images": images, "state": state, "instruction": [self.cfg.instruction]}
        return self._obs

    def _on_watchdog(self, reason: str) -> None:
        self.driver.stop()

    def _start(self) -> None:
        r = self.driver.read()
        self.safety.reset(r.pos, r.quat, r.q, gripper_closed=r.gripper_width < 0.02 and self.elapsed > 0)
        if not self.cfg.safety.dry_run:
            self.driver.start_tracking(self.cfg.action_mode)
        self.watchdog.reset()
        self.watchdog.arm()

    def reset(self, seed: int | list[int] | None = None, reset_state_ids: list[int] | None = None) -> Obs:
        self.watchdog.disarm()
        self.driver.stop()
        if self.cfg.home_on_reset and not self.cfg.safety.dry_run:
            self.driver.move_home()
        self.elapsed, self._success = 0, False
        self.stepper.start_episodes()
        self.intervention_steps = self.takeovers = 0
        self._intervening = False
        if self.operator_stop is not None:
            self.operator_stop.clear()
        self._start()
        self._prepare_episode(seed)
        obs = self._observe()
        for hook in (self.operator, self.reward_fn):
            if hook is not None and hasattr(hook, "on_reset"):
                hook.on_reset(self)
        return obs

    def mark_success(self) -> None:
        """Operator (or an external detector) says the task succeeded; ends the episode at the next step."""
        self._success = True

    def recover(self) -> None:
        """Clear a fault / watchdog stop and resume tracking from where the arm rests."""
        log.warning("recovering the arm (%s)", self.watchdog.trip_reason or "link fault")
        if not self.driver.recover():
            raise RobotLinkError("the robot refused error recovery; check Desk for the error and unlock the arm")
        self.recoveries += 1
        self._start()

    # -- stepping -----------------------------------------------------------------------------------
    # -- stepping: the per-step protocol of the chunk stepper ------------------------------------------
    def begin_chunk(self) -> None:
        """Recover from a watchdog stop or fault since the last chunk, and start the chunk's deadline."""
        if self._obs is None:
            raise EnvError("call reset() before chunk_step()")
        if self.watchdog.tripped or (not self.cfg.safety.dry_run and not self.driver.tracking):
            if not self.cfg.recover_on_fault:
                raise RobotLinkError(f"arm stopped ({self.watchdog.trip_reason}); set env.recover_on_fault=true")
            self.recover()
            self._observe()
        self.watchdog.kick()
        self._fault = None
        self._t_next = time.perf_counter()

    def _outcome(self, reward: float = 0.0, success: bool = False, truncated: bool = False,
                 executed: bool = True) -> StepOutcome:
        return StepOutcome(reward=np.array([reward]), terminated=np.array([success]),
                           truncated=np.array([truncated]), success=np.array([success]),
                           executed=np.array([executed]))

    def step_once(self, actions: np.ndarray, active: np.ndarray) -> StepOutcome:
        """One action through the safety layer, held for ``1 / policy_hz`` s. Success ends the episode
        (terminated); an operator stop or a link fault ends it before the action runs, a watchdog trip
        after it (truncated)."""
        if self.operator_stop is not None and self.operator_stop.triggered:
            self.driver.stop()
            self._fault = "operator stop"
            return self._outcome(truncated=True, executed=False)
        policy_action = actions[0]
        obs_before, prev = self._obs, self.safety.last
        command, intervened = self._command(policy_action)
        target, clamps = self.safety.filter(command)
        try:
            if self.cfg.safety.dry_run:
                log.info("dry run: would send %s", _describe(target, self.cfg.action_mode))
            else:
                self.driver.track(target, self.cfg.action_mode)
            self._t_next += self.dt
            time.sleep(max(0.0, self._t_next - time.perf_counter()))
            self.watchdog.kick()
            self._observe()
        except RobotLinkError as exc:
            log.error("robot fault during step: %s", exc)
            self.driver.stop()
            self._fault = str(exc)
            return self._outcome(truncated=True, executed=False)
        finally:
            if self.watchdog.tripped and self._fault is None:
                self._fault = self.watchdog.trip_reason
        self.elapsed += 1
        reward, self._success = self._step_reward()
        if self.recorder is not None:
            self.recorder.add_step(StepRecord(obs_before, policy_action.astype(np.float32),
                                              self.safety.executed_action(prev, target), clamps, time.time(),
                                              intervened, float(np.float32(reward))))
        # a watchdog trip mid-chunk (link lost) ends the episode after this step
        return self._outcome(reward, self._success, truncated=self._fault is not None)

    def observe(self) -> Obs:
        return self._obs

    def end_chunk(self, done: np.ndarray, episode: dict[str, np.ndarray]) -> None:
        """Record a finished episode and go home for the next one (unless a fault stopped the arm)."""
        self.watchdog.kick()  # the deadline for the next chunk starts now
        fault = self._fault
        if bool(done[0]):
            if self.recorder is not None:
                self.recorder.end_episode({"success": bool(episode["success_once"][0] > 0),
                                           "fault": fault or "", "episode_len": self.elapsed,
                                           "instruction": self.cfg.instruction, **self._episode_extra()})
            self.watchdog.disarm()
            if self.cfg.auto_reset and fault is None:
                self.reset()
        self.last_fault = fault

    def close(self) -> None:
        self.watchdog.close()
        try:
            self.driver.close()
        finally:
            for cam in self.cameras:
                cam.close()


def _describe(target: Target, mode: str) -> str:
    if mode == "joint":
        return f"q={np.round(target.q, 4).tolist()} gripper_closed={target.gripper_closed}"
    return f"pos={np.round(target.pos, 4).tolist()} quat={np.round(target.quat, 4).tolist()} gripper_closed={target.gripper_closed}"
