"""``scripts/robot_soak.py``: a long learning run on franky-sim that checks the arm stays inside the real
controller's limits (issue 40).

    python scripts/robot_soak.py --episodes 250 --output outputs/robot_soak [train_hil key=value ...]

Starts franky-sim on a free loopback address (``robots.franky_sim``), runs ``vlarl.hil.run`` (the learner on, the
scripted operator, the graded protocol: what ``scripts/train_hil.py`` runs) for ``--episodes`` episodes, and records
* every commanded joint velocity: the safety layer's joint velocity of each target sent to the arm (through the
  FR3 kinematics in ``ee_delta``), against ``--limit-fraction`` (0.9) of the FR3's position-dependent limits;
* the measured joint velocities, read from the arm at ``--sample-hz`` on a thread of their own, against the same;
* the tool's tilt from vertical and its turn from the home orientation, sampled alike, per episode;
* every fault by kind (watchdog trips, recoveries, re-homings, start-motion faults, faults met in evaluations,
  episodes cut by a fault) and every run exit (an exception out of ``run``; the soak resumes the run after one).
Prints the fault table and the held-out success of each evaluation; writes ``<output>/soak.json``.
Bad input: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

DEFAULTS = ["chunk_size=2", "env.goal_radius=0.05", "hil.learner.bc_weight=1.0", "hil.interventions.device=scripted",
            "hil.interventions.protocol=graded", "hil.interventions.graded_episodes=[5,10]", "operator_stop=false",
            "env.safety.watchdog_timeout=1.0", "env.franky.home_dynamics_factor=0.3"]
SOAK_HOSTS = range(100, 250)  # 127.0.0.x for the soak's simulator (the tests use .10-.99: tests/robots/conftest.py)


class Monitor:
    """Commanded joint velocities (a spy on the driver's ``track``) and sampled measurements of the arm.

    The soak's instrument, not part of the loop: it wraps the driver's ``track`` / ``move_home`` and the safety
    layer's ``filter`` to count what passes through them (a spy at the hardware boundary, as the robot tests'
    ``SpyDriver``); ``vlarl.hil.run`` itself plugs nothing into the env but through ``FrankaEnv.hooks``."""

    def __init__(self, env: Any, sample_hz: float, limit_fraction: float):
        from robots import kinematics

        self.env, self.k, self.limit_fraction = env, kinematics, limit_fraction
        self.commanded: list[np.ndarray] = []  # [7] rad/s per command sent
        self.cmd_ratio: list[float] = []  # max over joints of |v| / FR3 position-dependent limit at that q
        self.measured_ratio: list[float] = []
        self.measured_max = np.zeros(7)
        self.tilt_vertical: list[float] = []  # deg, per sample
        self.tilt_home: list[float] = []
        self.episode_tilt: list[float] = []  # deg: the largest turn from home within each episode's control steps
        self._ep_tilt = 0.0
        self._stop = threading.Event()
        inner = env.driver.track

        def track(target: Any, mode: str) -> None:
            v = np.asarray(env.safety.joint_velocity, float).copy()
            self.commanded.append(v)
            self.cmd_ratio.append(self.ratio(env.safety.last.q if target.q is None else target.q, v))
            inner(target, mode)

        env.driver.track = track
        self.clamp_rules: Counter[str] = Counter()  # every clamp of the safety layer, start motions included
        filt = env.safety.filter

        def counted(action: Any) -> Any:
            target, clamps = filt(action)
            self.clamp_rules.update(c.rule for c in clamps)
            return target, clamps

        env.safety.filter = counted
        self.phase = "idle"  # idle | homing | tracking: where each measured sample was taken
        self.above_by_phase: Counter[str] = Counter()
        self.worst: tuple[float, list[float], list[float], str] = (0.0, [], [], "")  # ratio, q, dq, phase
        home = env.driver.move_home

        def move_home() -> None:
            self.phase = "homing"
            try:
                home()
            finally:
                self.phase = "idle"

        env.driver.move_home = move_home
        self.period = 1.0 / sample_hz
        self._thread = threading.Thread(target=self._sample, name="soak-monitor", daemon=True)
        self._thread.start()

    def ratio(self, q: np.ndarray, v: np.ndarray) -> float:
        lo, hi = self.k.velocity_limits(np.clip(q, self.k.FR3_Q_LOW, self.k.FR3_Q_HIGH))
        bound = np.where(v >= 0, hi, -lo)
        return float(np.max(np.abs(v) / np.maximum(bound, 0.05)))

    def _sample(self) -> None:
        from scipy.spatial.transform import Rotation

        while not self._stop.wait(self.period):
            try:
                r = self.env.driver.read()
            except Exception:  # the link is being re-established; the fault is counted elsewhere
                continue
            self.measured_max = np.maximum(self.measured_max, np.abs(r.dq))
            self.measured_ratio.append(self.ratio(r.q, r.dq))
            if self.measured_ratio[-1] > self.worst[0]:
                self.worst = (self.measured_ratio[-1], np.round(r.q, 3).tolist(), np.round(r.dq, 3).tolist(),
                              "episode" if self.env.elapsed else "start motion or reset")
            if self.measured_ratio[-1] > self.limit_fraction:
                phase = "tracking" if self.env.driver.tracking else self.phase
                self.above_by_phase[f"{phase}, {'episode' if self.env.elapsed else 'start motion'}"] += 1
            R = Rotation.from_quat(r.quat).as_matrix()
            self.tilt_vertical.append(float(np.degrees(self.k.tool_tilt(R))))
            turn = float(np.degrees(self.env.tilt(r.quat)))
            self.tilt_home.append(turn)
            if self.env.driver.tracking and self.env.elapsed > 0:
                self._ep_tilt = max(self._ep_tilt, turn)

    def end_episode(self) -> None:
        self.episode_tilt.append(self._ep_tilt)
        self._ep_tilt = 0.0

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def fault_kind(text: str) -> str:
    t = text.lower()
    for key, kind in (("late", "watchdog: policy step late"), ("link lost", "link lost"),
                      ("not under control", "command while not in control"), ("reflex", "reflex"),
                      ("did not come to rest", "not at rest in time"), ("recovery", "recovery refused")):
        if key in t:
            return kind
    return text.split(":")[0][:60] or "other"


def summarize(rows: list[dict[str, Any]], exits: list[str], env: Any, mon: Monitor, cfg: Any, args: Any,
              wall: float, host: str) -> dict[str, Any]:
    """What the soak measured so far (written after every episode, so a cut-short soak still reports)."""
    kinds: Counter[str] = Counter()
    for r in rows:
        if r.get("fault"):
            kinds[f"episode cut: {fault_kind(r['fault'])}"] += 1
        for f in r.get("recovered_faults", []):
            kinds[f"{'evaluation' if f.startswith('eval') else 'start motion'}: {fault_kind(f)}"] += 1
    kinds["watchdog trips"] = env.watchdog.trips
    kinds["recoveries"] = env.recoveries
    kinds["reconnects"] = env.driver.reconnects
    kinds["run exits"] = len(exits)
    evals = [(r["episode"], r["eval/success"]) for r in rows if "eval/success" in r]
    cmd, meas = np.asarray(mon.cmd_ratio), np.asarray(mon.measured_ratio)
    return {
        "complete": False, "episodes": len(rows), "wall_s": round(wall, 1), "host": host,
        "commands": len(cmd), "commanded_above_fraction": int((cmd > args.limit_fraction).sum()),
        "commanded_max_ratio": float(cmd.max()) if cmd.size else 0.0,
        "commanded_max_abs": np.abs(np.asarray(mon.commanded)).max(0).round(3).tolist() if mon.commanded else [],
        "samples": len(meas), "measured_above_fraction": int((meas > args.limit_fraction).sum()),
        "measured_max_ratio": float(meas.max()) if meas.size else 0.0,
        "measured_max_abs": mon.measured_max.round(3).tolist(),
        "measured_above_by_phase": dict(mon.above_by_phase),
        "measured_worst": {"ratio": mon.worst[0], "q": mon.worst[1], "dq": mon.worst[2], "phase": mon.worst[3]},
        "tilt_vertical_max_deg": max(mon.tilt_vertical, default=0.0),
        "episode_turn_from_home_max_deg": max(mon.episode_tilt, default=0.0),
        "episodes_outside_tilt_envelope": int(sum(t > cfg.env.max_tilt_deg for t in mon.episode_tilt)),
        "rehomes": env.rehomes, "start_faults": len(env.start_faults), "driver_ready_waits": env.driver.ready_waits,
        "faults": dict(kinds), "run_exits": exits, "evals": evals,
        "final_heldout_success": evals[-1][1] if evals else None,
        "clamps_by_rule": dict(mon.clamp_rules),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=250)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--output", default="outputs/robot_soak")
    ap.add_argument("--limit-fraction", type=float, default=0.9)
    ap.add_argument("--sample-hz", type=float, default=50.0)
    ap.add_argument("--max-run-exits", type=int, default=5, help="resumes after an exception before giving up")
    ap.add_argument("overrides", nargs="*", help="train_hil keys, key=value")
    args = ap.parse_args(argv)
    from robots.franky_driver import RobotLinkError
    from robots.franky_sim import franky_sim_executable, free_loopback_host, start_franky_sim, stop_franky_sim
    from robots.reach_task import FrankaReachEnv
    from vlarl.hil import run
    from vlarl.hil.cli import initial_policy, load_config, prologue
    from vlarl.hil.episodes import lerobot_writer

    prologue()
    try:
        if args.episodes < 1 or args.eval_every < 1 or args.eval_episodes < 1 or not 0 < args.limit_fraction <= 1:
            raise ValueError("--episodes, --eval-every and --eval-episodes must be >= 1, --limit-fraction in (0, 1]")
        out = Path(args.output)
        if out.exists() and any(out.iterdir()):
            raise ValueError(f"--output {out} is not empty; pass a new folder")
        franky_sim_executable()
        host = free_loopback_host(SOAK_HOSTS)
        cfg = load_config([*DEFAULTS, f"output={out / 'run'}", f"env.franky.ip={host}", f"hil.episodes={args.episodes}",
                           f"hil.eval_every={args.eval_every}", f"hil.eval_episodes={args.eval_episodes}",
                           *args.overrides])
    except ValueError as exc:
        print(f"robot_soak: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    sim = start_franky_sim(host, out / "franky_sim.log")
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    exits: list[str] = []
    env = FrankaReachEnv(cfg.env)
    mon = Monitor(env, args.sample_hz, args.limit_fraction)
    try:
        policy_dir = initial_policy(cfg, env)
        writer = lerobot_writer(int(cfg.env.policy_hz), cfg.video_codec)
        resume = False
        segment: list[dict[str, Any]] = []  # rows of the run segment in progress (run returns them at its end)

        def progress(row: dict[str, Any]) -> None:
            segment.append(row)
            mon.end_episode()
            partial = summarize([*rows, *segment], exits, env, mon, cfg, args, time.monotonic() - t0, host)
            (out / "soak.json").write_text(json.dumps(partial, indent=1))

        while True:
            try:
                segment.clear()
                run(cfg.hil, env, policy_dir, cfg.output, writer, resume=resume, on_episode=progress)
                rows.extend(segment)
                break
            except (RobotLinkError, RuntimeError) as exc:  # a run exit: counted, then resumed as a user would
                rows.extend(segment)
                exits.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                logging.error("run exit %d: %s; resuming", len(exits), exits[-1])
                if len(exits) > args.max_run_exits:
                    break
                resume = True
    finally:
        mon.close()
        env.close()
        stop_franky_sim(sim)
    summary = summarize(rows, exits, env, mon, cfg, args, time.monotonic() - t0, host)
    kinds, evals, wall = summary["faults"], summary["evals"], summary["wall_s"]
    cmd_n, meas_n = summary["commands"], summary["samples"]
    summary["complete"] = True
    (out / "soak.json").write_text(json.dumps(summary, indent=1))
    print(f"\nsoak: {len(rows)} episodes in {wall / 60:.1f} wall minutes on franky-sim at {host}")
    print(f"commanded joint velocities: {summary['commanded_above_fraction']} of {cmd_n} above "
          f"{args.limit_fraction} of the FR3 limits (max {summary['commanded_max_ratio']:.2f})")
    print(f"measured joint velocities:  {summary['measured_above_fraction']} of {meas_n} samples above "
          f"{args.limit_fraction} (max {summary['measured_max_ratio']:.2f}; per joint {summary['measured_max_abs']})")
    print(f"  where: {dict(mon.above_by_phase)}")
    print(f"tool: max {summary['tilt_vertical_max_deg']:.1f} deg from vertical; max turn from home in an episode "
          f"{summary['episode_turn_from_home_max_deg']:.1f} deg (envelope {cfg.env.max_tilt_deg}); "
          f"{summary['episodes_outside_tilt_envelope']} episodes outside; {env.rehomes} re-homings")
    print("fault kind                                   count")
    for kind, n in sorted(kinds.items()):
        print(f"{kind:44s} {n:5d}")
    print("episode  heldout_success")
    for e, s in evals:
        print(f"{e:7d}  {s:15.2f}")
    return 0
