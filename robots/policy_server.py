"""Serve any vlarl policy over a websocket with msgpack-numpy, compatible with openpi's protocol.

Protocol (as spoken by ``openpi_client.WebsocketClientPolicy``):

1. client connects (with ``Authorization: Api-Key <key>`` when the server has an ``api_key``; openpi's client
   sends it for ``api_key=``); the server sends one binary message: the metadata dict (policy name, chunk
   size, action dim, state dim, image keys, instruction, and the server's limits);
2. each request is a binary msgpack-numpy dict (one observation), each reply a binary dict
   ``{"actions": float32 [T, A], "server_timing": {"infer_ms": float, "prev_total_ms": float}}``;
3. a request that cannot be served gets a *text* message naming the problem (openpi's client raises
   it as ``RuntimeError``); the connection and the server stay up.

Hardening, because this port drives a real arm on a lab network:
- a connection without the right key is closed with code 1008 and a reason saying how to send it;
- past ``max_clients`` open connections a new one is closed with 1013 ("try again later") and the limit;
- a message larger than ``max_message_bytes`` (derived from the observation spec, see ``message_bytes_bound``)
  is refused by the websocket layer before it is buffered: code 1009 with both sizes in the reason;
- every connection's errors stay on that connection; the counts are in ``metrics``.

Plain HTTP on the same port: ``GET /healthz`` answers ``200 OK`` (no key needed, for load balancers);
``GET /metrics`` answers Prometheus text (requests, errors, refusals, clients, latency p50/p99; it needs the
key when one is set).

Observations (keys accepted, openpi style, one example or a batch):
    state:  float [D] or [B, D]        (also ``observation/state``)
    images: {name: uint8 [H, W, 3]}    (also ``image``; or top-level ``observation/<name>`` arrays)
    prompt: str                        (also ``instruction``)
Inference runs on one worker thread, so the event loop keeps answering health checks and other
clients while a model computes.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import hmac
import http
import logging
import threading
import time
from typing import Any

import numpy as np
import torch

from robots.wire import WireError, packb, unpackb

log = logging.getLogger(__name__)

API_KEY_SCHEME = "Api-Key"  # openpi's client sends ``Authorization: Api-Key <key>``
PROMPT_BYTES = 4096  # room for one prompt per example
ENVELOPE_BYTES = 64 * 1024  # msgpack keys, ndarray headers, a batch's prompt list
HEADROOM = 2  # a client may send images up to ~1.4x the spec's side, or float64 state
UNKNOWN_IMAGE_HW = (512, 512)  # per camera, when the spec does not say the image size
LATENCY_WINDOW = 10_000  # requests kept for the percentiles: bounded memory on a months-long run
LOGGED_BAD_REQUESTS = 10  # per connection; the rest are only counted


class RequestError(ValueError):
    """A request the policy cannot serve; its text goes back to the client."""


def message_bytes_bound(spec: Any, max_batch: int) -> int:
    """Largest request the server accepts, in bytes, for a policy with this ``PolicySpec``.

    ``HEADROOM x max_batch x (cameras x H x W x 3 + state_dim x 8 + PROMPT_BYTES) + ENVELOPE_BYTES``: a batch of
    ``max_batch`` observations at the spec's image size fits twice over; 64 MiB of garbage does not.
    """
    h, w = spec.image_size or UNKNOWN_IMAGE_HW
    per_example = len(spec.image_keys) * int(h) * int(w) * 3 + int(spec.state_dim) * 8 + PROMPT_BYTES
    return HEADROOM * max_batch * per_example + ENVELOPE_BYTES


def observation_from_request(request: Any, spec: Any, max_batch: int | None = None) -> tuple[dict[str, Any], bool]:
    """Turn an openpi-style request into vlarl's batched observation schema.

    Returns ``(obs, batched)``; ``obs`` = ``{"images": {k: uint8 [B,H,W,3]}, "state": float32 [B, D],
    "instruction": list[str]}``. ``spec`` is the policy's ``PolicySpec``; a batch larger than ``max_batch``
    is refused. Every problem is a ``RequestError`` whose text names it.
    """
    if not isinstance(request, dict):
        raise RequestError(f"request must be a dict of observations, got {type(request).__name__}")
    state = request.get("state", request.get("observation/state"))
    if state is None:
        keys = sorted(map(str, request))[:20]
        raise RequestError(f"request has no 'state' (float [{spec.state_dim}]); keys were {keys}")
    try:
        raw_state = np.asarray(state)
    except (TypeError, ValueError) as exc:  # ragged nested lists
        raise RequestError(f"'state' must be an array of numbers, float [{spec.state_dim}] ({exc})") from exc
    if raw_state.dtype.kind not in "iuf":  # no silent parse of strings, bools, dates or objects into numbers
        raise RequestError(f"'state' must be numbers (float [{spec.state_dim}]), got dtype {raw_state.dtype}")
    with np.errstate(over="ignore"):  # 1e300 becomes inf, refused below by name
        state = raw_state.astype(np.float32)  # a copy: frames from the wire are read-only
    batched = state.ndim == 2
    if state.ndim == 1:
        state = state[None]
    if state.ndim != 2 or state.shape[1] != spec.state_dim:
        raise RequestError(f"'state' must have shape [{spec.state_dim}] or [B, {spec.state_dim}], got {list(state.shape)}")
    if state.shape[0] == 0 or (max_batch is not None and state.shape[0] > max_batch):
        raise RequestError(f"batch of {state.shape[0]} observations; the server takes 1 to {max_batch} per request "
                           f"(split the batch, or start the server with a larger max_batch)")
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
            raise RequestError(f"policy needs image '{key}'; request has images {sorted(map(str, raw_images))[:20]}")
        img = raw_images[key]
        if not isinstance(img, np.ndarray):
            raise RequestError(f"image '{key}' must be a uint8 array [H, W, 3], got {type(img).__name__}")
        if img.ndim == 3:
            img = img[None]
        # no silent conversion: a float frame cast to uint8 turns black, a CHW frame scrambles its pixels
        if img.dtype != np.uint8 or img.ndim != 4 or img.shape[-1] != 3 or img.shape[0] != state.shape[0] \
                or 0 in img.shape:
            hint = " (channels first? send HWC)" if img.ndim == 4 and img.shape[1] == 3 else ""
            hint += " (float? send uint8 0..255)" if img.dtype != np.uint8 else ""
            raise RequestError(f"image '{key}' must be uint8 [H, W, 3] (or [B, H, W, 3]), got {img.dtype} "
                               f"{list(img.shape)}{hint}")
        images[key] = np.ascontiguousarray(img)
    prompt = request.get("prompt", request.get("instruction", spec.instruction))
    if isinstance(prompt, list | tuple):
        if len(prompt) != state.shape[0] or not all(isinstance(p, str) for p in prompt):
            raise RequestError(f"'prompt' as a list must hold {state.shape[0]} strings, one per observation")
        prompts = list(prompt)
    elif isinstance(prompt, str):
        prompts = [prompt] * state.shape[0]
    else:
        raise RequestError(f"'prompt' must be a string (or one per observation), got {type(prompt).__name__}")
    return {"images": images, "state": state, "instruction": prompts}, batched


class ServerMetrics:
    """Counters and a bounded latency window; written on the event loop, read from any thread.

    ``errors`` = requests answered with an error text + messages the websocket layer refused (too big,
    not a valid frame); ``refused`` = connections closed before serving (bad key, server full); ``dropped`` =
    connections that ended without a close frame (a client killed or unplugged: not the server's error).
    """

    def __init__(self, window: int = LATENCY_WINDOW):
        self._lock = threading.Lock()
        self._latency_ms: collections.deque[float] = collections.deque(maxlen=window)
        self.requests = self.bad_requests = self.inference_failures = self.protocol_errors = 0
        self.refused_auth = self.refused_full = self.connections = self.clients = self.dropped = 0

    def served(self, ms: float) -> None:
        with self._lock:
            self.requests += 1
            self._latency_ms.append(ms)

    def snapshot(self) -> dict[str, float | int]:
        """All counters plus ``latency_ms_p50`` / ``latency_ms_p99`` over the last requests (0 before any)."""
        with self._lock:
            lat = np.fromiter(self._latency_ms, dtype=np.float64)
        p50, p99 = (np.percentile(lat, [50, 99]) if lat.size else (0.0, 0.0))
        return {"requests": self.requests, "errors": self.bad_requests + self.inference_failures + self.protocol_errors,
                "bad_requests": self.bad_requests, "inference_failures": self.inference_failures,
                "protocol_errors": self.protocol_errors, "refused": self.refused_auth + self.refused_full,
                "refused_auth": self.refused_auth, "refused_full": self.refused_full,
                "connections": self.connections, "dropped": self.dropped, "clients": self.clients,
                "latency_ms_p50": float(p50), "latency_ms_p99": float(p99)}

    def prometheus(self) -> str:
        """The snapshot in Prometheus' text format (``vlarl_policy_server_<name>``)."""
        lines = []
        for name, value in self.snapshot().items():
            if name.startswith("latency_ms_"):
                q = {"latency_ms_p50": "0.5", "latency_ms_p99": "0.99"}[name]
                lines.append(f'vlarl_policy_server_latency_ms{{quantile="{q}"}} {value:.6g}')
            else:
                kind = "gauge" if name == "clients" else "counter"
                metric = f"vlarl_policy_server_{name}" + ("_total" if kind == "counter" else "")
                lines += [f"# TYPE {metric} {kind}", f"{metric} {value}"]
        return "\n".join(lines) + "\n"


def parse_prometheus(text: str) -> dict[str, float]:
    """Inverse of ``ServerMetrics.prometheus`` for scripts and tests: ``{"requests": 12.0, "latency_ms_p99": ...}``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, value = line.rsplit(" ", 1)
        name = name.removeprefix("vlarl_policy_server_").removesuffix("_total")
        if name.startswith("latency_ms{"):
            name = {"0.5": "latency_ms_p50", "0.99": "latency_ms_p99"}[name.split('"')[1]]
        out[name] = float(value)
    return out


class PolicyServer:
    """Websocket policy server. ``start()`` runs it on a background thread (``port=0`` picks a free port).

    ``api_key``: when set, a connection must send ``Authorization: Api-Key <key>`` (openpi's
    ``WebsocketClientPolicy(api_key=...)``, vlarl's ``PolicyClient(api_key=...)``). ``max_clients``: open
    connections served at once. ``max_batch``: observations per request. ``max_message_bytes``: largest request
    (0 = ``message_bytes_bound(spec, max_batch)``). Worst-case buffered input is about
    ``max_clients x 3 x max_message_bytes`` (one message being read plus ``MAX_QUEUE`` waiting per connection).
    """

    MAX_QUEUE = 2  # request/reply protocol: a client has at most one request in flight, so two is headroom

    def __init__(self, policy: Any, host: str = "127.0.0.1", port: int = 8000, metadata: dict | None = None,
                 api_key: str | None = None, max_clients: int = 64, max_batch: int = 64,
                 max_message_bytes: int = 0):
        for name, value, least in (("max_clients", max_clients, 1), ("max_batch", max_batch, 1),
                                   ("max_message_bytes", max_message_bytes, 0)):
            if not isinstance(value, int) or value < least:
                raise ValueError(f"{name}={value!r} must be an integer >= {least}")
        if api_key is not None and (not api_key or not api_key.isprintable() or " " in api_key):
            raise ValueError("api_key must be a non-empty printable string without spaces (or None for no check)")
        self.policy = policy.eval()
        self.host, self.port = host, port
        spec = policy.spec
        self.api_key, self.max_clients, self.max_batch = api_key, max_clients, max_batch
        self.max_message_bytes = max_message_bytes or message_bytes_bound(spec, max_batch)
        self.metadata = {
            "policy": getattr(policy, "name", type(policy).__name__),
            "chunk_size": int(policy.chunk_size),
            "action_dim": int(spec.action_dim),
            "state_dim": int(spec.state_dim),
            "image_keys": list(spec.image_keys),
            "instruction": spec.instruction,
            "max_batch": max_batch,
            "max_message_bytes": self.max_message_bytes,
            **(metadata or {}),
        }
        self.metrics = ServerMetrics()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy-infer")
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def requests_served(self) -> int:
        return self.metrics.requests

    @property
    def errors_sent(self) -> int:
        """Requests answered with an error text."""
        return self.metrics.bad_requests + self.metrics.inference_failures

    # -- inference (worker thread) --------------------------------------------------------------
    def infer(self, request: Any) -> dict[str, Any]:
        obs, batched = observation_from_request(request, self.policy.spec, self.max_batch)
        t0 = time.perf_counter()
        with torch.inference_mode():
            actions = self.policy.act(obs)
        actions = actions.detach().cpu().numpy().astype(np.float32)
        infer_ms = (time.perf_counter() - t0) * 1e3
        return {"actions": actions if batched else actions[0], "server_timing": {"infer_ms": infer_ms}}

    def handle(self, message: bytes | str) -> dict[str, Any]:
        """One websocket message in, the reply dict out; ``RequestError`` / ``WireError`` name what is wrong with
        a bad message (decoded here, on the worker thread, so a large message never stalls the event loop)."""
        if isinstance(message, str):
            raise RequestError("send binary msgpack-numpy messages, not text")
        return self.infer(unpackb(message))

    # -- websocket side (event loop) -------------------------------------------------------------
    def authorized(self, headers: Any) -> bool:
        """True when no key is set, or ``headers`` carry ``Authorization: Api-Key <the key>`` (constant time)."""
        if self.api_key is None:
            return True
        scheme, _, key = (headers.get("Authorization") or "").partition(" ")
        return scheme == API_KEY_SCHEME and hmac.compare_digest(key.strip().encode(), self.api_key.encode())

    async def _handler(self, ws) -> None:
        from websockets.exceptions import ConnectionClosed
        from websockets.frames import CloseCode

        m = self.metrics
        m.connections += 1
        peer = ws.remote_address
        if not self.authorized(ws.request.headers):
            m.refused_auth += 1
            log.warning("refused %s: missing or wrong API key", peer)
            await ws.close(CloseCode.POLICY_VIOLATION, f"invalid API key: send 'Authorization: {API_KEY_SCHEME} <key>'"
                                                       " (openpi: WebsocketClientPolicy(api_key=...))")
            return
        if m.clients >= self.max_clients:
            m.refused_full += 1
            log.warning("refused %s: %d clients already connected (max_clients)", peer, m.clients)
            await ws.close(CloseCode.TRY_AGAIN_LATER, f"server full: max_clients={self.max_clients} connected; "
                                                      "retry later or raise max_clients")
            return
        m.clients += 1
        try:
            await ws.send(packb(self.metadata))
            await self._serve_requests(ws)
        except ConnectionClosed:
            pass
        finally:
            m.clients -= 1
            sent = ws.protocol.close_sent  # what this side closed with: 1009 too big, 1002/1007 bad frames
            if sent is not None and sent.code not in (CloseCode.NORMAL_CLOSURE, CloseCode.GOING_AWAY):
                m.protocol_errors += 1
                log.warning("closed %s: code %d %s", peer, sent.code, sent.reason)
            elif ws.close_code == CloseCode.ABNORMAL_CLOSURE:  # the client vanished without a close frame
                m.dropped += 1

    async def _serve_requests(self, ws) -> None:
        from websockets.exceptions import ConnectionClosed

        loop = asyncio.get_running_loop()
        prev_total_ms, bad = 0.0, 0
        async for message in ws:
            t0 = time.perf_counter()
            try:
                reply = await loop.run_in_executor(self._executor, self.handle, message)
                reply["server_timing"]["prev_total_ms"] = prev_total_ms
                data = packb(reply)
                self.metrics.served((time.perf_counter() - t0) * 1e3)  # counted before the client can see it
                await ws.send(data)
            except ConnectionClosed:
                raise
            except (RequestError, WireError) as exc:
                self.metrics.bad_requests += 1
                bad += 1
                if bad <= LOGGED_BAD_REQUESTS:  # a flood of garbage must not become a flood of log lines
                    more = "; more from this client are counted in /metrics only" if bad == LOGGED_BAD_REQUESTS else ""
                    log.warning("bad request from %s: %.300s%s", ws.remote_address, exc, more)
                await ws.send(f"bad request: {exc}")
            except Exception as exc:  # the model itself failed: report, keep serving
                self.metrics.inference_failures += 1
                log.exception("inference failed")
                await ws.send(f"inference failed: {type(exc).__name__}: {exc}")
            prev_total_ms = (time.perf_counter() - t0) * 1e3

    def _process_request(self, connection, request):
        """Plain HTTP on the websocket port: ``/healthz`` (open) and ``/metrics`` (key-checked)."""
        if request.path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if request.path == "/metrics":
            if not self.authorized(request.headers):
                return connection.respond(http.HTTPStatus.UNAUTHORIZED,
                                          f"send 'Authorization: {API_KEY_SCHEME} <key>'\n")
            response = connection.respond(http.HTTPStatus.OK, self.metrics.prometheus())
            response.headers["Content-Type"] = "text/plain; version=0.0.4; charset=utf-8"
            return response
        return None

    async def serve(self) -> None:
        """Run until ``stop()``; use directly with ``asyncio.run`` or via ``start()``."""
        from websockets.asyncio.server import serve

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with serve(self._handler, self.host, self.port, compression=None, max_size=self.max_message_bytes,
                         max_queue=self.MAX_QUEUE, process_request=self._process_request) as server:
            self.port = server.sockets[0].getsockname()[1]
            log.info("policy server on ws://%s:%d (max_clients=%d, max_message_bytes=%d, api key %s)", self.host,
                     self.port, self.max_clients, self.max_message_bytes, "required" if self.api_key else "off")
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


def serve_checkpoint(checkpoint: str, host: str = "127.0.0.1", port: int = 8000, **limits: Any) -> None:
    """Blocking entry point: load a ``save_pretrained`` directory and serve it until Ctrl+C.

    ``limits``: ``api_key``, ``max_clients``, ``max_batch``, ``max_message_bytes`` of ``PolicyServer``."""
    from policies.base import Policy

    torch.set_num_threads(1)
    server = PolicyServer(Policy.from_pretrained(checkpoint), host=host, port=port, **limits)
    try:
        asyncio.run(server.serve())
    except KeyboardInterrupt:
        pass
