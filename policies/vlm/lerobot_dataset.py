"""LeRobot dataset v3.0 -> the same ``Episode`` objects as ``read_maniskill_h5``, so SFT reads either
(``policies.vlm.sft.read_demonstrations(path)`` picks the reader from what ``path`` is).

The v3.0 layout packs many episodes per file and finds each one through relational metadata:

    meta/info.json                               codebase_version "v3.0", fps, features, path templates
    meta/tasks.parquet                           task string <-> task_index
    meta/episodes/chunk-XXX/file-XXX.parquet     one row per episode: length, tasks, data/chunk_index,
                                                 data/file_index, dataset_from_index, dataset_to_index,
                                                 videos/<camera>/{chunk_index, file_index, from_timestamp,
                                                 to_timestamp}
    data/chunk-XXX/file-XXX.parquet              one row per frame: observation.state, action, timestamp,
                                                 frame_index, episode_index, index, task_index
    videos/<camera>/chunk-XXX/file-XXX.mp4       the camera stream of consecutive episodes (AV1 by default)

Videos are decoded with the ffmpeg binary that ``imageio-ffmpeg`` (a core dependency) ships: it has the
dav1d AV1 decoder and the SVT-AV1 encoder, so no PyAV/torchcodec is needed. ``write_lerobot_dataset`` writes
the same layout (used by the tests to build a small real dataset locally; nothing is downloaded).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from policies.vlm.episode import Episode

INFO_PATH = "meta/info.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes"
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
DATA_PATH = "data/" + CHUNK_FILE + ".parquet"
VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"
IMAGE_PREFIX = "observation.images."


@dataclass
class LeRobotEpisode(Episode):
    """An ``Episode`` (state [L, D], actions [L, A]) plus what LeRobot stores beside it."""

    images: dict[str, np.ndarray] = field(default_factory=dict)  # camera -> uint8 [L, H, W, 3]
    instruction: str = ""
    episode_index: int = 0


def _pq():
    try:
        import pyarrow.parquet as pq
    except ImportError as e:  # one line, naming the fix
        raise ModuleNotFoundError("reading LeRobot datasets needs pyarrow: pip install pyarrow "
                                  "(or the vlarl extra 'vla')") from e
    return pq


def _matrix(table, key: str) -> np.ndarray:
    """A list / fixed-size-list column -> float32 [rows, dim]."""
    col = table.column(key).combine_chunks()
    flat = np.array(col.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)  # a writable copy
    return flat.reshape(len(col), -1)


def _task_table(root: Path) -> dict[int, str]:
    """task_index -> task; the task string is a column 'task' or the pandas index LeRobot writes."""
    table = _pq().read_table(root / TASKS_PATH)
    names = [n for n in table.column_names if n != "task_index"]
    meta = table.schema.pandas_metadata or {}
    index_cols = [c for c in meta.get("index_columns", []) if isinstance(c, str)]
    key = "task" if "task" in names else (index_cols[0] if index_cols else (names[0] if names else None))
    if key is None or "task_index" not in table.column_names:
        raise ValueError(f"'{root / TASKS_PATH}' has no task/task_index columns; is it a LeRobot v3.0 dataset?")
    return dict(zip(table.column("task_index").to_pylist(), table.column(key).to_pylist(), strict=True))


def _episode_rows(root: Path) -> list[dict[str, Any]]:
    files = sorted((root / EPISODES_DIR).glob("chunk-*/file-*.parquet"))
    if not files:
        raise FileNotFoundError(f"'{root / EPISODES_DIR}' has no chunk-XXX/file-XXX.parquet; is it LeRobot v3.0?")
    rows = []
    for f in files:
        t = _pq().read_table(f)
        t = t.select([c for c in t.column_names if not c.startswith("stats/")])
        rows += t.to_pylist()
    return sorted(rows, key=lambda r: r["episode_index"])


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


def read_lerobot_dataset(path: str | os.PathLike, max_episodes: int | None = None,
                         episodes: list[int] | None = None, state_key: str = "observation.state",
                         action_key: str = "action", cameras: list[str] | None = None) -> list[LeRobotEpisode]:
    """Episodes of a local LeRobot v3.0 dataset, in episode order.

    ``cameras``: camera names (``observation.images.<name>`` features, video or image) to decode; None = all,
    [] = none (state-only SFT skips video decoding)."""
    root = Path(path)
    if not (root / INFO_PATH).is_file():
        raise FileNotFoundError(f"'{root}' is not a LeRobot dataset (no {INFO_PATH}); pass the dataset's root folder")
    info = json.loads((root / INFO_PATH).read_text())
    version = str(info.get("codebase_version", "?"))
    if not version.startswith("v3"):
        raise ValueError(f"'{root}' is LeRobot format {version}; this reader reads v3.0 (convert the dataset "
                         f"with LeRobot's v2.1 -> v3.0 converter)")
    feats = info["features"]
    for key, opt in ((state_key, "state_key"), (action_key, "action_key")):
        if key not in feats:
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
    tasks = _task_table(root)
    rows = _episode_rows(root)
    if episodes is not None:
        wanted = set(episodes)
        rows = [r for r in rows if r["episode_index"] in wanted]
    rows = rows[:max_episodes]

    tables: dict[Path, Any] = {}
    out = []
    for r in rows:
        ep = int(r["episode_index"])
        dpath = root / data_tpl.format(chunk_index=r["data/chunk_index"], file_index=r["data/file_index"])
        if dpath not in tables:
            if not dpath.is_file():
                raise FileNotFoundError(f"data file '{dpath}' of episode {ep} is missing")
            image_cols = [cams_all[c] for c in cams if feats[cams_all[c]]["dtype"] == "image"]
            tables[dpath] = _pq().read_table(dpath, columns=[state_key, action_key, "episode_index", "frame_index",
                                                              "task_index", *image_cols])
        t = tables[dpath]
        ep_col = np.asarray(t.column("episode_index").to_numpy())
        idx = np.flatnonzero(ep_col == ep)
        idx = idx[np.argsort(np.asarray(t.column("frame_index").to_numpy())[idx], kind="stable")]
        sub = t.take(idx)
        state, actions = _matrix(sub, state_key), _matrix(sub, action_key)
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
                images[c] = _decode_pngs(sub.column(key).to_pylist())
        out.append(LeRobotEpisode(state=state, actions=actions, images=images, instruction=instruction,
                                  episode_index=ep))
    return out


def _png(frame: np.ndarray) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG")
    return buf.getvalue()


def _decode_pngs(cells: list[dict]) -> np.ndarray:
    import io

    from PIL import Image

    return np.stack([np.asarray(Image.open(io.BytesIO(c["bytes"])).convert("RGB")) for c in cells])


# -- writer ---------------------------------------------------------------------------------------
def _feature(arr: np.ndarray) -> dict[str, Any]:
    return {"dtype": "float32", "shape": [int(arr.shape[1])], "names": None}


def write_lerobot_dataset(root: str | os.PathLike, episodes: list[LeRobotEpisode], fps: int = 10,
                          robot_type: str = "", codec: str = "libsvtav1", episodes_per_file: int = 1000,
                          chunks_size: int = 1000, video: bool = True) -> Path:
    """Write ``episodes`` as a LeRobot v3.0 dataset (AV1 ``yuv420p`` videos, as LeRobot records them).

    ``episodes_per_file`` stands in for LeRobot's file-size limit: consecutive episodes share data/video
    files up to that count; ``chunks_size`` files make a chunk. ``video=False`` stores frames as PNG images
    in the data parquet (LeRobot's ``image`` features) instead of mp4 files."""
    import imageio_ffmpeg
    import pyarrow as pa

    pq = _pq()
    root = Path(root)
    if not episodes:
        raise ValueError("write_lerobot_dataset needs at least one episode")
    cams = sorted(episodes[0].images)
    task_ids = {t: i for i, t in enumerate(dict.fromkeys(e.instruction for e in episodes))}
    groups = [episodes[i : i + episodes_per_file] for i in range(0, len(episodes), episodes_per_file)]
    ep_rows, index = [], 0
    for g, group in enumerate(groups):
        chunk, file = divmod(g, chunks_size)
        cols: dict[str, list] = {k: [] for k in ("observation.state", "action", "timestamp", "frame_index",
                                                  "episode_index", "index", "task_index")}
        video_offset = 0
        writers, pngs = {}, {c: [] for c in cams}
        for c in cams if video else []:
            H, W = episodes[0].images[c].shape[1:3]
            vpath = root / VIDEO_PATH.format(video_key=IMAGE_PREFIX + c, chunk_index=chunk, file_index=file)
            vpath.parent.mkdir(parents=True, exist_ok=True)
            writers[c] = imageio_ffmpeg.write_frames(str(vpath), (W, H), fps=fps, codec=codec, macro_block_size=1,
                                                     pix_fmt_out="yuv420p", output_params=["-g", "2"])
            writers[c].send(None)
        for e in group:
            ep_i, L = len(ep_rows), len(e.actions)
            cols["observation.state"] += list(e.state.astype(np.float32))
            cols["action"] += list(e.actions.astype(np.float32))
            cols["timestamp"] += [np.float32(i / fps) for i in range(L)]
            cols["frame_index"] += list(range(L))
            cols["episode_index"] += [ep_i] * L
            cols["index"] += list(range(index, index + L))
            cols["task_index"] += [task_ids[e.instruction]] * L
            row = {"episode_index": ep_i, "tasks": [e.instruction], "length": L, "data/chunk_index": chunk,
                   "data/file_index": file, "dataset_from_index": index, "dataset_to_index": index + L}
            for c in cams:
                if not video:
                    pngs[c] += [_png(frame) for frame in e.images[c]]
                    continue
                for frame in e.images[c]:
                    writers[c].send(np.ascontiguousarray(frame))
                key = IMAGE_PREFIX + c
                row.update({f"videos/{key}/chunk_index": chunk, f"videos/{key}/file_index": file,
                            f"videos/{key}/from_timestamp": video_offset / fps,
                            f"videos/{key}/to_timestamp": (video_offset + L) / fps})
            row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
            ep_rows.append(row)
            video_offset += L
            index += L
        for w in writers.values():
            w.close()
        D, A = len(cols["observation.state"][0]), len(cols["action"][0])
        table = pa.table({
            "observation.state": pa.array(cols["observation.state"], type=pa.list_(pa.float32(), D)),
            "action": pa.array(cols["action"], type=pa.list_(pa.float32(), A)),
            "timestamp": pa.array(cols["timestamp"], type=pa.float32()),
            **{k: pa.array(cols[k], type=pa.int64()) for k in ("frame_index", "episode_index", "index", "task_index")},
            **{IMAGE_PREFIX + c: pa.array([{"bytes": b, "path": None} for b in pngs[c]],
                                          type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
               for c in cams if not video},
        })
        dpath = root / DATA_PATH.format(chunk_index=chunk, file_index=file)
        dpath.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, dpath)
    (root / EPISODES_DIR / CHUNK_FILE.format(chunk_index=0, file_index=0)).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(ep_rows),
                   root / (EPISODES_DIR + "/" + CHUNK_FILE.format(chunk_index=0, file_index=0) + ".parquet"))
    pq.write_table(pa.table({"task": list(task_ids), "task_index": pa.array(list(task_ids.values()), pa.int64())}),
                   root / TASKS_PATH)
    features = {"observation.state": _feature(episodes[0].state), "action": _feature(episodes[0].actions)}
    for c in cams:
        H, W = episodes[0].images[c].shape[1:3]
        features[IMAGE_PREFIX + c] = {"dtype": "image", "shape": [H, W, 3], "names": ["height", "width", "channels"]}
        if not video:
            continue
        features[IMAGE_PREFIX + c] = {
            "dtype": "video", "shape": [H, W, 3], "names": ["height", "width", "channels"],
            "info": {"video.height": H, "video.width": W, "video.codec": "av1" if "av1" in codec else codec,
                     "video.pix_fmt": "yuv420p", "video.is_depth_map": False, "video.fps": fps,
                     "video.channels": 3, "has_audio": False}}
    for k, dt in (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
                  ("index", "int64"), ("task_index", "int64")):
        features[k] = {"dtype": dt, "shape": [1], "names": None}
    info = {"codebase_version": "v3.0", "robot_type": robot_type, "total_episodes": len(episodes),
            "total_frames": index, "total_tasks": len(task_ids), "chunks_size": chunks_size,
            "data_files_size_in_mb": 100, "video_files_size_in_mb": 500, "fps": fps,
            "splits": {"train": f"0:{len(episodes)}"}, "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if cams and video else None, "features": features}
    (root / INFO_PATH).write_text(json.dumps(info, indent=4))
    all_s = np.concatenate([e.state for e in episodes]).astype(np.float64)
    all_a = np.concatenate([e.actions for e in episodes]).astype(np.float64)
    stats = {k: {"mean": v.mean(0).tolist(), "std": v.std(0).tolist(), "min": v.min(0).tolist(),
                 "max": v.max(0).tolist(), "count": [len(v)]} for k, v in (("observation.state", all_s),
                                                                          ("action", all_a))}
    (root / "meta" / "stats.json").write_text(json.dumps(stats, indent=4))
    return root
