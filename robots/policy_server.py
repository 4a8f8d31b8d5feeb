"""Serve any vlarl policy over a websocket with msgpack-numpy, compatible with openpi's protocol.

Protocol (as spoken by ``openpi_client.WebsocketClientPolicy``):

1. client connects; the server sends one binary message: the metadata dict (policy name, chunk size,
   action dim, state dim, image keys, instruction);
2. each request is a binary msgpack-numpy dict (one observation), each reply a binary dict
   ``{"actions": float32 [T, A], "server_timing": {"infer_ms": float, "prev_total_ms": float}}``;
3. a request that cannot be served gets a *text* message naming the problem (openpi's client raises
   it as ``RuntimeError``); the connection and the server stay up.

``GET /healthz`` answers ``200 OK`` over plain HTTP on the same port.

Observations (keys accepted, openpi style, one example or a batch):
    state:  float [D] or [B, D]        (also ``observation/state``)
    images: {name: uint8 [H, W, 3]}    (also ``image``; or top-level ``observation/<name>`` arrays)
    prompt: str                        (also ``instruction``)
Inference runs on one worker thread, so the event loop keeps answering health checks and other
clients while a model computes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http
import logging
import threading
import time
from typing import Any

import numpy as np
import torch

from robots.wire import WireError, packb, unpackb

log = logging.getLogger(__name__)


class RequestError(ValueError):
    """A request the policy cannot serve; its text goes back to the client."""


def observation_from_request(request: Any, spec: Any) -> tuple[dict[str, Any], bool]:
    """Turn an openpi-style request into vlarl's batched observation schema.

    Returns ``(obs, batched)``; ``obs`` = ``{"images": {k: uint8 [B,H,W,3]}, "state": float32 [B, D],
    "instruction": list[str]}``. ``spec`` is the policy's ``PolicySpec``.
    """
    if not isinstance(request, dict):
        raise RequestError(f"request must be a dict of observations, got {type(request).__name__}")
    state = request.get("state", request.get("observation/state"))
    if state is None:
        raise RequestError(f"request has no 'state' (float [{spec.state_dim}]); keys were {sorted(map(str, request))}")
    state = np.array(state, dtype=np.float32)  # a copy: frames from the wire are read-only
    batched = state.ndim == 2
    if state.ndim == 1:
        state = state[None]
    if state.ndim != 2 or state.shape[1] != spec.state_dim:
        raise RequestError(f"'state' must have shape [{spec.state_dim}] or [B, {spec.state_dim}], got {list(state.shape)}")
    if not np.all(np.isfinite(state)):
        raise RequestError("'state' contains NaN or inf")
    raw_images = request.get("images", request.get("image"))
    if raw_images is None:
        raw_images = {k.split("/", 1)[1]: v for k, v in request.items() if isinstance(k, str)
                      and k.startswith("observation/") and k != "observation/state"}
    if not isinstance(raw_images, dict):
        raise RequestError("'images' must be a dict {camera_name: uint8 [H, W, 3]}")
    images: dict[str, np.ndarray] = {}
    for key in spec.image_keys:
        if key not in raw_images:
            raise RequestError(f"policy needs image '{key}'; request has images {sorted(raw_images)}")
        img = np.asarray(raw_images[key])
        if img.ndim == 3:
            img = img[None]
        # no silent conversion: a float frame cast to uint8 turns black, a CHW frame scrambles its pixels
        if img.dtype != np.uint8 or img.ndim != 4 or img.shape[-1] != 3 or img.shape[0] != state.shape[0]:
            hint = " (channels first? send HWC)" if img.ndim == 4 and img.shape[1] == 3 else ""
            hint += " (float? send uint8 0..255)" if img.dtype != np.uint8 else ""
            raise RequestError(f"image '{key}' must be uint8 [H, W, 3] (or [B, H, W, 3]), got {img.dtype} "
                               f"{list(img.shape)}{hint}")
        images[key] = np.ascontiguousarray(img)
    prompt = request.get("prompt", request.get("instruction", spec.instruction))
    prompts = list(prompt) if isinstance(prompt, list | tuple) else [str(prompt)] * state.shape[0]
    return {"images": images, "state": state, "instruction": prompts}, batched


class PolicyServer:
    """Websocket policy server. ``start()`` runs it on a background thread (``port=0`` picks a free port)."""

    def __init__(self, policy: Any, host: str = "127.0.0.1", port: int = 8000, metadata: dict | None = None):
        self.policy = policy.eval()
        self.host, self.port = host, port
        spec = policy.spec
        self.metadata = {
            "policy": getattr(policy, "name", type(policy).__name__),
            "chunk_size": int(policy.chunk_size),
            "action_dim": int(spec.action_dim),
            "state_dim": int(spec.state_dim),
            "image_keys": list(spec.image_keys),
            "instruction": spec.instruction,
            **(metadata or {}),
        }
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy-infer")
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.requests_served = 0
        self.errors_sent = 0

    # -- inference (worker thread) --------------------------------------------------------------
    def infer(self, request: Any) -> dict[str, Any]:
        obs, batched = observation_from_request(request, self.policy.spec)
        t0 = time.perf_counter()
        with torch.inference_mode():
            actions = self.policy.act(obs)
        actions = actions.detach().cpu().numpy().astype(np.float32)
        infer_ms = (time.perf_counter() - t0) * 1e3
        return {"actions": actions if batched else actions[0], "server_timing": {"infer_ms": infer_ms}}

    # -- websocket side (event loop) -------------------------------------------------------------
    async def _handler(self, ws) -> None:
        await ws.send(packb(self.metadata))
        loop = asyncio.get_running_loop()
        prev_total_ms = 0.0
        async for message in ws:
            t0 = time.perf_counter()
            try:
                if isinstance(message, str):
                    raise RequestError("send binary msgpack-numpy messages, not text")
                request = unpackb(message)
                reply = await loop.run_in_executor(self._executor, self.infer, request)
                reply["server_timing"]["prev_total_ms"] = prev_total_ms
                await ws.send(packb(reply))
                self.requests_served += 1
            except (RequestError, WireError) as exc:
                self.errors_sent += 1
                log.warning("bad request: %s", exc)
                await ws.send(f"bad request: {exc}")
            except Exception as exc:  # the model itself failed: report, keep serving
                self.errors_sent += 1
                log.exception("inference failed")
                await ws.send(f"inference failed: {type(exc).__name__}: {exc}")
            prev_total_ms = (time.perf_counter() - t0) * 1e3

    @staticmethod
    def _health(connection, request):
        if request.path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        return None

    async def serve(self) -> None:
        """Run until ``stop()``; use directly with ``asyncio.run`` or via ``start()``."""
        from websockets.asyncio.server import serve

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with serve(self._handler, self.host, self.port, compression=None, max_size=None,
                         process_request=self._health) as server:
            self.port = server.sockets[0].getsockname()[1]
            log.info("policy server on ws://%s:%d", self.host, self.port)
            self._ready.set()
            await self._stop.wait()

    def start(self, timeout: float = 10.0) -> PolicyServer:
        def run() -> None:
            try:
                asyncio.run(self.serve())
            except BaseException as exc:  # surfaced by start()
                self._error = exc
                self._ready.set()

        self._thread = threading.Thread(target=run, name="policy-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            raise RuntimeError(f"policy server did not start on {self.host}:{self.port}: {self._error}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._executor.shutdown(wait=True)

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_checkpoint(checkpoint: str, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Blocking entry point: load a ``save_pretrained`` directory and serve it until Ctrl+C."""
    from policies.base import Policy

    torch.set_num_threads(1)
    server = PolicyServer(Policy.from_pretrained(checkpoint), host=host, port=port)
    try:
        asyncio.run(server.serve())
    except KeyboardInterrupt:
        pass
