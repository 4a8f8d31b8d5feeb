"""Run logging: TensorBoard scalars, optional wandb, a metrics.jsonl that scripts can read, and the progress bar."""

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


def _clock_str(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rem = divmod(seconds, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60:02d}:{rem % 60:02d}"


class RunProgress:
    """A progress bar that tells the truth about both budgets: ``total_env_steps`` and ``time_limit_minutes``.

    The bar counts env steps, but its ETA is the earlier of "steps left / current speed" and "time limit left",
    and it says which one ends the run. ``clock`` is injectable (tests); ``elapsed_offset`` is the wall time of
    earlier (resumed) segments, which counts against the time limit."""

    BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} steps [{elapsed}{postfix}]"

    def __init__(self, total_steps: int, time_limit_s: float = 0.0, initial_steps: int = 0, elapsed_offset: float = 0.0,
                 desc: str = "", disable: bool = False, clock: Any = time.monotonic, file: Any = None):
        from tqdm import tqdm

        self.total, self.limit, self.clock = int(total_steps), float(time_limit_s), clock
        self.start, self.offset, self.start_steps = clock(), float(elapsed_offset), min(initial_steps, total_steps)
        self.user_postfix: dict[str, Any] = {}
        self.bar = tqdm(total=self.total, initial=self.start_steps, unit="step", desc=desc, disable=disable,
                        dynamic_ncols=True, bar_format=self.BAR_FORMAT, file=file)
        self.bar.set_postfix_str(self.eta_text(), refresh=False)

    def eta(self) -> tuple[float | None, str]:
        """(seconds left, what ends the run: "step budget" | "time limit"); None seconds while no speed is known."""
        now = self.clock() - self.start
        done = self.bar.n - self.start_steps
        steps_left = (self.total - self.bar.n) / (done / now) if done > 0 and now > 0 else None
        time_left = self.limit - (self.offset + now) if self.limit > 0 else None
        if time_left is not None and (steps_left is None or time_left < steps_left):
            return max(0.0, time_left), "time limit"
        return steps_left, "step budget"

    def eta_text(self) -> str:
        left, which = self.eta()
        limit = f", limit {_clock_str(self.limit)}" if self.limit > 0 else ""
        return f"eta {_clock_str(left) if left is not None else '?'} ({which}{limit})"

    def update(self, steps: int) -> None:
        self.bar.update(min(steps, max(0, self.total - self.bar.n)))
        self._refresh()

    def set_postfix(self, **kwargs: Any) -> None:
        self.user_postfix = kwargs
        self._refresh()

    def _refresh(self) -> None:
        extra = ", ".join(f"{k}={v}" for k, v in self.user_postfix.items())
        self.bar.set_postfix_str(self.eta_text() + (f", {extra}" if extra else ""))

    def close(self) -> None:
        self.bar.close()
