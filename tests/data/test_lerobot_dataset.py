"""Reading LeRobot dataset v3.0 for SFT: a small real dataset (parquet + AV1 videos) written locally, read back
as episodes with ``state``/``actions`` like the ManiSkill HDF5 reader's, selected by episode and camera, and used
for SFT through ``read_demonstrations``; the tasks table as pandas writes it; datasets that are not v3.0."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vlarl.data.demonstrations import LeRobotEpisode, read_demonstrations, read_lerobot_dataset
from vlarl.data.lerobot_writer import LeRobotDatasetWriter, write_lerobot_dataset
from vlarl.data.sft import sft_epoch

pytest.importorskip("pyarrow")
torch.set_num_threads(1)
LENGTHS = [5, 3, 4, 6]
TASKS = ["push the cube to the goal", "pick up the red cube"]


def _episodes() -> list[LeRobotEpisode]:
    rng = np.random.default_rng(0)
    return [LeRobotEpisode(state=rng.normal(size=(L, 5)).astype(np.float32),
                           actions=rng.uniform(-1, 1, size=(L, 3)).astype(np.float32),
                           images={"top": rng.integers(0, 256, (L, 16, 16, 3), dtype=np.uint8),
                                   "wrist": rng.integers(0, 256, (L, 8, 8, 3), dtype=np.uint8)},
                           instruction=TASKS[i % 2])
            for i, L in enumerate(LENGTHS)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    eps = _episodes()
    root = write_lerobot_dataset(tmp_path_factory.mktemp("ds") / "pushcube", eps, fps=10, codec="av1",
                                 episodes_per_file=2, chunks_size=1)
    return root, eps


def test_selection_and_state_only_reading(dataset):
    root, ref = dataset
    eps = read_lerobot_dataset(root, episodes=[2, 3], cameras=[])
    assert [e.episode_index for e in eps] == [2, 3] and all(not e.images for e in eps)
    np.testing.assert_array_equal(eps[1].actions, ref[3].actions)
    np.testing.assert_array_equal(eps[0].state, ref[2].state)
    one = read_lerobot_dataset(root, max_episodes=1, cameras=["wrist"])
    assert len(one) == 1 and list(one[0].images) == ["wrist"] and one[0].images["wrist"].shape == (5, 8, 8, 3)


def test_sft_runs_on_a_lerobot_dataset_via_read_demonstrations(dataset, tmp_path):
    from policies import make_policy
    from policies.base import PolicySpec
    from policies.flow_vla import FlowVLAConfig

    root, _ = dataset
    eps = read_demonstrations(root, cameras=[])
    assert len(eps) == len(LENGTHS) and isinstance(eps[0], LeRobotEpisode)
    assert [e.instruction for e in eps] == [TASKS[i % 2] for i in range(len(LENGTHS))]
    spec = PolicySpec(state_dim=5, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3)
    pol = make_policy(FlowVLAConfig(chunk_size=2), spec)
    opt = torch.optim.Adam(pol.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    losses = [sft_epoch(pol, opt, eps, 6, TASKS[0], generator=g) for _ in range(4)]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    with pytest.raises(FileNotFoundError, match="neither a LeRobot dataset directory"):
        read_demonstrations(tmp_path / "nothing.txt")


def test_a_pandas_index_task_table_written_by_another_tool(tmp_path):
    """The tasks table with the task strings in pandas' default index column (``__index_level_0__``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ref = _episodes()[:2]
    with LeRobotDatasetWriter(tmp_path / "png", fps=5, images="png") as w:
        for e in ref:
            w.add_episode(e.instruction, state=e.state, actions=e.actions, images=e.images)
    meta = {b"pandas": json.dumps({"index_columns": ["__index_level_0__"], "columns": []}).encode()}
    tasks = pa.table({"task_index": pa.array([1, 0], pa.int64()), "__index_level_0__": [TASKS[1], TASKS[0]]})
    pq.write_table(tasks.replace_schema_metadata(meta), tmp_path / "png" / "meta" / "tasks.parquet")
    eps = read_lerobot_dataset(tmp_path / "png")
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
    (root / "videos" / "observation.images.top" / "chunk-001" / "file-000.mp4").rename(tmp_path / "moved.mp4")
    try:
        with pytest.raises(FileNotFoundError, match="incomplete"):
            read_lerobot_dataset(root, episodes=[3])
    finally:
        (tmp_path / "moved.mp4").rename(root / "videos" / "observation.images.top" / "chunk-001" / "file-000.mp4")
