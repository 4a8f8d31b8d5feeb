"""The LeRobot dataset v3.0 layout, and its reader.

v3.0 packs many episodes per file and finds each one through relational metadata:

    meta/info.json                               codebase_version "v3.0", fps, features, path templates
    meta/stats.json                              per-feature min/max/mean/std/count (+ quantiles) over the dataset
    meta/tasks.parquet                           task string (pandas index) <-> task_index
    meta/episodes/chunk-XXX/file-XXX.parquet     one row per episode: length, tasks, data/chunk_index,
                                                 data/file_index, dataset_from_index, dataset_to_index,
                                                 videos/<camera>/{chunk_index, file_index, from_timestamp,
                                                 to_timestamp}, stats/<feature>/<stat>, and any extra columns
    data/chunk-XXX/file-XXX.parquet              one row per frame: observation.state (+ environment_state), action, timestamp,
                                                 frame_index, episode_index, index, task_index, ...
    videos/<camera>/chunk-XXX/file-XXX.mp4       the camera stream of consecutive episodes

Videos are decoded with the ffmpeg binary that ``imageio-ffmpeg`` (a core dependency) ships (dav1d for AV1,
h264 for the lossless ``libx264rgb`` streams the writer can make), so no PyAV/torchcodec is needed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

CODEBASE_VERSION = "v3.0"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes"
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
EPISODES_PATH = EPISODES_DIR + "/" + CHUNK_FILE + ".parquet"
DATA_PATH = "data/" + CHUNK_FILE + ".parquet"
VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"
IMAGE_PREFIX = "observation.images."
STATE_KEY, ACTION_KEY = "observation.state", "action"
ENV_STATE_KEY = "observation.environment_state"  # LeRobot's name for the non-proprioceptive state (object poses...)
# info.json key (vlarl's): feature -> the env-state indices of its columns, when a writer split the env's state
STATE_ORDER = "state_order"
# the per-frame index columns every v3.0 dataset has (LeRobot's DEFAULT_FEATURES)
INDEX_FEATURES = {"timestamp": "float32", "frame_index": "int64", "episode_index": "int64", "index": "int64",
                  "task_index": "int64"}
# episode-table columns that locate data; everything else in a row (success, quality/...) is episode metadata
_LOCATION_PREFIXES = ("data/", "videos/", "meta/", "stats/", "dataset_")
_LOCATION_KEYS = ("episode_index", "tasks", "length")


@dataclass
class LeRobotEpisode:
    """One episode: state [L, D] and actions [L, A] (D / A = 0 where the dataset has none), camera frames
    uint8 [L, H, W, 3], the task, and the episode table's extra columns (``success``, ``quality/...``)."""

    state: np.ndarray
    actions: np.ndarray
    images: dict[str, np.ndarray] = field(default_factory=dict)
    instruction: str = ""
    episode_index: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


def pq():
    """``pyarrow.parquet``, or a one-line error naming the fix."""
    try:
        import pyarrow.parquet as parquet
    except ImportError as e:
        raise ModuleNotFoundError("LeRobot datasets need pyarrow: pip install pyarrow") from e
    return parquet


def read_info(root: str | os.PathLike) -> dict[str, Any]:
    """``meta/info.json`` of a v3.x dataset; one-line errors for a folder that is not one."""
    root = Path(root)
    if not (root / INFO_PATH).is_file():
        raise FileNotFoundError(f"'{root}' is not a LeRobot dataset (no {INFO_PATH}); pass the dataset's root folder")
    info = json.loads((root / INFO_PATH).read_text())
    version = str(info.get("codebase_version", "?"))
    if not version.startswith("v3"):
        raise ValueError(f"'{root}' is LeRobot format {version}; this reader reads v3.0 (convert the dataset "
                         f"with LeRobot's v2.1 -> v3.0 converter)")
    return info


def _matrix(table, key: str) -> np.ndarray:
    """A list / fixed-size-list column -> float32 [rows, dim]; a scalar column (a shape (1,) feature) -> [rows, 1]."""
    col = table.column(key).combine_chunks()
    if not hasattr(col, "flatten"):
        return np.array(col.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, 1)
    flat = np.array(col.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)  # a writable copy
    return flat.reshape(len(col), -1)


