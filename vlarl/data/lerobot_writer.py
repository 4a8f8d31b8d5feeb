"""Write episodes as a LeRobot v3.0 dataset, so what vlarl produces (collected rollouts, robot recordings, the
critic's saved episodes) goes to the tools the field uses: LeRobot's training and visualisation, openpi's data
pipeline, the Hub.

    with LeRobotDatasetWriter("data/pushcube_rl", fps=20, robot_type="panda") as w:
        w.add_episode("push the cube to the goal", state=s, actions=a, images={"base": frames},
                      rewards=r, success=True, extra={"quality/mean_squared_jerk": 0.01})

Layout and column names are those of ``vlarl.data.lerobot_v3`` (LeRobot's published v3.0 layout).

State: LeRobot's policies read the robot's proprioception from ``observation.state`` and the rest of a state
observation (object poses, goals) from ``observation.environment_state``; ACT and Diffusion Policy need one of
that or a camera. With ``proprio_dims`` (the env spec's: indices of the env's state vector that are
proprioception) the writer splits each state into the two features and records the env's order in
``info.json`` (``state_order``: for each feature the env-state indices of its columns), which
``read_lerobot_dataset`` uses to give the env's vector back. ``meta/stats.json`` has statistics for every
feature (``next.done`` as 0/1).
Frames are kept per file: parquet through pyarrow (one row group per episode), video through the ffmpeg binary
of ``imageio-ffmpeg``, one stream per camera and file; ``episodes_per_file`` consecutive episodes share a data
and a video file (LeRobot rolls files over by size; a count keeps files of one dataset alike), and
``chunks_size`` files make a chunk. The dataset is written into a hidden sibling folder and moved to ``root``
by ``close()``: an interrupted writer never leaves half a dataset, and ``overwrite=True`` replaces the old one
only once the new one is complete.

Video codecs (``VIDEO_CODECS``): ``av1`` is what LeRobot records (SVT-AV1, yuv420p, GOP 2, CRF 30; lossy:
mean absolute error a few grey levels on smooth frames); ``lossless`` is H.264 in RGB at QP 0 (libx264rgb):
decoded frames equal the written ones bit for bit, at several times the size; ``h264`` is the usual lossy
yuv420p stream. ``images="png"`` stores frames as PNG cells in the data parquet (LeRobot's ``image`` features,
also lossless) instead of videos.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vlarl.data.lerobot_v3 import (
    ACTION_KEY,
    CODEBASE_VERSION,
    DATA_PATH,
    ENV_STATE_KEY,
    EPISODES_PATH,
    IMAGE_PREFIX,
    INDEX_FEATURES,
    INFO_PATH,
    STATE_KEY,
    STATE_ORDER,
    STATS_PATH,
    TASKS_PATH,
    VIDEO_PATH,
    pq,
)

REWARD_KEY, DONE_KEY = "next.reward", "next.done"
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)  # LeRobot's q01 .. q99 (pi0.5 normalizes with q01/q99)
DATA_FILE_MB, VIDEO_FILE_MB = 100, 200  # LeRobot's defaults, recorded in info.json


@dataclass(frozen=True)
class VideoCodec:
    """An ffmpeg encoder and its settings; ``name`` is what info.json records as ``video.codec``."""

    encoder: str
    pix_fmt: str
    params: tuple[str, ...]
    name: str
    lossless: bool


VIDEO_CODECS: dict[str, VideoCodec] = {
    "av1": VideoCodec("libsvtav1", "yuv420p", ("-g", "2", "-crf", "30", "-preset", "12"), "av1", False),
    "h264": VideoCodec("libx264", "yuv420p", ("-g", "2", "-crf", "23"), "h264", False),
    "lossless": VideoCodec("libx264rgb", "rgb24", ("-g", "2", "-qp", "0"), "h264", True),
}
IMAGE_STORAGE = ("video", "png")


def _vector_stats(x: np.ndarray) -> dict[str, list]:
    """min/max/mean/std/count and quantiles of rows x [N, D] (float64), as JSON-ready lists."""
    x = x.astype(np.float64).reshape(len(x), -1)
    out = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0)}
    for q in QUANTILES:
        out[f"q{round(q * 100):02d}"] = np.quantile(x, q, axis=0)
    return {**{k: v.tolist() for k, v in out.items()}, "count": [len(x)]}


def _image_moments(frames: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel min/max/mean/std of uint8 frames [L, H, W, 3] in [0, 1], shaped [3, 1, 1] like LeRobot."""
    x = frames.reshape(-1, 3).astype(np.float64) / 255.0
    return {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0), "count": np.array([len(frames)])}


