"""Does LeRobot's own reader load a dataset that vlarl wrote? Writes one, loads it both ways, compares.

    python scripts/check_lerobot_reader.py [--codec lossless|av1|h264] [--keep <dir>]

1. Creates ``.reference-envs/lerobot-reader`` once (a venv of its own, never a vlarl dependency): lerobot
   0.4.4 ``--no-deps`` with the libraries its dataset code imports (see /work/shared/REFERENCES.md).
   torchvision 0.25.0 ``--no-deps``: the newest release inside lerobot's pin that still has the PyAV video
   reader LeRobot falls back to when torchcodec cannot load (the torchcodec wheels need CUDA torch); its
   compiled ops cannot load on CPU torch, so the two operator schemas its Python side registers are declared
   first (``shim_torchvision_ops``).
2. Writes a small dataset with ``vlarl.data.lerobot_writer`` (two tasks, two cameras of different sizes,
   rewards, success, two episodes per file so files and chunks roll over).
3. Re-runs itself inside that venv, offline, where ``lerobot.datasets.lerobot_dataset.LeRobotDataset(repo_id,
   root=...)`` loads the dataset and every frame is read with ``dataset[i]``.
4. Compares what LeRobot returned with what was written, and reads it back through vlarl's reader too; prints
   one line per check and exits 1 when any fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "reference_fixtures"))
from _lerobot_common import ENVS, ROOT, ensure_venv, shim_torchvision_ops  # noqa: E402

VENV = ENVS / "lerobot-reader"
PINNED = [
    "torch==2.13.0", "huggingface-hub==0.35.3", "datasets>=4.8,<4.9", "accelerate", "draccus==0.10.0", "einops",
    "pillow", "imageio", "pyserial", "deepdiff", "av", "packaging", "safetensors", "jsonlines", "termcolor",
    "pandas", "pyarrow",
]
NO_DEPS = ["lerobot==0.4.4", "torchvision==0.25.0"]
REPO_ID = "vlarl/lerobot-reader-check"
FPS = 10
LENGTHS = [6, 4, 5]
TASKS = ["push the cube to the goal", "pick up the red cube"]
CAMERAS = {"base": (48, 64), "wrist": (32, 32)}
TOLERANCE = {"lossless": 0.0, "av1": 6.0, "h264": 6.0}  # mean absolute error of frames, grey levels


# -- inside the reference venv ------------------------------------------------------------------------
def load_with_lerobot(root: str, out: str) -> None:
    """Every frame of the dataset through ``LeRobotDataset.__getitem__``, saved as arrays."""
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    shim_torchvision_ops()
    import lerobot
    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset(REPO_ID, root=root)
    items = [ds[i] for i in range(len(ds))]
    arrays = {
        "state": np.stack([it["observation.state"].numpy() for it in items]),
        "action": np.stack([it["action"].numpy() for it in items]),
        "reward": np.array([float(it["next.reward"]) for it in items], np.float32),
        "episode_index": np.array([int(it["episode_index"]) for it in items]),
        "frame_index": np.array([int(it["frame_index"]) for it in items]),
    }
    for key in ds.meta.camera_keys:  # float [3, H, W] in [0, 1] -> uint8 [H, W, 3]
        arrays[key] = np.stack([(it[key].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8) for it in items])
    np.savez(out, **arrays)
    meta = {"tasks": [it["task"] for it in items], "total_episodes": ds.meta.total_episodes, "fps": ds.fps,
            "video_backend": ds.video_backend, "camera_keys": ds.meta.camera_keys, "lerobot": lerobot.__version__,
            "stats_keys": sorted(ds.meta.stats)}
    Path(out).with_suffix(".json").write_text(json.dumps(meta))


# -- in vlarl's environment -----------------------------------------------------------------------------
def _frames(ep: int, L: int, size: tuple[int, int]):
    """Smooth moving gradients whose brightness encodes (episode, frame)."""
    import numpy as np

    H, W = size
    yy, xx = np.mgrid[0:H, 0:W]
    out = [np.stack([(xx * 3 + 9 * t + 40 * ep) % 256, (yy * 3 + 5 * t) % 256, np.full_like(xx, 60 + 30 * ep)], -1)
           for t in range(L)]
    return np.stack(out).astype(np.uint8)


def make_episodes() -> list[dict]:
    import numpy as np

    rng = np.random.default_rng(0)
    return [{"task": TASKS[e % 2], "state": rng.normal(size=(L, 6)).astype(np.float32),
             "actions": rng.uniform(-1, 1, (L, 4)).astype(np.float32), "rewards": rng.normal(size=L).astype(np.float32),
             "images": {c: _frames(e, L, s) for c, s in CAMERAS.items()}, "success": e % 2 == 0,
             "extra": {"quality/mean_squared_jerk": float(e)}} for e, L in enumerate(LENGTHS)]


def compare(root: Path, arrays: dict, meta: dict, episodes: list[dict], codec: str) -> list[tuple[str, bool, str]]:
    import numpy as np

    from vlarl.data.lerobot_v3 import read_lerobot_dataset

    checks = []
    want_state = np.concatenate([e["state"] for e in episodes])
    want_action = np.concatenate([e["actions"] for e in episodes])
    n = len(want_state)
    checks.append(("frames", len(arrays["state"]) == n and meta["total_episodes"] == len(episodes),
                   f"{len(arrays['state'])} frames / {meta['total_episodes']} episodes (wrote {n} / {len(episodes)})"))
    checks.append(("order", np.array_equal(arrays["frame_index"], np.concatenate([np.arange(L) for L in LENGTHS]))
                   and np.array_equal(arrays["episode_index"], np.repeat(np.arange(len(LENGTHS)), LENGTHS)),
                   "episode_index / frame_index in written order"))
    for key, want in (("state", want_state), ("action", want_action),
                      ("reward", np.concatenate([e["rewards"] for e in episodes]))):
        ok = arrays[key].shape == want.shape and np.array_equal(arrays[key], want)
        checks.append((key, ok, "bit-identical" if ok else f"max |diff| {np.abs(arrays[key] - want).max():.3g}"))
    tasks = [e["task"] for e, L in zip(episodes, LENGTHS, strict=True) for _ in range(L)]
    checks.append(("task", meta["tasks"] == tasks, "task strings per frame"))
    tol = TOLERANCE[codec]
    for cam in CAMERAS:
        got = arrays[f"observation.images.{cam}"].astype(np.float64)
        want = np.concatenate([e["images"][cam] for e in episodes]).astype(np.float64)
        mae = np.abs(got - want).mean() if got.shape == want.shape else float("inf")
        exact = got.shape == want.shape and np.array_equal(got, want)
        ok = exact if tol == 0 else mae <= tol
        checks.append((f"images.{cam}", ok, f"{'bit-identical' if exact else f'mean |diff| {mae:.2f} grey levels'} "
                                            f"({codec}, tolerance {tol})"))
    ours = read_lerobot_dataset(root)
    ok = len(ours) == len(episodes) and all(
        np.array_equal(o.state, e["state"]) and np.array_equal(o.actions, e["actions"]) and o.instruction == e["task"]
        and all(np.abs(o.images[c].astype(float) - e["images"][c]).mean() <= tol if tol else
                np.array_equal(o.images[c], e["images"][c]) for c in CAMERAS)
        and o.meta == {"success": e["success"], **e["extra"]} for o, e in zip(ours, episodes, strict=False))
    checks.append(("vlarl reader", ok, "states, actions, tasks, frames, success and quality columns round-trip"))
    return checks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--codec", default="lossless", choices=sorted(TOLERANCE))
    p.add_argument("--keep", default="", help="write the dataset here (a new folder) instead of a temporary one")
    p.add_argument("--inside", nargs=2, metavar=("ROOT", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.inside:
        load_with_lerobot(*args.inside)
        return 0
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from vlarl.data.lerobot_writer import LeRobotDatasetWriter

    python = ensure_venv(VENV, PINNED, NO_DEPS)
    episodes = make_episodes()
    with tempfile.TemporaryDirectory(prefix="lerobot-check-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp) / "dataset"
        with LeRobotDatasetWriter(root, FPS, robot_type="panda", codec=args.codec, episodes_per_file=2,
                                  chunks_size=1) as w:
            for e in episodes:
                w.add_episode(**e)
        out = Path(tmp) / "lerobot.npz"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(Path(tmp) / "hf")}
        proc = subprocess.run([str(python), __file__, "--inside", str(root), str(out)], env=env, text=True,
                              capture_output=True, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            print(f"check_lerobot_reader: LeRobot's reader failed on '{root}' (exit {proc.returncode})")
            return 1
        arrays = dict(np.load(out))
        meta = json.loads(out.with_suffix(".json").read_text())
        checks = compare(root, arrays, meta, episodes, args.codec)
    print(f"LeRobot {meta['lerobot']} LeRobotDataset(repo_id='{REPO_ID}', root=...) offline, video backend "
          f"'{meta['video_backend']}', cameras {meta['camera_keys']}, stats for {len(meta['stats_keys'])} features")
    for name, ok, detail in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {name:<20} {detail}")
    failed = [n for n, ok, _ in checks if not ok]
    print("all checks passed" if not failed else f"failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
