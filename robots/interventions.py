"""Human interventions: an operator device may take over the arm mid-episode; the graded protocol says when.

The env asks ``Operator.act(reading, policy_action)`` every control step (``FrankaEnv._command``): ``None`` lets
the policy's action through, an array replaces it. Either way the command then passes the safety layer, and the
env records the executed action with ``intervened`` set, counts ``intervention_steps`` and ``takeovers``.

Devices (where the operator's actions come from):
* ``scripted``: a stand-in for a human, for tests and measurements on franky-sim: it watches the distance of
  the EE from the straight line start -> goal (start = the EE at the episode's first step) and, outside ``corridor_width``, steers back toward the line and
  on to the goal (a P-step, ``gain * error``), until the EE is within ``release_width`` again.
* ``keyboard``: a human at a terminal; one character per command on a stream (stdin by default):
  ``t`` take over / hand back, ``w/s`` +x/-x, ``a/d`` +y/-y, ``r/f`` +z/-z (held until another key),
  space = hold still, ``y`` = success (``env.mark_success``), ``x`` = stop the arm (``env.operator_stop``).

The graded protocol (VLAC's human-in-the-loop schedule), ``hil.protocol``:
* ``demo_replay``: the operator drives whole episodes (demonstrations, the policy's actions are recorded only
  as ``policy_action``);
* ``return_and_explore``: the operator drives the arm part of the way (``return_fraction`` of the distance to
  the goal, or until a keyboard operator hands back), then the policy explores from there, untouched;
* ``guided_exploration``: the policy acts and the operator corrects it when it strays (scripted: the corridor;
  keyboard: while taken over);
* ``graded``: ``graded_episodes = [n_demo, n_return]``: the first n_demo episodes demo_replay, the next
  n_return return_and_explore, then guided_exploration;
* ``none``: the operator never acts (evaluation).
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import numpy as np

log = logging.getLogger(__name__)

PROTOCOLS = ("none", "demo_replay", "return_and_explore", "guided_exploration", "graded")
DEVICES = ("none", "scripted", "keyboard")


@dataclass
class InterventionConfig:
    device: str = "none"  # "none" | "scripted" | "keyboard"
    protocol: str = "guided_exploration"  # one of PROTOCOLS (see the module docstring)
    graded_episodes: list[int] = field(default_factory=lambda: [5, 10])  # graded: [demo_replay, return_and_explore]
    corridor_width: float = 0.06  # m: the scripted operator takes over beyond this distance from the line
    release_width: float = 0.02  # m: ... and hands back within this
    return_fraction: float = 0.5  # return_and_explore: share of the start->goal distance the operator drives
    gain: float = 1.0  # scripted P-step: action = gain * error (the safety layer clamps it)
    lookahead: float = 0.05  # m: the scripted operator aims this far along the line past the EE's projection
    key_step: float = 0.02  # m per control step while a keyboard motion key is held

    def validate(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"hil.interventions.device='{self.device}' is unknown; choose one of {list(DEVICES)}")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"hil.interventions.protocol='{self.protocol}' is unknown; choose one of {list(PROTOCOLS)}")
        if len(self.graded_episodes) != 2 or min(self.graded_episodes) < 0:
            raise ValueError(f"hil.interventions.graded_episodes={list(self.graded_episodes)} must be two counts >= 0 "
                             "([demo_replay episodes, return_and_explore episodes])")
        if not 0 < self.release_width <= self.corridor_width:
            raise ValueError(f"hil.interventions needs 0 < release_width ({self.release_width}) <= corridor_width "
                             f"({self.corridor_width})")


def stage(cfg: InterventionConfig, episode: int) -> str:
    """The protocol stage of episode ``episode`` (0-based): graded moves through the three stages."""
    if cfg.protocol != "graded":
        return cfg.protocol
    n_demo, n_return = cfg.graded_episodes
    if episode < n_demo:
        return "demo_replay"
    return "return_and_explore" if episode < n_demo + n_return else "guided_exploration"


class Device(Protocol):
    """Where an operator's actions come from."""

    def on_reset(self, env: Any) -> None: ...

    def wants_control(self, reading: Any) -> bool:
        """Guided exploration: does the operator take (or keep) the arm at this step?"""

    def action(self, reading: Any, policy_action: np.ndarray) -> np.ndarray:
        """The operator's action [A] in the env's action mode."""

    def handed_back(self, reading: Any) -> bool:
        """Return-and-explore: has the operator finished bringing the arm along?"""


