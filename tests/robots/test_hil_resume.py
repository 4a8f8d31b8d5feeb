"""Killing the robot-side actor or the learner mid-run loses no recorded episode, and the run resumes.

The arm tests start ``scripts/train_hil.py`` as a process of its own against franky-sim (the real libfranka
protocol on a loopback address of its own), wait until episodes are on disk (polling the run directory: an event, not a timing), send
SIGKILL, and check what a real arm's operator would: every episode recorded before the kill still loads whole,
the resumed run goes on at the next episode number and finishes its budget, and the episodes at the end are those
before the kill plus those after. The tests without an arm check the pieces that make it so: durable publication
of each episode, the sweep of what a kill leaves half written, and a learner checkpoint that resumes exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from policies.base import PolicySpec
from policies.mlp import MLPPolicy, MLPPolicyConfig
from robots import recorder as recorder_module
from robots.franka_env import StepRecord
from robots.recorder import (
    EpisodeFolderRecorder,
    recorded_episodes,
    sweep_partial_episodes,
    sweep_temporaries,
)
from vlarl.data.lerobot_v3 import read_lerobot_dataset
from vlarl.data.lerobot_writer import LeRobotDatasetWriter
from vlarl.hil import LearnerConfig, RobotLearner
from vlarl.hil.episodes import read_episode
from vlarl.hil.host import CHECKPOINT, PROCESSES

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 300  # only so that a broken run fails instead of hanging; no assertion is about time
FRAME_FIELDS = ("observation.state", "action", "policy_action", "num_clamps", "intervention", "next.reward")
EPISODE_FIELDS = ("success", "fault", "episode_len", "intervention_steps", "takeovers", "stage", "policy_version",
                  "seed", "clamps", "final_state")


# -- the run as a process of its own ---------------------------------------------------------------------------
def _args(out: Path, host: str, episodes: int, use_ray: bool) -> list[str]:
    return [f"output={out}", f"env.franky.ip={host}", f"hil.episodes={episodes}",
            f"hil.use_ray={str(use_ray).lower()}", "chunk_size=4", "hidden=[32]", "env.policy_hz=20",
            "env.max_episode_steps=12", "env.max_start_steps=20", "env.safety.watchdog_timeout=2.0", "hil.eval_every=0", "hil.checkpoint_every=2",
            "hil.learner.batch_size=8", "hil.learner.min_buffer=2", "hil.learner.hidden=[32]",
            "hil.learner.updates_per_chunk=1.0", "hil.interventions.device=scripted",
            "hil.interventions.protocol=graded", "hil.interventions.graded_episodes=[1,1]"]


def _launch(args: list[str], log: Path, ray_tmp: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)  # never join another cluster on this machine
    if ray_tmp:
        env["RAY_TMPDIR"] = ray_tmp
    with open(log, "w") as f:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, str(ROOT / "scripts" / "train_hil.py"), *args], cwd=ROOT, stdout=f,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def _wait_for(proc: subprocess.Popen, log: Path, ready) -> None:
    """Poll until ``ready()`` (the run directory's state); fail if the run exits first."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the run exited ({proc.returncode}) before the awaited state: {log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            _kill_group(proc)
            pytest.fail(f"the awaited state did not come: {log.read_text()[-3000:]}")
        time.sleep(0.05)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _finish(proc: subprocess.Popen, log: Path) -> None:
    try:
        rc = proc.wait(HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        pytest.fail(f"the run did not finish: {log.read_text()[-3000:]}")
    assert rc == 0, log.read_text()[-3000:]


def _snapshot(path: Path) -> dict:
    """Every field of one recorded episode, as read back from disk."""
    ep = read_lerobot_dataset(path, cameras=[])[0]
    frames = {k: read_lerobot_dataset(path, state_key=None, action_key=k, cameras=[])[0].actions
              for k in FRAME_FIELDS}
    missing = [k for k in EPISODE_FIELDS if k not in ep.meta]
    assert not missing, f"{path.name} lacks {missing}"
    assert all(len(v) == ep.meta["episode_len"] for v in frames.values())
    return {"frames": frames, "meta": {k: ep.meta[k] for k in EPISODE_FIELDS}}


def _complete_rows(out: Path) -> int:
    p = out / "metrics.jsonl"
    return p.read_bytes().count(b"\n") if p.is_file() else 0


def _rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _check_finished_run(out: Path, budget: int, before: dict[str, dict]) -> list[dict]:
    """The run holds episodes 0..budget-1, each whole, one metrics row each; those recorded before the kill are
    unchanged; the learner's checkpoint counted every episode. Returns the metrics rows."""
    eps = recorded_episodes(out / "episodes")
    assert [p.name for p in eps] == [f"episode_{i:06d}" for i in range(budget)]
    assert not [p.name for p in (out / "episodes").iterdir() if p.name.startswith(".")]  # nothing half written
    after = {p.name: _snapshot(p) for p in eps}
    for name, snap in before.items():
        for k, v in snap["frames"].items():
            np.testing.assert_array_equal(after[name]["frames"][k], v)
        assert after[name]["meta"] == snap["meta"]
    assert [after[p.name]["meta"]["seed"] for p in eps] == list(range(budget))  # seed * 10_000 + k with seed 0
    stages = [after[p.name]["meta"]["stage"] for p in eps]
    assert stages[:2] == ["demo_replay", "return_and_explore"] and set(stages[2:]) == {"guided_exploration"}
    rows = _rows(out)
    assert sorted(r["episode"] for r in rows) == list(range(budget))
    ckpt = torch.load(out / CHECKPOINT, weights_only=False)
    assert ckpt["episodes"] == budget
    return rows


@pytest.mark.heavy
@pytest.mark.robot
def test_sigkill_of_the_actor_loses_no_recorded_episode_and_the_run_resumes(franky_sim, tmp_path):
    out, budget = tmp_path / "run", 4
    args = _args(out, franky_sim.host, budget, use_ray=False)
    proc = _launch(args, tmp_path / "first.log")
    # two episodes done (recorded, checkpointed, logged): the kill comes while the arm runs the third
    _wait_for(proc, tmp_path / "first.log", lambda: _complete_rows(out) >= 2)
    _kill_group(proc)  # SIGKILL: no handler runs, whatever it was doing
    assert proc.returncode == -signal.SIGKILL
    recorded = recorded_episodes(out / "episodes")
    n_before = len(recorded)
    assert 2 <= n_before < budget
    before = {p.name: _snapshot(p) for p in recorded}  # each loads whole, with every field

    # a kill in the middle of writing the last metrics row: that row is torn
    rows = _rows(out)
    last = rows[-1]
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    (out / "metrics.jsonl").write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])

    proc = _launch([*args, "resume=true"], tmp_path / "resumed.log")
    _finish(proc, tmp_path / "resumed.log")
    rows = _check_finished_run(out, budget, before)
    assert len(recorded_episodes(out / "episodes")) == n_before + (budget - n_before)
    fresh = [r["episode"] for r in rows if not r.get("rebuilt")]
    assert fresh[-(budget - n_before):] == list(range(n_before, budget))  # the resumed run numbered on
    (rebuilt,) = [r for r in rows if r["episode"] == last["episode"] and r.get("rebuilt")]
    for key in ("stage", "policy_version", "success", "return", "episode_len", "intervention_steps", "takeovers",
                "intervention_rate", "clamps", "robot_minutes", "fault"):
        want = last[key] if isinstance(last[key], str) else pytest.approx(last[key], rel=1e-5)
        assert rebuilt[key] == want, key  # the torn row, rebuilt from its episode


