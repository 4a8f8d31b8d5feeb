"""Train the success classifier (robots/success_classifier.py) from labelled episodes of a LeRobot v3 dataset.

    python scripts/train_success_classifier.py --data <dataset or folder of episode datasets> --out classifier.pt

Labels: a frame is positive when its episode succeeded (episode column ``success``) and it is among the last
``--positive-tail`` frames; every other frame is negative. Episodes recorded by ``scripts/train_hil.py``
(``<run>/episodes/episode_*``, one dataset each) or ``vlarl-deploy`` with the operator's success key are labelled
this way already. Held-out: the last ``--val-fraction`` of the episodes; the script prints train/val accuracy.
Bad input: one line, exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from robots.success_classifier import ClassifierConfig, SuccessClassifier


def labelled_frames(data: Path, camera: str, tail: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per episode: (frames uint8 [L, H, W, 3], labels float [L])."""
    from vlarl.data.lerobot_v3 import read_lerobot_dataset

    roots = [data] if (data / "meta").is_dir() else sorted(p for p in data.glob("*") if (p / "meta").is_dir())
    if not roots:
        raise ValueError(f"--data '{data}' is neither a LeRobot v3 dataset nor a folder of them")
    out = []
    for root in roots:
        for ep in read_lerobot_dataset(root, state_key=None, action_key=None, cameras=None):
            cams = list(ep.images)
            if not cams:
                raise ValueError(f"'{root}' has no camera frames; record episodes with a camera (env.cameras)")
            cam = camera or cams[0]
            if cam not in ep.images:
                raise ValueError(f"--camera {cam} is not in '{root}' (it has {cams})")
            frames = ep.images[cam]
            labels = np.zeros(len(frames), np.float32)
            if bool(ep.meta.get("success", False)):
                labels[-tail:] = 1.0
            out.append((frames, labels))
    return out


def train(episodes: list[tuple[np.ndarray, np.ndarray]], cfg: ClassifierConfig, epochs: int, lr: float,
          val_fraction: float, seed: int) -> tuple[SuccessClassifier, dict[str, float]]:
    torch.manual_seed(seed)
    n_val = int(round(len(episodes) * val_fraction))
    train_eps, val_eps = episodes[: len(episodes) - n_val], episodes[len(episodes) - n_val:]
    x = torch.from_numpy(np.concatenate([f for f, _ in train_eps]))
    y = torch.from_numpy(np.concatenate([lab for _, lab in train_eps]))
    pos = float(y.mean())
    if pos in (0.0, 1.0):
        raise ValueError("the training episodes hold only one label; record successful and failed episodes")
    model = SuccessClassifier(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    weight = torch.tensor((1 - pos) / pos)  # balance the rare positives
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=g).split(64):
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x[idx]), y[idx], pos_weight=weight)
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()

    def acc(eps):
        if not eps:
            return float("nan")
        xs = torch.from_numpy(np.concatenate([f for f, _ in eps]))
        ys = np.concatenate([lab for _, lab in eps])
        return float(((model.probability(xs).numpy() >= 0.5) == (ys > 0.5)).mean())

    return model, {"train_accuracy": acc(train_eps), "val_accuracy": acc(val_eps), "frames": float(len(x))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--camera", default="")
    p.add_argument("--positive-tail", type=int, default=3)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--val-fraction", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    try:
        if a.positive_tail < 1 or a.epochs < 1 or not 0 <= a.val_fraction < 1:
            raise ValueError("--positive-tail and --epochs must be >= 1 and --val-fraction in [0, 1)")
        if not Path(a.data).exists():
            raise ValueError(f"--data '{a.data}' does not exist")
        eps = labelled_frames(Path(a.data), a.camera, a.positive_tail)
        model, stats = train(eps, ClassifierConfig(image_size=a.image_size), a.epochs, a.lr, a.val_fraction, a.seed)
    except (ValueError, KeyError, OSError) as exc:
        print(f"train_success_classifier: error: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    model.save(a.out)
    print(f"frames {int(stats['frames'])}  train accuracy {stats['train_accuracy']:.3f}  "
          f"val accuracy {stats['val_accuracy']:.3f}  -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