class ScriptedCorridorOperator:
    """Steers back into a corridor around the line start -> goal (``env.start``, ``env.goal``; reach task)."""

    def __init__(self, cfg: InterventionConfig):
        self.cfg = cfg
        self.start = self.goal = np.zeros(3)
        self._in_control = False

    def on_reset(self, env: Any) -> None:
        # the line runs from where the arm actually is at the episode's first step (the start motion may stop short)
        self.start, self.goal = np.asarray(env._reading.pos, float).copy(), np.asarray(env.goal, float)
        self._in_control = False

    def _line(self, pos: np.ndarray) -> tuple[float, float]:
        """(distance from the segment start->goal, progress along it in [0, 1])."""
        seg = self.goal - self.start
        n2 = float(seg @ seg)
        s = 0.0 if n2 < 1e-12 else float(np.clip((pos - self.start) @ seg / n2, 0.0, 1.0))
        return float(np.linalg.norm(pos - (self.start + s * seg))), s

    def wants_control(self, reading: Any) -> bool:
        dist, _ = self._line(np.asarray(reading.pos))
        if self._in_control:
            self._in_control = dist > self.cfg.release_width
        else:
            self._in_control = dist > self.cfg.corridor_width
        return self._in_control

    def action(self, reading: Any, policy_action: np.ndarray) -> np.ndarray:
        pos = np.asarray(reading.pos, float)
        seg = self.goal - self.start
        length = float(np.linalg.norm(seg))
        _, s = self._line(pos)
        aim = self.goal if length < 1e-9 else self.start + min(1.0, s + self.cfg.lookahead / length) * seg
        out = np.zeros_like(np.asarray(policy_action, np.float32))
        out[:3] = self.cfg.gain * (aim - pos)
        return out

    def handed_back(self, reading: Any) -> bool:
        _, s = self._line(np.asarray(reading.pos))
        return s >= self.cfg.return_fraction


_KEY_AXES = {"w": (0, 1.0), "s": (0, -1.0), "a": (1, 1.0), "d": (1, -1.0), "r": (2, 1.0), "f": (2, -1.0)}


class KeyboardOperator:
    """A human at a terminal (see the module docstring for the keys). Reads ``stream`` on a daemon thread."""

    def __init__(self, cfg: InterventionConfig, stream: IO[str] | None = None):
        self.cfg = cfg
        self.env: Any = None
        self._taken = False
        self._velocity = np.zeros(3)
        self._lock = threading.Lock()
        self._stream = stream if stream is not None else sys.stdin
        threading.Thread(target=self._run, name="operator-keyboard", daemon=True).start()

    def _run(self) -> None:
        while True:
            ch = self._stream.read(1)
            if not ch:
                return
            self.press(ch)

    def press(self, key: str) -> None:
        """Apply one key (the reader thread calls this; so can a GUI)."""
        key = key.lower()
        with self._lock:
            if key == "t":
                self._taken = not self._taken
                self._velocity[:] = 0.0
                log.warning("operator %s", "takes over" if self._taken else "hands back")
            elif key in _KEY_AXES:
                axis, sign = _KEY_AXES[key]
                self._velocity[:] = 0.0
                self._velocity[axis] = sign * self.cfg.key_step
            elif key == " ":
                self._velocity[:] = 0.0
            elif key == "y" and self.env is not None:
                self.env.mark_success()
            elif key == "x" and self.env is not None and self.env.operator_stop is not None:
                self.env.operator_stop.trigger()

    def on_reset(self, env: Any) -> None:
        self.env = env
        with self._lock:
            self._velocity[:] = 0.0

    def wants_control(self, reading: Any) -> bool:
        return self._taken

    def action(self, reading: Any, policy_action: np.ndarray) -> np.ndarray:
        out = np.zeros_like(np.asarray(policy_action, np.float32))
        with self._lock:
            out[:3] = self._velocity
        return out

    def handed_back(self, reading: Any) -> bool:
        return not self._taken


class ProtocolOperator:
    """What the env calls (``env.operator``): a device under the graded protocol. ``episode`` counts resets."""

    def __init__(self, cfg: InterventionConfig, device: Device, first_episode: int = 0):
        cfg.validate()
        self.cfg, self.device = cfg, device
        self.episode = first_episode - 1
        self.stage = "none"
        self._returning = False

    def on_reset(self, env: Any) -> None:
        self.episode += 1
        self.stage = stage(self.cfg, self.episode)
        self._returning = self.stage == "return_and_explore"
        self.device.on_reset(env)

    def act(self, reading: Any, policy_action: np.ndarray) -> np.ndarray | None:
        if self.stage == "demo_replay":
            return self.device.action(reading, policy_action)
        if self.stage == "return_and_explore":
            if self._returning and not self.device.handed_back(reading):
                return self.device.action(reading, policy_action)
            self._returning = False
            return None
        if self.stage == "guided_exploration" and self.device.wants_control(reading):
            return self.device.action(reading, policy_action)
        return None


def make_operator(cfg: InterventionConfig, stream: IO[str] | None = None, first_episode: int = 0) -> ProtocolOperator | None:
    """The operator of ``hil.interventions`` (None for device ``none``)."""
    cfg.validate()
    if cfg.device == "none":
        return None
    device: Device = ScriptedCorridorOperator(cfg) if cfg.device == "scripted" else KeyboardOperator(cfg, stream)
    return ProtocolOperator(cfg, device, first_episode)