@pytest.mark.robot
@pytest.mark.slow
def test_sigkill_of_the_learner_actor_is_survived_by_the_robot_loop(franky_sim, tmp_path):
    pytest.importorskip("ray")
    out, budget = tmp_path / "run", 6
    ray_tmp = tempfile.mkdtemp(prefix="hil_ray_", dir="/tmp")  # Ray's socket paths are too long under tmp_path
    log = tmp_path / "run.log"
    try:
        proc = _launch(_args(out, franky_sim.host, budget, use_ray=True), log, ray_tmp)
        try:
            _wait_for(proc, log, lambda: len(recorded_episodes(out / "episodes")) >= 3 and (out / CHECKPOINT).exists())
            first = json.loads((out / PROCESSES).read_text())
            assert first["learner_pid"] != first["actor_pid"] == proc.pid
            before = {p.name: _snapshot(p) for p in recorded_episodes(out / "episodes")}
            os.kill(first["learner_pid"], signal.SIGKILL)  # only the learner: the robot-side actor keeps running
            _finish(proc, log)
        finally:
            _kill_group(proc)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    second = json.loads((out / PROCESSES).read_text())
    assert second["learner_restarts"] == 1 and second["learner_pid"] != first["learner_pid"]
    assert second["actor_pid"] == first["actor_pid"]  # the same process ran the whole budget
    rows = _check_finished_run(out, budget, before)
    assert not any(r.get("rebuilt") for r in rows)
    assert rows[-1]["learner_restarts"] == 1 and rows[-1]["learner/updates"] > 0
    assert "the learner died" in log.read_text()


