"""The LeRobot v3.0 writer: the published layout, lossless and AV1 round trips through vlarl's reader, the
statistics and episode table LeRobot's tools read, and its refusals (mismatched episodes, existing datasets).
LeRobot's own reader loading these files is ``scripts/check_lerobot_reader.py`` (slow test below)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vlarl.data.lerobot_v3 import read_episode_table, read_lerobot_dataset, read_tasks
from vlarl.data.lerobot_writer import LeRobotDatasetWriter

pytest.importorskip("pyarrow")
ROOT = Path(__file__).resolve().parents[2]
LENGTHS = [5, 3, 4, 6]
TASKS = ["push the cube to the goal", "pick up the red cube"]


def _frames(ep: int, L: int, H: int = 48, W: int = 64) -> np.ndarray:
    """Smooth frames whose brightness and colour encode (episode, frame): survives lossy AV1 coding."""
    yy, xx = np.mgrid[0:H, 0:W] / max(H, W)
    out = [np.stack([40 + 30 * ep + 8 * t + 40 * xx, 40 + 30 * ep + 8 * t + 40 * yy, np.full_like(xx, 200 - 20 * ep)],
                    -1) for t in range(L)]
    return np.clip(np.stack(out), 0, 255).astype(np.uint8)


def _episodes() -> list[dict]:
    rng = np.random.default_rng(0)
    return [{"task": TASKS[i % 2], "state": rng.normal(size=(L, 5)).astype(np.float32),
             "actions": rng.uniform(-1, 1, size=(L, 3)).astype(np.float32),
             "rewards": rng.normal(size=L).astype(np.float32), "success": i % 2 == 0,
             "images": {"top": _frames(i, L), "wrist": _frames(i, L, 32, 32)[:, ::-1].copy()},
             "extra": {"quality/mean_squared_jerk": 0.5 * i, "quality/return": float(i)}}
            for i, L in enumerate(LENGTHS)]


def _write(root: Path, episodes: list[dict], **kw) -> Path:
    with LeRobotDatasetWriter(root, fps=10, robot_type="panda", **kw) as w:
        for e in episodes:
            w.add_episode(**e)
    return w.root


@pytest.fixture(scope="module")
def lossless(tmp_path_factory):
    eps = _episodes()
    # two episodes per file and one file per chunk: episodes share files and a second chunk exists
    return _write(tmp_path_factory.mktemp("ds") / "pushcube", eps, codec="lossless", episodes_per_file=2,
                  chunks_size=1), eps


def test_layout_info_and_tasks_are_lerobot_v3(lossless):
    root, eps = lossless
    for f in ("meta/info.json", "meta/stats.json", "meta/tasks.parquet", "meta/episodes/chunk-000/file-000.parquet",
              "data/chunk-000/file-000.parquet", "data/chunk-001/file-000.parquet",
              "videos/observation.images.top/chunk-000/file-000.mp4",
              "videos/observation.images.wrist/chunk-001/file-000.mp4"):
        assert (root / f).is_file(), f
    assert not any(p.name.startswith(".pushcube.partial") for p in root.parent.iterdir())  # moved into place
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_frames"] == sum(LENGTHS)
    assert info["total_episodes"] == len(LENGTHS) and info["total_tasks"] == 2 and info["splits"] == {"train": "0:4"}
    feats = info["features"]
    assert feats["observation.state"]["shape"] == [5] and feats["action"]["shape"] == [3]
    assert feats["observation.images.top"]["dtype"] == "video" and feats["observation.images.top"]["shape"] == [48, 64, 3]
    assert feats["observation.images.top"]["info"]["video.codec"] == "h264"
    assert {"next.reward", "next.done", "timestamp", "frame_index", "episode_index", "index", "task_index"} <= set(feats)
    assert read_tasks(root) == {0: TASKS[0], 1: TASKS[1]}
    import pyarrow.parquet as pq

    t = pq.read_table(root / "meta" / "tasks.parquet")
    assert t.schema.pandas_metadata["index_columns"] == ["task"]  # pandas (LeRobot) reads the task as the index
    data = pq.read_table(root / "data" / "chunk-001" / "file-000.parquet").to_pydict()
    assert data["index"] == list(range(8, 18)) and data["episode_index"] == [2] * 4 + [3] * 6
    assert data["next.done"] == [False] * 3 + [True] + [False] * 5 + [True]
    np.testing.assert_allclose(data["timestamp"][:4], [0.0, 0.1, 0.2, 0.3], atol=1e-7)


def test_lossless_round_trip_is_bit_identical(lossless):
    root, ref = lossless
    eps = read_lerobot_dataset(root)
    assert [e.episode_index for e in eps] == list(range(len(LENGTHS)))
    for e, r in zip(eps, ref, strict=True):
        np.testing.assert_array_equal(e.state, r["state"])
        np.testing.assert_array_equal(e.actions, r["actions"])
        assert e.instruction == r["task"]
        for cam in ("top", "wrist"):
            np.testing.assert_array_equal(e.images[cam], r["images"][cam])
        assert e.meta == {"success": r["success"], **r["extra"]}


def test_episode_table_and_statistics(lossless):
    root, ref = lossless
    rows = read_episode_table(root)
    assert [r["length"] for r in rows] == LENGTHS
    assert [(r["dataset_from_index"], r["dataset_to_index"]) for r in rows] == [(0, 5), (5, 8), (8, 12), (12, 18)]
    assert [(r["data/chunk_index"], r["data/file_index"]) for r in rows] == [(0, 0), (0, 0), (1, 0), (1, 0)]
    key = "videos/observation.images.top"
    assert [(r[f"{key}/from_timestamp"], r[f"{key}/to_timestamp"]) for r in rows] == [
        (0.0, 0.5), (0.5, 0.8), (0.0, 0.4), (0.4, 1.0)]  # per-file offsets
    import pyarrow.parquet as pq

    full = pq.read_table(root / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()
    np.testing.assert_allclose(full[1]["stats/action/mean"], ref[1]["actions"].mean(0), rtol=1e-6)
    stats = json.loads((root / "meta" / "stats.json").read_text())
    actions = np.concatenate([r["actions"] for r in ref]).astype(np.float64)
    np.testing.assert_allclose(stats["action"]["mean"], actions.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats["action"]["std"], actions.std(0), rtol=1e-6)
    np.testing.assert_allclose(stats["action"]["q99"], np.quantile(actions, 0.99, axis=0), rtol=1e-6)
    assert stats["action"]["count"] == [sum(LENGTHS)] and stats["index"]["max"] == [sum(LENGTHS) - 1]
    pixels = np.concatenate([r["images"]["top"] for r in ref]).reshape(-1, 3) / 255.0
    img = stats["observation.images.top"]
    assert np.array(img["mean"]).shape == (3, 1, 1)  # channel-first, as LeRobot normalizes images
    np.testing.assert_allclose(np.array(img["mean"]).ravel(), pixels.mean(0), rtol=1e-9)
    np.testing.assert_allclose(np.array(img["std"]).ravel(), pixels.std(0), rtol=1e-6)


def test_av1_round_trip_within_codec_tolerance(tmp_path):
    ref = _episodes()[:3]
    root = _write(tmp_path / "av1", ref, codec="av1")
    eps = read_lerobot_dataset(root)
    for e, r in zip(eps, ref, strict=True):
        np.testing.assert_array_equal(e.state, r["state"])  # parquet is exact whatever the codec
        assert np.abs(e.images["top"].astype(float) - r["images"]["top"]).mean() < 4.0  # AV1 is lossy
    # every decoded frame is closest to its own original among all frames (no off-by-one across episodes)
    originals = np.concatenate([r["images"]["top"] for r in ref]).astype(float)
    decoded = np.concatenate([e.images["top"] for e in eps]).astype(float)
    dist = np.abs(decoded[:, None] - originals[None]).mean((2, 3, 4))
    assert (dist.argmin(1) == np.arange(len(decoded))).all()
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["features"]["observation.images.top"]["info"]["video.codec"] == "av1"


def test_png_images_frame_only_episodes_and_a_one_dim_state(tmp_path):
    """PNG ``image`` features (no videos), episodes without state/actions (a critic's frames), a state of
    width 1 (LeRobot stores shape (1,) as a scalar column)."""
    frames = [_frames(i, L, 10, 12) for i, L in enumerate([3, 4])]
    with LeRobotDatasetWriter(tmp_path / "png", fps=5, images="png") as w:
        for i, f in enumerate(frames):
            w.add_episode("watch", state=np.arange(len(f), dtype=np.float32)[:, None], images={"cam": f},
                          success=bool(i))
    assert not (tmp_path / "png" / "videos").exists()
    eps = read_lerobot_dataset(tmp_path / "png", action_key=None)
    for e, f in zip(eps, frames, strict=True):
        np.testing.assert_array_equal(e.images["cam"], f)
        np.testing.assert_array_equal(e.state[:, 0], np.arange(len(f)))
        assert e.actions.shape == (len(f), 0)
    assert [e.meta["success"] for e in eps] == [False, True]


def test_refusals_name_the_problem_and_leave_no_files(tmp_path):
    ep = _episodes()[0]
    with pytest.raises(ValueError, match="codec='vp9' is unknown"):
        LeRobotDatasetWriter(tmp_path / "x", fps=10, codec="vp9")
    w = LeRobotDatasetWriter(tmp_path / "mixed", fps=10, codec="lossless")
    w.add_episode(**ep)
    with pytest.raises(ValueError, match="fixed"):
        w.add_episode(**{**ep, "actions": ep["actions"][:, :2]})
    with pytest.raises(ValueError, match="share one length"):
        w.add_episode(**{**ep, "rewards": ep["rewards"][:2]})
    with pytest.raises(ValueError, match="uint8"):
        w.add_episode(**{**ep, "images": {**ep["images"], "top": ep["images"]["top"].astype(np.float32)}})
    w.abort()
    assert list(tmp_path.iterdir()) == []  # an aborted writer leaves nothing
    odd = {**ep, "images": {"top": _frames(0, 5, 33, 64), "wrist": ep["images"]["wrist"]}}
    with pytest.raises(ValueError, match="even sizes"), LeRobotDatasetWriter(tmp_path / "odd", fps=10) as w:
        w.add_episode(**odd)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="no episodes"):
        LeRobotDatasetWriter(tmp_path / "empty", fps=10).close()


def test_existing_dataset_needs_overwrite_and_is_replaced_only_when_complete(tmp_path):
    eps = _episodes()
    root = _write(tmp_path / "ds", eps[:1], codec="lossless")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    with pytest.raises(FileExistsError, match="overwrite=True"):
        LeRobotDatasetWriter(root, fps=10)
    w = LeRobotDatasetWriter(root, fps=10, codec="lossless", overwrite=True)
    w.add_episode(**eps[1])
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before  # untouched until close()
    w.close()
    assert [e.instruction for e in read_lerobot_dataset(root)] == [eps[1]["task"]]


# -- producers: the robot recorder (writer injected) and the critic's saved episodes ----------------------
def test_robot_recorder_writes_executed_and_requested_actions_clamps_and_frames(tmp_path):
    from robots.franka_env import STATE_DIM, StepRecord
    from robots.recorder import LeRobotEpisodeRecorder
    from robots.safety import Clamp

    rng = np.random.default_rng(1)

    def step(t: int, clamps: int) -> StepRecord:
        obs = {"state": rng.normal(size=(1, STATE_DIM)).astype(np.float32),
               "images": {"base": rng.integers(0, 256, (1, 16, 24, 3), dtype=np.uint8)}, "instruction": ["push"]}
        asked = rng.uniform(-1, 1, 7).astype(np.float32)
        return StepRecord(obs, asked, np.clip(asked, -0.5, 0.5), [Clamp("velocity", [1.0], [0.5])] * clamps, t / 10)

    writer = LeRobotDatasetWriter(tmp_path / "robot", fps=10, robot_type="franka", codec="lossless")
    rec = LeRobotEpisodeRecorder(writer, instruction="push the cube")
    first = [step(t, t % 2) for t in range(4)]
    for s in first:
        rec.add_step(s)
    rec.end_episode({"success": True, "episode_len": 4})
    for t in range(2):
        rec.add_step(step(t, 0))
    assert not (tmp_path / "robot").exists()  # written on close
    rec.close()  # the interrupted second episode is kept, marked
    assert rec.path == tmp_path / "robot"
    eps = read_lerobot_dataset(rec.path)
    assert [len(e.actions) for e in eps] == [4, 2] and [e.instruction for e in eps] == ["push the cube"] * 2
    np.testing.assert_array_equal(eps[0].actions, np.stack([s.action for s in first]))
    np.testing.assert_array_equal(eps[0].state, np.concatenate([s.obs["state"] for s in first]))
    np.testing.assert_array_equal(eps[0].images["base"], np.concatenate([s.obs["images"]["base"] for s in first]))
    asked = read_lerobot_dataset(rec.path, action_key="policy_action", cameras=[])[0].actions
    np.testing.assert_array_equal(asked, np.stack([s.policy_action for s in first]))
    clamps = read_lerobot_dataset(rec.path, action_key="num_clamps", cameras=[])[0].actions
    assert clamps[:, 0].tolist() == [0, 1, 0, 1]
    assert eps[0].meta == {"success": True, "fault": "", "episode_len": 4}
    assert eps[1].meta == {"success": False, "fault": "interrupted", "episode_len": 2}


def test_critic_episodes_saved_as_lerobot_load_back_bit_identical(tmp_path):
    import torch

    from policies.episode import Episode
    from vlarl.data.critic_episodes import load_episodes, save_episodes

    g = torch.Generator().manual_seed(0)
    eps = [Episode(torch.randint(0, 256, (L, 16, 16, 3), generator=g, dtype=torch.uint8), "open the drawer",
                   bool(L % 2)) for L in (3, 5, 4)]
    root = save_episodes(tmp_path / "rollouts" / "rollout_00000", eps, fps=5)
    save_episodes(tmp_path / "rollouts" / "rollout_00001.npz", eps[:1])
    info = json.loads((root / "meta" / "info.json").read_text())
    assert "observation.images.camera" in info["features"] and "action" not in info["features"]
    back = load_episodes(root)
    for b, e in zip(back, eps, strict=True):
        assert torch.equal(b.frames, e.frames) and b.instruction == e.instruction and b.success == e.success
    assert len(load_episodes(tmp_path / "rollouts")) == 4  # a folder of npz files and datasets


@pytest.mark.slow
def test_lerobot_own_reader_loads_a_vlarl_dataset():
    """LeRobot 0.4.4's LeRobotDataset (in a venv of its own, made on first use) reads what vlarl wrote."""
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_lerobot_reader.py")], capture_output=True,
                       text=True, timeout=1500, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "all checks passed" in p.stdout and p.stdout.count("PASS") == 9
    assert "images.base          bit-identical" in p.stdout
