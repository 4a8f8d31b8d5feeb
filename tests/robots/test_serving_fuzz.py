"""Property-based fuzzing of the policy server's decoder and of a live server.

Random, truncated, oversized, wrong-dtype, wrong-shape and wrong-structure payloads (hypothesis, derandomized so
the run is the same every time) must each get an error reply naming the problem, never reach the model as an
exception (``inference_failures`` stays 0), and the server must answer correct requests correctly throughout.
Default tier: 1,000 decoder-level payloads and 300 through a live server; slow tier: 10,000 through a live server.
"""

from __future__ import annotations

import collections

import msgpack
import numpy as np
import pytest
import torch

pytest.importorskip("websockets", reason="the policy server needs the robot extra (pip install -e .[robot])")
hypothesis = pytest.importorskip("hypothesis", reason="fuzz tests need hypothesis (pip install -e .[test])")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

from policies.base import Policy  # noqa: E402
from robots.policy_client import PolicyClient  # noqa: E402
from robots.policy_server import PolicyServer, RequestError  # noqa: E402
from robots.wire import WireError, packb  # noqa: E402
from tests.robots.waits import wait_until  # noqa: E402

D, CAMS, MAX_BATCH = 8, ("base", "wrist"), 4
LIVE_MAX_BYTES = 64 * 1024  # small on purpose: oversized payloads stay cheap to send thousands of times
KINDS = ("random", "truncated", "wrong_dtype", "wrong_shape", "bad_header", "structure", "oversized")