def _state(table, order: dict[str, list[int]]) -> np.ndarray:
    """The env's state [rows, D] put back together from split features (``order``: feature -> env indices)."""
    D = sum(len(idx) for idx in order.values())
    out = np.empty((table.num_rows, D), np.float32)
    for key, idx in order.items():
        out[:, idx] = _matrix(table, key)
    return out


def read_tasks(root: Path) -> dict[int, str]:
    """task_index -> task; the task string is a column 'task' or the pandas index LeRobot writes."""
    table = pq().read_table(root / TASKS_PATH)
    names = [n for n in table.column_names if n != "task_index"]
    meta = table.schema.pandas_metadata or {}
    index_cols = [c for c in meta.get("index_columns", []) if isinstance(c, str)]
    key = "task" if "task" in names else (index_cols[0] if index_cols else (names[0] if names else None))
    if key is None or "task_index" not in table.column_names:
        raise ValueError(f"'{root / TASKS_PATH}' has no task/task_index columns; is it a LeRobot v3.0 dataset?")
    return dict(zip(table.column("task_index").to_pylist(), table.column(key).to_pylist(), strict=True))


def read_episode_table(root: str | os.PathLike) -> list[dict[str, Any]]:
    """The episode table's rows (without the ``stats/`` columns), in episode order."""
    root = Path(root)
    files = sorted((root / EPISODES_DIR).glob("chunk-*/file-*.parquet"))
    if not files:
        raise FileNotFoundError(f"'{root / EPISODES_DIR}' has no chunk-XXX/file-XXX.parquet; is it LeRobot v3.0?")
    rows = []
    for f in files:
        t = pq().read_table(f)
        t = t.select([c for c in t.column_names if not c.startswith("stats/")])
        rows += t.to_pylist()
    return sorted(rows, key=lambda r: r["episode_index"])


def episode_metadata(row: dict[str, Any]) -> dict[str, Any]:
    """The extra columns of an episode-table row (what a producer stored beside the layout)."""
    return {k: v for k, v in row.items() if k not in _LOCATION_KEYS and not k.startswith(_LOCATION_PREFIXES)}


def decode_video(path: Path, start_s: float, n_frames: int, fps: float, size: tuple[int, int]) -> np.ndarray:
    """``n_frames`` RGB frames uint8 [n, H, W, 3] from the frame at ``start_s`` seconds (exact seek)."""
    import imageio_ffmpeg

    if not path.is_file():
        raise FileNotFoundError(f"video '{path}' is missing; the LeRobot dataset is incomplete")
    H, W = size
    seek = max(start_s - 0.5 / fps, 0.0)  # frames with pts >= seek survive: the first is the one at start_s
    gen = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24", input_params=["-ss", f"{seek:.6f}"],
                                     output_params=["-frames:v", str(n_frames)])
    meta = next(gen)
    if tuple(meta["size"]) != (W, H):
        gen.close()
        raise ValueError(f"video '{path}' is {meta['size'][0]}x{meta['size'][1]}, info.json says {W}x{H}")
    frames = [np.frombuffer(b, dtype=np.uint8).reshape(H, W, 3) for b in gen]
    if len(frames) != n_frames:
        raise ValueError(f"video '{path}' gave {len(frames)} frames from {start_s:.3f}s, the episode needs {n_frames}")
    return np.stack(frames)


def decode_pngs(cells: list[dict]) -> np.ndarray:
    """LeRobot ``image`` cells ({bytes, path}) -> uint8 [n, H, W, 3]."""
    import io

    from PIL import Image

    return np.stack([np.asarray(Image.open(io.BytesIO(c["bytes"])).convert("RGB")) for c in cells])