# -- the pieces, without an arm ----------------------------------------------------------------------------------
def _step(t: int, intervened: bool = False) -> StepRecord:
    state = np.full((1, 15), t, np.float32)
    return StepRecord(obs={"state": state, "images": {}, "instruction": [""]}, policy_action=np.zeros(7, np.float32),
                      action=np.full(7, 0.01 * t, np.float32), clamps=[], t=float(t), intervened=intervened,
                      reward=-float(t))


def test_each_episode_is_fsynced_before_it_is_published(tmp_path, monkeypatch):
    synced: list[Path] = []
    real_fsync, real_replace = recorder_module._fsync_path, os.replace
    events: list[tuple[str, str]] = []
    monkeypatch.setattr(recorder_module, "_fsync_path", lambda p: (synced.append(Path(p)), real_fsync(p)))
    monkeypatch.setattr(recorder_module.os, "replace",
                        lambda a, b: (events.append(("rename", Path(b).name, len(synced))), real_replace(a, b)))
    rec = EpisodeFolderRecorder(tmp_path / "episodes", lambda p: LeRobotDatasetWriter(p, fps=10), instruction="reach",
                                final_state=lambda: np.zeros(15), episode_meta=lambda: {"stage": "demo_replay"})
    for t in range(4):
        rec.add_step(_step(t, intervened=t == 2))
    rec.end_episode({"success": True, "episode_len": 4, "intervention_steps": 1, "takeovers": 1})
    (path,) = recorded_episodes(tmp_path / "episodes")
    assert rec.last_path == path and path.name == "episode_000000"
    _, name, synced_before_rename = events[-1]
    assert name == path.name
    staged = tmp_path / "episodes" / ".episode_000000.staged"
    files = {p.relative_to(path) for p in path.rglob("*") if p.is_file()}
    assert files and files <= {p.relative_to(staged) for p in synced[:synced_before_rename] if p.is_relative_to(staged)}
    assert synced[-1] == tmp_path / "episodes"  # the rename itself made durable
    back = read_episode(path)
    assert back["intervention"].tolist() == [False, False, True, False] and back["meta"]["stage"] == "demo_replay"