@st.composite
def valid_requests(draw) -> dict:
    """A correct request with small images (the tiny MLP policy takes any image size); the arrays come from a
    drawn seed, which keeps a thousand examples fast (hypothesis' own array strategy is ~20x slower here)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    h, w = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    return {"state": rng.uniform(-10, 10, D).astype(np.float32),
            "images": {k: rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for k in CAMS},
            "prompt": draw(st.text(max_size=20))}


def _raw_array(dtype: str, shape, data: bytes) -> dict:
    """An ndarray as it travels, built by hand: packb itself refuses to write the bad ones."""
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}


@st.composite
def wrong_dtype(draw) -> bytes:
    req = draw(valid_requests())
    if draw(st.booleans()):  # state of strings, bools, dates: never parsed into numbers
        dtype = draw(st.sampled_from(["U4", "S4", "?", "M8[s]", "m8[s]"]))
        req["state"] = np.zeros(D, dtype=dtype)
    else:  # frames that are not uint8
        dtype = draw(st.sampled_from([np.float32, np.float64, np.int16, np.uint16, np.int8, np.int64, np.bool_]))
        cam = draw(st.sampled_from(CAMS))
        req["images"][cam] = req["images"][cam].astype(dtype)
    if draw(st.booleans()):  # or a dtype the wire refuses outright (pickle, complex, zero-size, unknown)
        dtype = draw(st.sampled_from(["|O", "|V8", "<c8", "<c16", "S0", "U0", "zz9", 3]))
        packed = msgpack.packb({"state": _raw_array(dtype, [D], bytes(8 * D)), "prompt": "x"}, use_bin_type=True)
        return packed
    return packb(req)


def _is_valid_image_shape(shape: tuple) -> bool:
    lead_ok = len(shape) == 3 or (len(shape) == 4 and shape[0] == 1)
    return lead_ok and shape[-1] == 3 and 0 not in shape


@st.composite
def wrong_shape(draw) -> bytes:
    req = draw(valid_requests())
    if draw(st.booleans()):
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=10)
                     .filter(lambda s: s not in ((D,), (1, D))))
        req["state"] = np.ones(shape, np.float32)
    else:
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=5)
                     .filter(lambda s: not _is_valid_image_shape(s)))
        req["images"][draw(st.sampled_from(CAMS))] = np.zeros(shape, np.uint8)
    return packb(req)


@st.composite
def bad_header(draw) -> bytes:
    """ndarray headers that lie: shape vs data size, negative or float sides, absurd declared sizes."""
    shape = draw(st.one_of(
        st.lists(st.integers(0, 9), min_size=1, max_size=3),  # usually not matching the data below
        st.lists(st.integers(-5, -1), min_size=1, max_size=2),
        st.just([2**40, 2**40]), st.just([2**62, 4]),  # "oversized" by declaration, a few bytes of data
        st.just([1.5, 2]), st.just("8"), st.just(None), st.just([[8]])))
    data = draw(st.binary(max_size=64))
    if isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape) and np.prod(shape) * 4 == len(data):
        data += b"\0"  # a consistent header is not a bad header
    return msgpack.packb({"state": _raw_array("<f4", shape, data), "prompt": "x"}, use_bin_type=True)


@st.composite
def bad_structure(draw) -> bytes:
    req = draw(valid_requests())
    kind = draw(st.integers(0, 8))
    if kind == 0:
        return packb(draw(st.one_of(st.integers(-2**63, 2**64 - 1), st.text(max_size=8), st.lists(st.integers(-9, 9), max_size=3),
                                    st.none(), st.floats(allow_nan=False))))
    if kind == 1:
        del req["state"]
    elif kind == 2:
        req["images"] = draw(st.one_of(st.text(max_size=5), st.lists(st.integers(-9, 9), max_size=3), st.integers(-9, 9)))
    elif kind == 3:
        del req["images"][draw(st.sampled_from(CAMS))]
    elif kind == 4:
        req["prompt"] = draw(st.one_of(st.integers(-9, 9), st.lists(st.text(max_size=3), min_size=2, max_size=4),
                                       st.none(), st.binary(max_size=4)))
    elif kind == 5:
        req["state"][draw(st.integers(0, D - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    elif kind == 6:  # a batch past max_batch, every part consistent
        b = draw(st.integers(MAX_BATCH + 1, MAX_BATCH + 3))
        req = {"state": np.zeros((b, D), np.float32), "prompt": "x",
               "images": {k: np.zeros((b, 2, 2, 3), np.uint8) for k in CAMS}}
    elif kind == 7:
        req["state"] = draw(st.sampled_from([[1.0, "a"] * 4, [[1.0], [1.0, 2.0]], {"x": 1}, "1,2,3"]))
    else:
        req["images"][draw(st.sampled_from(CAMS))] = draw(st.sampled_from([[[[0, 0, 0]]], "pixels", 7]))
    return packb(req)


def _truncated(req: dict, cut: float) -> bytes:
    data = packb(req)
    return data[: int(cut * (len(data) - 1))]


STRATEGIES = {"random": st.binary(max_size=512),
              "truncated": st.builds(_truncated, valid_requests(), st.floats(0, 1)),
              "wrong_dtype": wrong_dtype(), "wrong_shape": wrong_shape(), "bad_header": bad_header(),
              "structure": bad_structure(),
              "oversized": st.integers(1, 4096).map(lambda n: b"\x07" * (LIVE_MAX_BYTES + n))}


def fuzz(kinds: tuple[str, ...], n: int, check) -> collections.Counter[str]:
    """Run ``check(kind, payload)`` on ``n`` payloads split evenly over ``kinds`` (one derandomized hypothesis
    search per kind, so every kind gets its share); returns how many of each ran. Oversized at the decoder means
    declared sizes (in ``bad_header``); on a live server, real bytes past the server's limit."""
    seen: collections.Counter[str] = collections.Counter()

    def search(kind: str):
        @settings(max_examples=-(-n // len(kinds)), derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(payload=STRATEGIES[kind])
        def run(payload: bytes) -> None:
            seen[kind] += 1
            check(kind, payload)

        return run

    for kind in kinds:
        search(kind)()
    return seen


def _expected(policy: Policy, req: dict) -> np.ndarray:
    obs = {"state": torch.from_numpy(req["state"])[None], "images": {}, "instruction": [req["prompt"]]}
    return policy.act(obs)[0].numpy()


def test_decoder_gives_every_bad_payload_a_named_error(tiny_policy_dir):
    """1,000 payloads through exactly what the server runs per message (``handle``: decode, validate, infer)."""
    policy = Policy.from_pretrained(tiny_policy_dir).eval()
    server = PolicyServer(policy, port=0, max_batch=MAX_BATCH)  # not started: the decoder alone
    def check(kind: str, payload: bytes) -> None:
        with pytest.raises((RequestError, WireError)) as e:
            server.handle(payload)
        assert str(e.value).strip() and "\n" not in str(e.value)[:200]

    seen = fuzz(KINDS[:-1], 1000, check)
    assert sum(seen.values()) >= 1000 and min(seen.values()) >= 150, seen
    req = {  # and a correct request still gives the right actions
        "state": np.linspace(-1, 1, D, dtype=np.float32), "prompt": "p",
        "images": {k: np.zeros((3, 3, 3), np.uint8) for k in CAMS}}
    np.testing.assert_allclose(server.handle(packb(req))["actions"], _expected(policy, req), atol=1e-6)
    server.stop()


class _Conn:
    """One client connection that reconnects after the server closes it (oversized messages)."""

    def __init__(self, port: int):
        self.port, self.client = port, PolicyClient("127.0.0.1", port)

    def send_bad(self, payload: bytes) -> tuple[str, str | int]:
        from websockets.exceptions import ConnectionClosedError

        try:
            self.client._ws.send(payload)
            reply = self.client._ws.recv(timeout=30)
        except ConnectionClosedError as exc:
            self.client = PolicyClient("127.0.0.1", self.port)
            return "closed", exc.rcvd.code if exc.rcvd is not None else -1
        return "reply", reply if isinstance(reply, str) else f"binary reply of {len(reply)} bytes"


def _until(condition, what: str, limit_s: float = 10.0) -> None:
    """Wait for the server's event loop to finish its bookkeeping (a close is counted after the client saw it)."""
    assert wait_until(condition, limit_s), f"server never reached: {what}"


def _fuzz_live(policy: Policy, n: int) -> None:
    rng = np.random.default_rng(0)
    good = [{"state": rng.normal(size=D).astype(np.float32), "prompt": "pick up the cube",
             "images": {k: rng.integers(0, 255, (4, 4, 3), dtype=np.uint8) for k in CAMS}} for _ in range(8)]
    with PolicyServer(policy, port=0, max_batch=MAX_BATCH, max_message_bytes=LIVE_MAX_BYTES) as srv:
        conn, checker, count = _Conn(srv.port), PolicyClient("127.0.0.1", srv.port), [0]

        def check(kind: str, payload: bytes) -> None:
            how, what = conn.send_bad(payload)
            if kind == "oversized":
                assert (how, what) == ("closed", 1009)
            else:
                assert how == "reply" and isinstance(what, str) and what.startswith("bad request: "), (kind, what)
            count[0] += 1
            if count[0] % 50 == 0:  # the server keeps serving correct requests, on both connections
                req = good[count[0] // 50 % len(good)]
                for client in (checker, conn.client):
                    np.testing.assert_allclose(client.infer(req)["actions"], _expected(policy, req), atol=1e-6)

        seen = fuzz(KINDS, n, check)
        total = sum(seen.values())
        assert total >= n and min(seen.values()) >= n // 10, seen
        for req in good:
            np.testing.assert_allclose(conn.client.infer(req)["actions"], _expected(policy, req), atol=1e-6)
        conn.client.close()
        checker.close()
        _until(lambda: srv.metrics.clients == 0, "every connection's close counted")
        snap = srv.metrics.snapshot()
        assert snap["inference_failures"] == 0  # nothing malformed reached the model
        assert snap["bad_requests"] == total - seen["oversized"]
        assert snap["protocol_errors"] == seen["oversized"]


def test_live_server_survives_fuzzing(tiny_policy_dir):
    _fuzz_live(Policy.from_pretrained(tiny_policy_dir).eval(), 300)


@pytest.mark.slow
def test_live_server_survives_10k_fuzzed_payloads(tiny_policy_dir):
    _fuzz_live(Policy.from_pretrained(tiny_policy_dir).eval(), 10_000)
