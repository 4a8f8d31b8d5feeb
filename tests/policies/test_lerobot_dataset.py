"""LeRobot dataset v3.0: a small real dataset (parquet + AV1 videos) written locally, read back as the same
``Episode`` objects as the ManiSkill HDF5 reader, and used for SFT through ``read_demonstrations``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from policies.vlm.lerobot_dataset import LeRobotEpisode, read_lerobot_dataset, write_lerobot_dataset
from policies.vlm.sft import Episode, read_demonstrations, sft_epoch

pytest.importorskip("pyarrow")
torch.set_num_threads(1)
LENGTHS = [5, 3, 4, 6]
TASKS = ["push the cube to the goal", "pick up the red cube"]


def _frames(ep: int, L: int, size: int = 64) -> np.ndarray:
    """Smooth frames whose brightness and colour encode (episode, frame): survives lossy AV1 coding."""
    yy, xx = np.mgrid[0:size, 0:size] / size
    out = []
    for t in range(L):
        base = 40 + 30 * ep + 8 * t
        img = np.stack([base + 40 * xx, base + 40 * yy, np.full_like(xx, 200 - 20 * ep)], -1)
        out.append(np.clip(img, 0, 255).astype(np.uint8))
    return np.stack(out)


def _episodes() -> list[LeRobotEpisode]:
    rng = np.random.default_rng(0)
    return [LeRobotEpisode(state=rng.normal(size=(L, 5)).astype(np.float32),
                           actions=rng.uniform(-1, 1, size=(L, 3)).astype(np.float32),
                           images={"top": _frames(i, L), "wrist": _frames(i, L)[:, ::-1].copy()},
                           instruction=TASKS[i % 2])
            for i, L in enumerate(LENGTHS)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    eps = _episodes()
    # two episodes per file and two files per chunk: episodes share files and a second chunk exists
    root = write_lerobot_dataset(tmp_path_factory.mktemp("ds") / "pushcube", eps, fps=10, episodes_per_file=2,
                                 chunks_size=1)
    return root, eps


def test_layout_is_lerobot_v3(dataset):
    root, _ = dataset
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_frames"] == sum(LENGTHS)
    for f in ("meta/tasks.parquet", "meta/episodes/chunk-000/file-000.parquet", "data/chunk-000/file-000.parquet",
              "data/chunk-001/file-000.parquet", "videos/observation.images.top/chunk-001/file-000.mp4"):
        assert (root / f).is_file(), f
    assert info["features"]["observation.images.top"]["dtype"] == "video"


def test_reads_back_states_actions_tasks_and_video_frames(dataset):
    root, ref = dataset
    eps = read_lerobot_dataset(root)
    assert [e.episode_index for e in eps] == list(range(len(LENGTHS)))
    for e, r in zip(eps, ref, strict=True):
        assert isinstance(e, Episode)
        np.testing.assert_array_equal(e.state, r.state)
        np.testing.assert_array_equal(e.actions, r.actions)
        assert e.instruction == r.instruction
        for cam in ("top", "wrist"):
            got, want = e.images[cam].astype(float), r.images[cam].astype(float)
            assert got.shape == want.shape
            assert np.abs(got - want).mean() < 4.0, f"episode {e.episode_index} {cam}: frames do not match"
    # every decoded frame is closest to its own original among all frames of the dataset (no off-by-one)
    originals = np.concatenate([r.images["top"] for r in ref]).astype(float)
    decoded = np.concatenate([e.images["top"] for e in eps]).astype(float)
    dist = np.abs(decoded[:, None] - originals[None]).mean((2, 3, 4))
    assert (dist.argmin(1) == np.arange(len(decoded))).all()


def test_selection_and_state_only_reading(dataset):
    root, ref = dataset
    eps = read_lerobot_dataset(root, episodes=[2, 3], cameras=[])
    assert [e.episode_index for e in eps] == [2, 3] and all(not e.images for e in eps)
    np.testing.assert_array_equal(eps[1].actions, ref[3].actions)
    assert len(read_lerobot_dataset(root, max_episodes=1, cameras=["wrist"])[0].images) == 1


def test_sft_runs_on_a_lerobot_dataset_via_read_demonstrations(dataset, tmp_path):
    from policies import make_policy
    from policies.base import PolicySpec
    from policies.flow_vla import FlowVLAConfig

    root, _ = dataset
    eps = read_demonstrations(root)
    assert len(eps) == len(LENGTHS) and isinstance(eps[0], LeRobotEpisode)
    spec = PolicySpec(state_dim=5, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3)
    pol = make_policy(FlowVLAConfig(chunk_size=2), spec)
    opt = torch.optim.Adam(pol.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    losses = [sft_epoch(pol, opt, eps, 6, TASKS[0], generator=g) for _ in range(4)]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    with pytest.raises(FileNotFoundError, match="neither a LeRobot dataset directory"):
        read_demonstrations(tmp_path / "nothing.txt")


def test_png_image_features_and_a_pandas_index_task_table(tmp_path):
    """LeRobot's other camera storage (PNG ``image`` features inside the data parquet) and the tasks table as
    pandas writes it (task strings in an index column named by the pandas metadata)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ref = _episodes()[:2]
    root = write_lerobot_dataset(tmp_path / "png", ref, fps=5, video=False)
    assert not (root / "videos").exists()
    meta = {b"pandas": json.dumps({"index_columns": ["__index_level_0__"], "columns": []}).encode()}
    tasks = pa.table({"task_index": pa.array([1, 0], pa.int64()), "__index_level_0__": [TASKS[1], TASKS[0]]})
    pq.write_table(tasks.replace_schema_metadata(meta), root / "meta" / "tasks.parquet")
    eps = read_lerobot_dataset(root)
    for e, r in zip(eps, ref, strict=True):
        assert e.instruction == r.instruction
        np.testing.assert_array_equal(e.images["wrist"], r.images["wrist"])  # PNG is lossless


def test_bad_datasets_name_the_problem(dataset, tmp_path):
    root, _ = dataset
    with pytest.raises(FileNotFoundError, match="no meta/info.json"):
        read_lerobot_dataset(tmp_path)
    with pytest.raises(KeyError, match="state_key"):
        read_lerobot_dataset(root, state_key="observation.qpos")
    with pytest.raises(KeyError, match="cameras"):
        read_lerobot_dataset(root, cameras=["side"])
    old = tmp_path / "old"
    (old / "meta").mkdir(parents=True)
    (old / "meta" / "info.json").write_text(json.dumps({"codebase_version": "v2.1", "features": {}}))
    with pytest.raises(ValueError, match="v2.1"):
        read_lerobot_dataset(old)
