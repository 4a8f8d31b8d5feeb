"""Thin robot-side client for the policy server.

The client needs only ``websockets`` and ``msgpack`` (no torch), so it can run on the robot's PC
while the model runs on a GPU machine. vlarl keeps no chunk broker: ``vlarl-deploy`` executes a chunk's first
``replan_every`` actions, and openpi's client package ships its own ``ActionChunkBroker``.
"""

from __future__ import annotations

import http.client
import os
import time
from typing import Any

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


API_KEY_ENV = "VLARL_POLICY_API_KEY"  # read by the server CLI and by clients not given a key


class PolicyClient:
    """Synchronous websocket client; ``infer(obs) -> {"actions": [T, A], ...}``. Latency kept per call.

    ``api_key`` (default: ``$VLARL_POLICY_API_KEY``) is sent as openpi's client sends it,
    ``Authorization: Api-Key <key>``. A server that refuses the connection (wrong key, full) raises
    ``ConnectionError`` with the server's reason.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 8000, connect_timeout: float = 10.0,
                 api_key: str | None = None):
        from websockets.exceptions import ConnectionClosed, InvalidHandshake
        from websockets.sync.client import connect

        self.uri = f"ws://{host}:{port}"
        api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
        headers = {"Authorization": f"Api-Key {api_key}"} if api_key else None
        try:
            self._ws = connect(self.uri, compression=None, max_size=None, open_timeout=connect_timeout,
                               additional_headers=headers).__enter__()  # the context form: no deprecation warning
        except (OSError, InvalidHandshake) as exc:
            raise ConnectionError(
                f"cannot reach the policy server at {self.uri} ({exc}); start it with "
                f"`python -m robots.serve checkpoint=<dir> port={port}` or fix policy.server"
            ) from exc
        try:
            self.metadata: dict[str, Any] = unpackb(self._ws.recv(timeout=connect_timeout))
        except (ConnectionClosed, TimeoutError) as exc:
            self._ws.close()
            rcvd = getattr(exc, "rcvd", None)
            why = f"{rcvd.reason} (code {rcvd.code})" if rcvd is not None else "no metadata"
            raise ConnectionError(f"policy server at {self.uri} refused the connection: {why}") from exc
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
