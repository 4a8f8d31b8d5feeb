"""Does LeRobot's own reader load a dataset that vlarl wrote? Writes one, loads it both ways, compares.

    python scripts/check_lerobot_reader.py [--codec lossless|av1|h264] [--keep <dir>]
    python scripts/check_lerobot_reader.py --train [--train-dataset <vlarl LeRobot dataset>] [--steps 5]

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

``--train``: can LeRobot *train* on a state-only vlarl dataset? It takes ``--train-dataset`` (what ``vlarl-demos``
or ``vlarl-collect`` wrote), or records PushCube demonstrations with the scripted expert through vlarl's env and
writer (``record_demos(fmt="lerobot")``: ``observation.state`` = the robot's 25 proprioceptive dims,
``observation.environment_state`` = goal and cube pose). Then it runs LeRobot's own ``lerobot-train`` entry
point (``lerobot.scripts.lerobot_train.main``) for ACT and for Diffusion Policy, ``--steps`` steps each on CPU,
in ``.reference-envs/smolvla`` (stock lerobot 0.4.4; gymnasium, which ``lerobot-train`` imports and that venv
lacks, is installed once into ``.reference-envs/lerobot-train-extras`` with ``pip --target``), and prints the
loss of every step. A copy of the dataset with the whole state in ``observation.state`` (what vlarl wrote
before the split) is tried first: LeRobot's ACT refuses it ("You must provide at least one image or the
environment state among the inputs").
"""

from __future__ import annotations

import argparse
import json
import math
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


TRAIN_VENV = ENVS / "smolvla"
TRAIN_EXTRAS = ENVS / "lerobot-train-extras"
TRAIN_EXTRA_PACKAGES = ["gymnasium==1.1.1", "cloudpickle", "farama-notifications"]  # --no-deps: nothing else moves
TRAIN_POLICIES = ("act", "diffusion")
REFUSAL = "You must provide at least one image or the environment state among the inputs"


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


def train_with_lerobot(argv: list[str]) -> None:
    """``lerobot-train`` itself (its console script's ``main``), after the torchvision operator shim."""
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    shim_torchvision_ops()
    import torch

    torch.set_num_threads(1)
    from lerobot.scripts.lerobot_train import main as lerobot_train

    sys.argv = ["lerobot-train", *argv]
    lerobot_train()


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


def ensure_train_env() -> tuple[Path, dict[str, str]]:
    python = TRAIN_VENV / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"check_lerobot_reader: {TRAIN_VENV} is missing; build it with "
                         "scripts/reference_fixtures/smolvla.py (stock lerobot 0.4.4)")
    if not (TRAIN_EXTRAS / "gymnasium").is_dir():
        subprocess.check_call([str(python), "-m", "pip", "install", "-q", "--no-deps", "--target", str(TRAIN_EXTRAS),
                               *TRAIN_EXTRA_PACKAGES])
    env = {**os.environ, "PYTHONPATH": str(TRAIN_EXTRAS), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    return python, env


def unsplit_copy(src: Path, dst: Path) -> Path:
    """The dataset as vlarl wrote it before the split: one ``observation.state`` with the env's whole state."""
    from vlarl.data.lerobot_v3 import read_lerobot_dataset
    from vlarl.data.lerobot_writer import LeRobotDatasetWriter

    info = json.loads((src / "meta" / "info.json").read_text())
    with LeRobotDatasetWriter(dst, info["fps"], robot_type=info.get("robot_type") or "") as w:
        for ep in read_lerobot_dataset(src, cameras=[]):
            w.add_episode(ep.instruction, state=ep.state, actions=ep.actions)
    return dst


def run_lerobot_train(python: Path, env: dict[str, str], root: Path, policy: str, out: Path,
                      steps: int) -> tuple[int, list[float], str]:
    """-> (exit code, the loss logged at each step, the output's tail)."""
    import re

    args = [f"--dataset.repo_id={REPO_ID}", f"--dataset.root={root}", f"--policy.type={policy}",
            "--policy.device=cpu", "--policy.push_to_hub=false", f"--steps={steps}", "--batch_size=4", "--log_freq=1",
            "--save_checkpoint=false", f"--output_dir={out}", "--wandb.enable=false", "--num_workers=0",
            "--eval_freq=0"]
    proc = subprocess.run([str(python), __file__, "--inside-train", *args], env={**env, "HF_HOME": str(out.parent / "hf")},
                          text=True, capture_output=True, stdin=subprocess.DEVNULL)
    text = proc.stdout + proc.stderr
    losses = [float(m.group(1)) for m in re.finditer(r"step:\d+ .*?loss:([-\d.e+]+)", text)]
    return proc.returncode, losses, text[-1500:]


def check_training(dataset: str, steps: int) -> int:
    """LeRobot's ACT and Diffusion Policy, ``steps`` training steps each, on a state-only vlarl dataset."""
    sys.path.insert(0, str(ROOT))
    python, env = ensure_train_env()
    with tempfile.TemporaryDirectory(prefix="lerobot-train-check-") as tmp:
        if dataset:
            root = Path(dataset)
        else:
            from vlarl import system_env
            from vlarl.data.expert_demos import record_demos

            system_env.apply()
            root = Path(tmp) / "pushcube"
            record_demos(root, episodes=4, fmt="lerobot", log=lambda *_: None)
        info = json.loads((root / "meta" / "info.json").read_text())
        shapes = {k: f["shape"] for k, f in info["features"].items() if k.startswith("observation.")}
        print(f"dataset {root}: {info['total_episodes']} episodes, {info['total_frames']} frames, features {shapes}")
        checks = []
        old = unsplit_copy(root, Path(tmp) / "unsplit")
        code, _, tail = run_lerobot_train(python, env, old, "act", Path(tmp) / "out-unsplit", 1)
        checks.append(("unsplit refused", code != 0 and REFUSAL in tail,
                       f"ACT on the whole state as observation.state: exit {code}, "
                       f"{'refused: ' + REFUSAL if REFUSAL in tail else tail[-300:]!r}"))
        for policy in TRAIN_POLICIES:
            code, losses, tail = run_lerobot_train(python, env, root, policy, Path(tmp) / f"out-{policy}", steps)
            ok = code == 0 and len(losses) == steps and all(math.isfinite(v) for v in losses)
            checks.append((f"lerobot-train {policy}", ok, f"losses {losses}" if ok else f"exit {code}: {tail[-600:]!r}"))
    for name, ok, detail in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {name:<22} {detail}")
    failed = [n for n, ok, _ in checks if not ok]
    print("all checks passed" if not failed else f"failed: {failed}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--codec", default="lossless", choices=sorted(TOLERANCE))
    p.add_argument("--keep", default="", help="write the dataset here (a new folder) instead of a temporary one")
    p.add_argument("--train", action="store_true", help="train LeRobot's ACT and Diffusion Policy on a state dataset")
    p.add_argument("--train-dataset", default="", help="a vlarl-demos / vlarl-collect LeRobot dataset (default: "
                                                      "record PushCube demonstrations with the scripted expert)")
    p.add_argument("--steps", type=int, default=5, help="lerobot-train steps per policy")
    p.add_argument("--inside", nargs=2, metavar=("ROOT", "OUT"), help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--inside-train"]:  # lerobot-train's own arguments follow
        train_with_lerobot(argv[1:])
        return 0
    args = p.parse_args(argv)
    if args.inside:
        load_with_lerobot(*args.inside)
        return 0
    if args.train:
        return check_training(args.train_dataset, args.steps)
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
