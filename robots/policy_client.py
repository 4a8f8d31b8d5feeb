"""Thin robot-side client for the policy server, and a broker that hands out a chunk one action at a time.

The client needs only ``websockets`` and ``msgpack`` (no torch), so it can run on the robot's PC
while the model runs on a GPU machine.
"""

from __future__ import annotations

import http.client
import time
from typing import Any

import numpy as np

from robots.wire import packb, unpackb


class PolicyServerError(RuntimeError):
    """The server answered a request with an error text (bad observation, model failure)."""


def healthz(host: str, port: int, timeout: float = 2.0) -> bool:
    """True when ``GET /healthz`` answers 200."""
    try:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conn.request("GET", "/healthz")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


class PolicyClient:
    """Synchronous websocket client; ``infer(obs) -> {"actions": [T, A], ...}``. Latency kept per call."""

    def __init__(self, host: str = "127.0.0.1", port: int = 8000, connect_timeout: float = 10.0):
        from websockets.sync.client import connect

        self.uri = f"ws://{host}:{port}"
        try:
            self._ws = connect(self.uri, compression=None, max_size=None, open_timeout=connect_timeout).__enter__()
        except OSError as exc:
            raise ConnectionError(
                f"cannot reach the policy server at {self.uri} ({exc}); start it with "
                f"`python -m robots.serve checkpoint=<dir> port={port}` or fix policy.server"
            ) from exc
        self.metadata: dict[str, Any] = unpackb(self._ws.recv())
        self.latencies_ms: list[float] = []

    def infer(self, obs: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        t0 = time.perf_counter()
        self._ws.send(packb(obs))
        reply = self._ws.recv(timeout=timeout)
        self.latencies_ms.append((time.perf_counter() - t0) * 1e3)
        if isinstance(reply, str):
            raise PolicyServerError(reply)
        return unpackb(reply)

    def close(self) -> None:
        self._ws.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ActionChunkBroker:
    """Query the policy once per ``replan_every`` steps and serve the chunk's actions in order.

    ``infer`` is anything with ``infer(obs) -> {"actions": [T, A]}`` (``PolicyClient``, or a local
    policy wrapper). ``replan_every`` = 0 uses the whole chunk.
    """

    def __init__(self, infer: Any, replan_every: int = 0):
        self._infer = infer
        self.replan_every = replan_every
        self._chunk: np.ndarray | None = None
        self._index = 0

    def reset(self) -> None:
        self._chunk, self._index = None, 0

    def action(self, obs: dict[str, Any]) -> np.ndarray:
        """One action ``[A]`` for ``obs`` (a new chunk is requested when the current one is used up)."""
        limit = len(self._chunk) if self._chunk is not None else 0
        if self.replan_every > 0:
            limit = min(limit, self.replan_every)
        if self._chunk is None or self._index >= limit:
            actions = np.asarray(self._infer.infer(obs)["actions"], dtype=np.float32)
            if actions.ndim != 2:
                raise PolicyServerError(f"expected actions [T, A] from the policy, got {list(actions.shape)}")
            self._chunk, self._index = actions, 0
        a = self._chunk[self._index]
        self._index += 1
        return a