def read_lerobot_dataset(path: str | os.PathLike, max_episodes: int | None = None,
                         episodes: list[int] | None = None, state_key: str | None = STATE_KEY,
                         action_key: str | None = ACTION_KEY,
                         cameras: list[str] | None = None) -> list[LeRobotEpisode]:
    """Episodes of a local LeRobot v3.0 dataset, in episode order.

    ``state_key`` / ``action_key``: the features read as state [L, D] / actions [L, A]; None = not read
    (arrays [L, 0]), e.g. for a critic's frame-only dataset. A dataset whose writer split the env's state into
    ``observation.state`` and ``observation.environment_state`` (``info.json``'s ``state_order``) gives the
    env's whole state vector, in the env's order, under ``state_key="observation.state"``. ``cameras``: camera names
    (``observation.images.<name>`` features, video or image) to decode; None = all, [] = none (state-only SFT
    skips video decoding)."""
    root = Path(path)
    info = read_info(root)
    feats = info["features"]
    for key, opt in ((state_key, "state_key"), (action_key, "action_key")):
        if key is not None and key not in feats:
            raise KeyError(f"feature '{key}' is not in '{root / INFO_PATH}' (has {sorted(feats)}); pass {opt}=...")
    cams_all = {k[len(IMAGE_PREFIX):]: k for k, f in feats.items()
                if k.startswith(IMAGE_PREFIX) and f.get("dtype") in ("video", "image")}
    cams = list(cams_all) if cameras is None else list(cameras)
    unknown = [c for c in cams if c not in cams_all]
    if unknown:
        raise KeyError(f"cameras {unknown} are not in '{root}' (it has {sorted(cams_all)})")
    fps = float(info["fps"])
    data_tpl = info.get("data_path") or DATA_PATH
    video_tpl = info.get("video_path") or VIDEO_PATH
    tasks = read_tasks(root)
    rows = read_episode_table(root)
    if episodes is not None:
        wanted = set(episodes)
        rows = [r for r in rows if r["episode_index"] in wanted]
    rows = rows[:max_episodes]

    tables: dict[Path, Any] = {}
    image_cols = [cams_all[c] for c in cams if feats[cams_all[c]]["dtype"] == "image"]
    order = info.get(STATE_ORDER) if state_key == STATE_KEY else None
    state_parts = list(order) if order else [state_key] if state_key is not None else []
    missing = [k for k in state_parts if k not in feats]
    if missing:
        raise KeyError(f"'{root / INFO_PATH}' orders the state over {state_parts} but has no feature {missing}")
    columns = [*state_parts, *([action_key] if action_key is not None else [])]
    out = []
    for r in rows:
        ep = int(r["episode_index"])
        dpath = root / data_tpl.format(chunk_index=r["data/chunk_index"], file_index=r["data/file_index"])
        if dpath not in tables:
            if not dpath.is_file():
                raise FileNotFoundError(f"data file '{dpath}' of episode {ep} is missing")
            tables[dpath] = pq().read_table(dpath, columns=[*columns, "episode_index", "frame_index", "task_index",
                                                            *image_cols])
        t = tables[dpath]
        ep_col = np.asarray(t.column("episode_index").to_numpy())
        idx = np.flatnonzero(ep_col == ep)
        idx = idx[np.argsort(np.asarray(t.column("frame_index").to_numpy())[idx], kind="stable")]
        sub = t.take(idx)
        empty = np.zeros((len(sub), 0), np.float32)
        state = _state(sub, order) if order else _matrix(sub, state_key) if state_key is not None else empty
        actions = _matrix(sub, action_key) if action_key is not None else empty.copy()
        task_index = sub.column("task_index")[0].as_py() if len(sub) else None
        instruction = tasks.get(task_index) or (r.get("tasks") or [""])[0]
        images = {}
        for c in cams:
            key = cams_all[c]
            H, W = feats[key]["shape"][:2]
            if feats[key]["dtype"] == "video":
                vpath = root / video_tpl.format(video_key=key, chunk_index=r[f"videos/{key}/chunk_index"],
                                                file_index=r[f"videos/{key}/file_index"])
                images[c] = decode_video(vpath, float(r[f"videos/{key}/from_timestamp"]), len(sub), fps, (H, W))
            else:
                images[c] = decode_pngs(sub.column(key).to_pylist())
        out.append(LeRobotEpisode(state=state, actions=actions, images=images, instruction=instruction,
                                  episode_index=ep, meta=episode_metadata(r)))
    return out
