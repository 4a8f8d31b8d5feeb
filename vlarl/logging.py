"""Run logging: TensorBoard scalars, optional wandb, a metrics.jsonl that scripts can read, the progress bar, and
the run's library log (simulator warnings that repeat once per env, kept off the terminal)."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
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


LIBRARY_LOG = "library.log"  # in the run directory
LIBRARY_LOG_ENV = "VLARL_LIBRARY_LOG"  # its path, inherited by the Ray workers a run starts
# Library loggers that log the same line for every env they build (ManiSkill's "Requested to use render device
# sapien_cuda ... Falling back to cpu", robosuite's macro notice): dozens of identical lines per run otherwise.
LIBRARY_LOGGERS = ("mani_skill ", "mani_skill", "robosuite_logs")


class LibraryLogHandler(logging.Handler):
    """Library records to the run's library log (every record, one line each, appended: worker processes share
    the file), or, with no file, to stderr once per distinct message in this process."""

    def __init__(self, path: str | Path | None):
        super().__init__(logging.INFO)
        self.path = Path(path) if path else None
        self.seen: set[tuple[str, str]] = set()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            name, msg = record.name.strip(), record.getMessage()
            if self.path is not None:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created))
                with open(self.path, "a") as f:
                    f.write(f"{stamp} pid {os.getpid()} {name} {record.levelname}: {msg}\n")
            elif (name, msg) not in self.seen:
                self.seen.add((name, msg))
                print(f"{name} {record.levelname}: {msg} (shown once)", file=sys.stderr, flush=True)
        except Exception:
            self.handleError(record)


def route_library_logs(path: str | Path | None = None) -> Path | None:
    """Replace the console handlers of ``LIBRARY_LOGGERS`` by one ``LibraryLogHandler`` writing to ``path``
    (default: ``$VLARL_LIBRARY_LOG``; none: once per message on stderr). Call it in every process that builds
    envs, before or after the library is imported (ManiSkill adds its console handler only to a logger that has
    none). Returns the file used, if any."""
    path = path or os.environ.get(LIBRARY_LOG_ENV) or None
    handler = LibraryLogHandler(path)
    for name in LIBRARY_LOGGERS:
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            lg.removeHandler(h)
        lg.addHandler(handler)
        lg.propagate = False
    return Path(path) if path else None


def library_log_summary(path: str | Path) -> str | None:
    """One line saying how many library log lines (and how many distinct messages) ``path`` holds; None if none."""
    p = Path(path)
    lines = p.read_text().splitlines() if p.is_file() else []
    if not lines:
        return None
    distinct = {ln.split(" ", 4)[-1] for ln in lines}  # without the time stamp and pid
    return f"{len(lines)} library log lines ({len(distinct)} distinct, e.g. simulator warnings per env) in {p}"