def test_sweep_publishes_staged_episodes_and_removes_partial_files(tmp_path):
    root = tmp_path / "episodes"
    for i in range(2):  # two complete episodes
        with LeRobotDatasetWriter(root / f"episode_{i:06d}", fps=10) as w:
            w.add_episode("reach", state=np.zeros((3, 15), np.float32), actions=np.zeros((3, 7), np.float32))
    with LeRobotDatasetWriter(root / ".episode_000002.staged", fps=10) as w:  # complete, killed before the rename
        w.add_episode("reach", state=np.ones((3, 15), np.float32), actions=np.zeros((3, 7), np.float32))
    torn = LeRobotDatasetWriter(root / ".episode_000003.staged", fps=10)  # killed while writing its files
    torn.add_episode("reach", state=np.ones((2, 15), np.float32), actions=np.zeros((2, 7), np.float32))
    (root / ".episode_000004.staged").mkdir()  # a staging folder without its metadata: not an episode
    assert len(recorded_episodes(root)) == 2
    assert sweep_partial_episodes(root) == (1, 2)
    eps = recorded_episodes(root)
    assert [p.name for p in eps] == ["episode_000000", "episode_000001", "episode_000002"]
    assert read_lerobot_dataset(eps[2], cameras=[])[0].state.sum() == 3 * 15
    assert not [p for p in root.iterdir() if p.name.startswith(".")]
    (tmp_path / ".learner.pt.tmp-123").write_bytes(b"torn")  # a checkpoint write the kill cut short
    (tmp_path / ".policy.old-123").mkdir()  # the policy export swapped out just before the kill
    (tmp_path / "learner.pt").write_bytes(b"whole")
    assert sweep_temporaries(tmp_path) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["episodes", "learner.pt"]


def _episode(rng, L=6):
    return {"state": rng.normal(size=(L, 3)).astype(np.float32), "action": rng.uniform(-1, 1, (L, 2)).astype(np.float32),
            "reward": rng.normal(size=L).astype(np.float32), "intervention": rng.random(L) < 0.3,
            "final_state": np.zeros(3, np.float32), "terminated": False}


def _learner():
    torch.manual_seed(0)
    spec = PolicySpec(state_dim=3, action_dim=2, action_low=[-1, -1], action_high=[1, 1])
    policy = MLPPolicy(MLPPolicyConfig(hidden_sizes=[16], chunk_size=2, init_log_std=-1.0), spec)
    return RobotLearner(policy, LearnerConfig(batch_size=8, min_buffer=4, hidden=[16], updates_per_chunk=2.0))


def test_learner_resumed_from_its_checkpoint_and_the_recorded_episodes_continues_exactly(tmp_path):
    """A learner rebuilt as resume does it (checkpoint + every recorded episode, the checkpointed ones as seen,
    the later one as new) continues with the same buffers, normalization, counters and updates as the one that
    was killed would have."""
    rng = np.random.default_rng(0)
    episodes = [_episode(rng) for _ in range(5)]
    live = _learner()
    for ep in episodes[:4]:
        live.add_episode(ep)
        live.update()
    torch.save(live.state_dict(), tmp_path / "learner.pt")  # the checkpoint, after 4 episodes
    live.add_episode(episodes[4])  # recorded after the checkpoint; then the process is killed

    resumed = _learner()
    torch.rand(5)  # the fresh process's own draws must not matter: the checkpoint holds the RNG
    resumed.load_state_dict(torch.load(tmp_path / "learner.pt", weights_only=False))
    assert resumed.episodes == 4
    for i, ep in enumerate(episodes):
        resumed.add_episode(ep, seen=i < resumed.episodes)
    live_rng = torch.get_rng_state()  # one process-wide torch RNG here: both learners continue from the same draw
    m_live = live.update()
    torch.set_rng_state(live_rng)
    m_resumed = resumed.update()
    assert resumed.episodes == live.episodes == 5 and len(resumed.replay.online) == len(live.replay.online)
    for part in ("online", "demos"):
        a, b = getattr(live.replay, part), getattr(resumed.replay, part)
        assert len(a) == len(b) > 0
        for key in ("state", "actions", "step_rewards", "step_mask", "terminated", "truncated", "next_state"):
            torch.testing.assert_close(b.buffer.storage[: len(b)][key], a.buffer.storage[: len(a)][key])
    assert m_live and m_resumed["learner/q_loss"] == pytest.approx(m_live["learner/q_loss"], rel=1e-6)
    for (k, a), b in zip(live.policy.state_dict().items(), resumed.policy.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, msg=k)  # weights and the state normalization (not counted twice)
    assert resumed.version == live.version and resumed.updates == live.updates
