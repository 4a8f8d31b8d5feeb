"""Run logging: TensorBoard scalars, optional wandb, and a metrics.jsonl that scripts can read."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any


class MetricLogger:
    def __init__(self, run_dir: str | Path, cfg: Any, config_dict: dict[str, Any] | None = None):
        self.run_dir = Path(run_dir)
        self.jsonl = open(self.run_dir / "metrics.jsonl", "a", buffering=1)
        self.tb = None
        self.wandb = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"))
        if cfg.wandb:
            try:
                import wandb
            except ImportError as e:
                raise RuntimeError("logger.wandb=true but wandb is not installed; `pip install wandb`") from e
            self.wandb = wandb.init(project=cfg.wandb_project, dir=str(self.run_dir), config=config_dict,
                                    name=self.run_dir.name, resume="allow")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        self.jsonl.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")
        if self.tb is not None:
            for k, v in clean.items():
                if not math.isnan(v):
                    self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(clean, step=step)

    def close(self) -> None:
        self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    p = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.is_file() else []