def _image_stats_json(m: dict[str, np.ndarray]) -> dict[str, list]:
    return {k: (v.reshape(3, 1, 1).tolist() if k != "count" else v.tolist()) for k, v in m.items()}


def _merge_image_moments(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Exact dataset moments from per-episode ones (pixel-count weighted; every frame has the same size)."""
    n = np.array([float(p["count"][0]) for p in parts])
    means = np.stack([p["mean"] for p in parts])
    second = np.stack([p["std"] ** 2 + p["mean"] ** 2 for p in parts])
    mean = (n[:, None] * means).sum(0) / n.sum()
    var = np.maximum((n[:, None] * second).sum(0) / n.sum() - mean**2, 0.0)
    return {"min": np.min([p["min"] for p in parts], 0), "max": np.max([p["max"] for p in parts], 0),
            "mean": mean, "std": np.sqrt(var), "count": np.array([int(n.sum())])}


def _tasks_table(tasks: dict[str, int]):
    """The tasks table as pandas writes it (task strings as the index), so ``pd.read_parquet`` - LeRobot's
    reader - gets ``tasks.iloc[i].name == task``."""
    import pyarrow as pa

    meta = {
        "index_columns": ["task"],
        "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                            "metadata": {"encoding": "UTF-8"}}],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
             "metadata": None},
            {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    table = pa.table({"task_index": pa.array(list(tasks.values()), pa.int64()), "task": list(tasks)})
    return table.replace_schema_metadata({b"pandas": json.dumps(meta).encode()})


class _VideoStream:
    """One camera's frames of one file, piped into ffmpeg."""

    def __init__(self, path: Path, size: tuple[int, int], fps: int, codec: VideoCodec):
        import imageio_ffmpeg

        path.parent.mkdir(parents=True, exist_ok=True)
        H, W = size
        os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its banner to stderr otherwise (1 = errors only)
        self._gen = imageio_ffmpeg.write_frames(
            str(path), (W, H), pix_fmt_in="rgb24", pix_fmt_out=codec.pix_fmt, fps=fps, codec=codec.encoder,
            quality=None, macro_block_size=1, output_params=list(codec.params), ffmpeg_log_level="error")
        self._gen.send(None)
        self.frames = 0

    def write(self, frames: np.ndarray) -> None:
        for f in frames:
            self._gen.send(np.ascontiguousarray(f))
        self.frames += len(frames)

    def close(self) -> None:
        self._gen.close()


class LeRobotDatasetWriter:
    """Streams episodes into a LeRobot v3.0 dataset at ``root`` (see the module docstring).

    The first episode fixes the features: which of state [L, D], actions [L, A], rewards [L], camera frames
    uint8 [L, H, W, 3] and ``extra`` episode columns exist, and their sizes; later episodes must match.
    Per-frame columns: ``observation.state`` (with ``proprio_dims``: the proprioceptive columns of the state,
    and ``observation.environment_state`` the others), ``action``, ``next.reward``, ``next.done`` (True on the
    last frame) and LeRobot's index columns; per-episode: the layout columns, ``stats/<feature>/<stat>``,
    ``success`` (when given) and ``extra``."""

    def __init__(self, root: str | os.PathLike, fps: int, robot_type: str = "", codec: str = "av1",
                 images: str = "video", episodes_per_file: int = 1000, chunks_size: int = 1000,
                 names: dict[str, list[str]] | None = None, overwrite: bool = False,
                 proprio_dims: Sequence[int] | None = None):
        if codec not in VIDEO_CODECS:
            raise ValueError(f"codec='{codec}' is unknown; choose one of {sorted(VIDEO_CODECS)}")
        if images not in IMAGE_STORAGE:
            raise ValueError(f"images='{images}' is unknown; choose one of {list(IMAGE_STORAGE)}")
        if fps <= 0 or episodes_per_file < 1 or chunks_size < 1:
            raise ValueError(f"fps={fps}, episodes_per_file={episodes_per_file} and chunks_size={chunks_size} "
                             f"must be >= 1")
        self.root = Path(root)
        if self.root.exists() and not overwrite and (not self.root.is_dir() or any(self.root.iterdir())):
            raise FileExistsError(f"'{self.root}' already exists; choose a new folder or pass overwrite=True")
        self.fps, self.robot_type, self.codec, self.images = int(fps), robot_type, VIDEO_CODECS[codec], images
        self.episodes_per_file, self.chunks_size, self.names = episodes_per_file, chunks_size, names or {}
        self.proprio_dims = [int(i) for i in proprio_dims or ()]
        if len(set(self.proprio_dims)) != len(self.proprio_dims) or any(i < 0 for i in self.proprio_dims):
            raise ValueError(f"proprio_dims={self.proprio_dims} must be distinct state indices >= 0")
        self._state_order: dict[str, list[int]] | None = None
        self._tmp = self.root.parent / f".{self.root.name}.partial-{os.getpid()}"
        if self._tmp.exists():
            shutil.rmtree(self._tmp)
        self._tmp.mkdir(parents=True)  # an unwritable parent fails here, before anything is written
        self._schema: dict[str, Any] | None = None
        self._tasks: dict[str, int] = {}
        self._rows: list[dict[str, Any]] = []
        self._numeric: dict[str, list[np.ndarray]] = {}
        self._image_moments: dict[str, list[dict[str, np.ndarray]]] = {}
        self._chunk, self._file, self._in_file = 0, 0, 0
        self._parquet = None
        self._videos: dict[str, _VideoStream] = {}
        self._frames = 0
        self._closed = False

    # -- public -------------------------------------------------------------------------------------
    @property
    def num_episodes(self) -> int:
        return len(self._rows)

    def add_episode(self, task: str, state: np.ndarray | None = None, actions: np.ndarray | None = None,
                    images: dict[str, np.ndarray] | None = None, rewards: np.ndarray | None = None,
                    success: bool | None = None, extra: dict[str, Any] | None = None,
                    frame_features: dict[str, np.ndarray] | None = None) -> int:
        """Append one episode of L frames; returns its episode_index.

        ``extra``: episode-table columns (numbers, bools or strings, e.g. ``quality/return``);
        ``frame_features``: more per-frame float features [L] or [L, k] stored under their own key (e.g. the
        robot's ``policy_action`` beside the executed ``action``)."""
        if self._closed:
            raise RuntimeError("the writer is closed; open a new LeRobotDatasetWriter")
        ep = self._check(state, actions, images or {}, rewards, success, extra or {}, frame_features or {})
        L = ep["length"]
        index0 = self._frames
        tid = self._tasks.setdefault(str(task), len(self._tasks))
        e = len(self._rows)
        if self._parquet is None:
            self._open_file()
        cols = self._frame_columns(ep, e, index0, tid)
        self._parquet.write_table(cols)
        row: dict[str, Any] = {"episode_index": e, "tasks": [str(task)], "length": L,
                               "data/chunk_index": self._chunk, "data/file_index": self._file,
                               "dataset_from_index": index0, "dataset_to_index": index0 + L}
        for cam, frames in ep["images"].items():
            key = IMAGE_PREFIX + cam
            if self.images == "video":
                stream = self._videos[cam]
                start = stream.frames
                stream.write(frames)
                row.update({f"videos/{key}/chunk_index": self._chunk, f"videos/{key}/file_index": self._file,
                            f"videos/{key}/from_timestamp": start / self.fps,
                            f"videos/{key}/to_timestamp": (start + L) / self.fps})
        row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
        row.update(self._episode_stats(ep, cols))
        if success is not None:
            row["success"] = bool(success)
        row.update(ep["extra"])
        self._rows.append(row)
        self._frames += L
        self._in_file += 1
        if self._in_file >= self.episodes_per_file:
            self._close_file()
        return e

    def close(self) -> Path:
        """Finish the files, write the metadata, move the dataset to ``root``; returns ``root``."""
        if self._closed:
            return self.root
        if not self._rows:
            self.abort()
            raise ValueError(f"no episodes were added; nothing written to '{self.root}'")
        self._close_file()
        self._write_meta()
        if self.root.exists():
            shutil.rmtree(self.root) if self.root.is_dir() else self.root.unlink()
        self._tmp.rename(self.root)
        self._closed = True
        return self.root

    def abort(self) -> None:
        """Drop everything written so far (``root`` is left as it was)."""
        for s in self._videos.values():
            s.close()
        self._videos = {}
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._closed = True

    def __enter__(self) -> LeRobotDatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- episodes -----------------------------------------------------------------------------------
    def _check(self, state, actions, images, rewards, success, extra, frame_features) -> dict[str, Any]:
        clash = [k for k in frame_features if k in (STATE_KEY, ENV_STATE_KEY, ACTION_KEY, REWARD_KEY, DONE_KEY,
                                                     *INDEX_FEATURES) or k.startswith(IMAGE_PREFIX)]
        if clash:
            raise ValueError(f"frame_features {clash} would replace the dataset's own columns; rename them")
        bad = [k for k, v in extra.items() if not isinstance(v, (bool, int, float, str, np.number, np.bool_))]
        if bad:
            raise ValueError(f"extra {bad} must be numbers, bools or strings (one value per episode)")
        extra = {k: v.item() if isinstance(v, (np.number, np.bool_)) else v for k, v in extra.items()}
        arrays = {STATE_KEY: state, ACTION_KEY: actions, **frame_features}
        arrays = {k: np.asarray(v, np.float32).reshape(len(v), -1) for k, v in arrays.items() if v is not None}
        if STATE_KEY in arrays and self.proprio_dims:
            arrays = {**self._split_state(arrays.pop(STATE_KEY)), **arrays}
        frames = {str(c): np.asarray(f) for c, f in images.items()}
        lengths = {k: len(v) for k, v in arrays.items()} | {f"images[{c}]": len(f) for c, f in frames.items()}
        if rewards is not None:
            lengths["rewards"] = len(rewards)
        if not lengths:
            raise ValueError("an episode needs state, actions or images")
        L = next(iter(lengths.values()))
        if L < 1 or any(n != L for n in lengths.values()):
            raise ValueError(f"episode arrays must share one length >= 1; got {lengths}")
        for c, f in frames.items():
            if f.dtype != np.uint8 or f.ndim != 4 or f.shape[-1] != 3:
                raise ValueError(f"images['{c}'] must be uint8 [L, H, W, 3]; got {f.dtype} {list(f.shape)}")
            if not self.codec.lossless and self.images == "video" and (f.shape[1] % 2 or f.shape[2] % 2):
                raise ValueError(f"images['{c}'] is {f.shape[2]}x{f.shape[1]}: codec '{self.codec.name}' stores "
                                 f"yuv420p, which needs even sizes; use codec='lossless' or images='png'")
        schema = {"arrays": {k: v.shape[1] for k, v in arrays.items()},
                  "images": {c: tuple(f.shape[1:3]) for c, f in frames.items()},
                  "rewards": rewards is not None, "success": success is not None,
                  "extra": {k: type(v).__name__ for k, v in sorted(extra.items())}}
        if self._schema is None:
            self._schema = schema
        elif schema != self._schema:
            raise ValueError(f"episode {len(self._rows)} has features {schema}; the dataset's first episode "
                             f"fixed {self._schema}")
        r = None if rewards is None else np.asarray(rewards, np.float32).reshape(L)
        return {"length": L, "arrays": arrays, "images": frames, "rewards": r, "extra": extra}

    def _split_state(self, state: np.ndarray) -> dict[str, np.ndarray]:
        """state [L, D] -> proprioception [L, P] and environment state [L, D - P] (env order kept in each)."""
        D = state.shape[1]
        if max(self.proprio_dims) >= D:
            raise ValueError(f"proprio_dims name index {max(self.proprio_dims)} but the state has {D} dims; pass the "
                             "env spec's proprio_dims for this state")
        proprio = sorted(self.proprio_dims)
        rest = [i for i in range(D) if i not in set(proprio)]
        self._state_order = {STATE_KEY: proprio, **({ENV_STATE_KEY: rest} if rest else {})}
        return {key: state[:, idx] for key, idx in self._state_order.items()}

    def _frame_columns(self, ep: dict[str, Any], e: int, index0: int, tid: int):
        import pyarrow as pa

        L = ep["length"]
        cols: dict[str, Any] = {}
        for key, x in ep["arrays"].items():
            # LeRobot reads a feature of shape (1,) as a scalar column, wider ones as fixed-size lists
            cols[key] = pa.array(x[:, 0]) if x.shape[1] == 1 else pa.FixedSizeListArray.from_arrays(
                pa.array(x.reshape(-1)), x.shape[1])
        if ep["rewards"] is not None:
            cols[REWARD_KEY] = pa.array(ep["rewards"])
        cols[DONE_KEY] = pa.array(np.arange(L) == L - 1)
        if self.images == "png":
            cell = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
            for cam, frames in ep["images"].items():
                cols[IMAGE_PREFIX + cam] = pa.array([{"bytes": _png(f), "path": None} for f in frames], type=cell)
        cols["timestamp"] = pa.array(np.arange(L, dtype=np.float32) / np.float32(self.fps))
        cols["frame_index"] = pa.array(np.arange(L, dtype=np.int64))
        cols["episode_index"] = pa.array(np.full(L, e, np.int64))
        cols["index"] = pa.array(np.arange(index0, index0 + L, dtype=np.int64))
        cols["task_index"] = pa.array(np.full(L, tid, np.int64))
        return pa.table(cols)

    def _episode_stats(self, ep: dict[str, Any], table) -> dict[str, Any]:
        """``stats/<feature>/<stat>`` of one episode; keeps what the dataset statistics need."""
        out: dict[str, Any] = {}
        numeric = [*ep["arrays"], *([REWARD_KEY] if ep["rewards"] is not None else []), DONE_KEY, *INDEX_FEATURES]
        for key in numeric:
            x = ep["arrays"][key] if key in ep["arrays"] else np.asarray(table.column(key).to_numpy())[:, None]
            x = x.astype(np.float32) if x.dtype == bool else x
            self._numeric.setdefault(key, []).append(x)
            out.update({f"stats/{key}/{k}": v for k, v in _vector_stats(x).items()})
        for cam, frames in ep["images"].items():
            m = _image_moments(frames)
            self._image_moments.setdefault(IMAGE_PREFIX + cam, []).append(m)
            out.update({f"stats/{IMAGE_PREFIX + cam}/{k}": v for k, v in _image_stats_json(m).items()})
        return out

    # -- files --------------------------------------------------------------------------------------
    def _open_file(self) -> None:
        path = self._tmp / DATA_PATH.format(chunk_index=self._chunk, file_index=self._file)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._parquet = _LazyParquet(path)
        if self.images == "video":
            for cam, size in self._schema["images"].items():
                vpath = self._tmp / VIDEO_PATH.format(video_key=IMAGE_PREFIX + cam, chunk_index=self._chunk,
                                                      file_index=self._file)
                self._videos[cam] = _VideoStream(vpath, size, self.fps, self.codec)

    def _close_file(self) -> None:
        if self._parquet is None:
            return
        self._parquet.close()
        self._parquet = None
        for s in self._videos.values():
            s.close()
        self._videos = {}
        self._in_file = 0
        self._file += 1
        if self._file >= self.chunks_size:
            self._chunk, self._file = self._chunk + 1, 0

    def _features(self) -> dict[str, dict[str, Any]]:
        s = self._schema
        feats: dict[str, dict[str, Any]] = {}
        for key, dim in s["arrays"].items():
            feats[key] = {"dtype": "float32", "shape": [dim], "names": self._names(key)}
        if s["rewards"]:
            feats[REWARD_KEY] = {"dtype": "float32", "shape": [1], "names": None}
        feats[DONE_KEY] = {"dtype": "bool", "shape": [1], "names": None}
        for cam, (H, W) in s["images"].items():
            feat = {"dtype": "video" if self.images == "video" else "image", "shape": [H, W, 3],
                    "names": ["height", "width", "channels"]}
            if self.images == "video":
                feat["info"] = {"video.height": H, "video.width": W, "video.codec": self.codec.name,
                                "video.pix_fmt": self.codec.pix_fmt, "video.is_depth_map": False,
                                "video.fps": self.fps, "video.channels": 3, "has_audio": False}
            feats[IMAGE_PREFIX + cam] = feat
        for key, dtype in INDEX_FEATURES.items():
            feats[key] = {"dtype": dtype, "shape": [1], "names": None}
        return feats

    def _names(self, key: str) -> list[str] | None:
        """A feature's per-dim names; a split state's come from the names given for the whole state."""
        whole = self.names.get(STATE_KEY)
        if self._state_order is not None and key in self._state_order and whole:
            D = sum(len(idx) for idx in self._state_order.values())
            return [whole[i] for i in self._state_order[key]] if len(whole) == D else self.names.get(key)
        return self.names.get(key)

    def _write_meta(self) -> None:
        import pyarrow as pa

        parquet = pq()
        n = len(self._rows)
        episodes = self._tmp / EPISODES_PATH.format(chunk_index=0, file_index=0)
        episodes.parent.mkdir(parents=True, exist_ok=True)
        parquet.write_table(pa.Table.from_pylist(self._rows), episodes)
        parquet.write_table(_tasks_table(self._tasks), self._tmp / TASKS_PATH)
        has_video = self.images == "video" and bool(self._schema["images"])
        info = {"codebase_version": CODEBASE_VERSION, "robot_type": self.robot_type or None, "total_episodes": n,
                "total_frames": self._frames, "total_tasks": len(self._tasks), "chunks_size": self.chunks_size,
                "data_files_size_in_mb": DATA_FILE_MB, "video_files_size_in_mb": VIDEO_FILE_MB, "fps": self.fps,
                "splits": {"train": f"0:{n}"}, "data_path": DATA_PATH,
                "video_path": VIDEO_PATH if has_video else None, "features": self._features()}
        if self._state_order is not None:
            info[STATE_ORDER] = self._state_order
        (self._tmp / INFO_PATH).write_text(json.dumps(info, indent=4))
        stats = {k: _vector_stats(np.concatenate(v)) for k, v in self._numeric.items()}
        stats |= {k: _image_stats_json(_merge_image_moments(v)) for k, v in self._image_moments.items()}
        (self._tmp / STATS_PATH).write_text(json.dumps(stats, indent=4))


class _LazyParquet:
    """A ``ParquetWriter`` opened with the schema of the first table written (one row group per episode)."""

    def __init__(self, path: Path):
        self.path, self._w = path, None

    def write_table(self, table) -> None:
        if self._w is None:
            self._w = pq().ParquetWriter(self.path, table.schema)
        self._w.write_table(table)

    def close(self) -> None:
        if self._w is not None:
            self._w.close()


def _png(frame: np.ndarray) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG")
    return buf.getvalue()


def write_lerobot_dataset(root: str | os.PathLike, episodes: list[Any], fps: int, **kw: Any) -> Path:
    """Write episodes with ``state``, ``actions``, ``images``, ``instruction`` attributes (e.g.
    ``LeRobotEpisode``) in one go; ``kw`` goes to ``LeRobotDatasetWriter``. Returns the dataset root."""
    with LeRobotDatasetWriter(root, fps, **kw) as w:
        for e in episodes:
            state, actions = (x if x is not None and np.asarray(x).size else None for x in (e.state, e.actions))
            w.add_episode(e.instruction, state=state, actions=actions, images=e.images or None)
    return w.root
