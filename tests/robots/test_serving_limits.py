"""Policy server under attack and load: API key (checked with openpi's own client), bounded messages and
clients, one bad connection never hurting another, and the /metrics counters that say what happened."""

from __future__ import annotations

import http.client
import socket
import threading

import numpy as np
import pytest
import torch

from policies.base import Policy
from robots.policy_client import API_KEY_ENV, PolicyClient, PolicyServerError
from robots.policy_server import PolicyServer, message_bytes_bound, parse_prometheus
from tests.robots.waits import wait_until

pytest.importorskip("websockets", reason="the policy server needs the robot extra (pip install -e .[robot])")

KEY = "lab-secret-7f3a"


def _request(rng: np.random.Generator, batch: int | None = None) -> dict:
    lead = () if batch is None else (batch,)
    return {"state": rng.normal(size=(*lead, 8)).astype(np.float32), "prompt": "pick up the cube",
            "images": {k: rng.integers(0, 255, (*lead, 224, 224, 3), dtype=np.uint8) for k in ("base", "wrist")}}


def _expected(policy: Policy, req: dict) -> np.ndarray:
    obs = {"state": torch.from_numpy(req["state"])[None], "images": {}, "instruction": [req["prompt"]]}
    return policy.act(obs)[0].numpy()


def _until(condition, what: str, limit_s: float = 10.0) -> None:
    """Wait for the server's event loop to finish its bookkeeping (a close is counted after the client saw it)."""
    assert wait_until(condition, limit_s), f"server never reached: {what}"


def _get(port: int, path: str, key: str | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", path, headers={"Authorization": f"Api-Key {key}"} if key else {})
    resp = conn.getresponse()
    out = resp.status, resp.read().decode()
    conn.close()
    return out


@pytest.fixture
def policy(tiny_policy_dir):
    return Policy.from_pretrained(tiny_policy_dir).eval()


def test_wrong_api_key_is_refused_with_openpi_client(policy):
    wcp = pytest.importorskip("openpi_client.websocket_client_policy")
    from websockets.exceptions import ConnectionClosedError

    with PolicyServer(policy, port=0, api_key=KEY) as srv:
        for key in ("wrong-key", None):  # a wrong key and no key at all
            with pytest.raises(ConnectionClosedError) as e:
                wcp.WebsocketClientPolicy(host="127.0.0.1", port=srv.port, api_key=key)
            assert e.value.rcvd.code == 1008 and "invalid API key" in e.value.rcvd.reason
            assert "Api-Key <key>" in e.value.rcvd.reason  # the reason says how to send it
        good = wcp.WebsocketClientPolicy(host="127.0.0.1", port=srv.port, api_key=KEY)
        req = _request(np.random.default_rng(0))
        np.testing.assert_allclose(good.infer(req)["actions"], _expected(policy, req), atol=1e-6)
        _until(lambda: srv.metrics.refused_auth == 2, "two refusals counted")
        snap = srv.metrics.snapshot()
        assert snap["refused"] == 2 and snap["requests"] == 1 and snap["errors"] == 0 and snap["clients"] == 1


def test_vlarl_client_sends_the_key_and_names_a_refusal(policy, monkeypatch):
    with PolicyServer(policy, port=0, api_key=KEY) as srv:
        with pytest.raises(ConnectionError, match=r"refused the connection: invalid API key.*\(code 1008\)"):
            PolicyClient("127.0.0.1", srv.port, api_key="nope")
        monkeypatch.setenv(API_KEY_ENV, KEY)  # what vlarl-eval and vlarl-deploy clients pick up
        with PolicyClient("127.0.0.1", srv.port) as client:
            assert client.infer(_request(np.random.default_rng(1)))["actions"].shape == (4, 7)
        # metrics need the key too (they say how busy the arm's server is); health does not
        assert _get(srv.port, "/metrics")[0] == 401 and _get(srv.port, "/metrics", "nope")[0] == 401
        status, text = _get(srv.port, "/metrics", KEY)
        assert status == 200 and parse_prometheus(text)["requests"] == 1
        assert _get(srv.port, "/healthz") == (200, "OK\n")


def test_message_bound_is_derived_from_the_spec_and_enforced(policy):
    # 2 cameras x 224 x 224 x 3 + state 8 x 8 bytes + 4 KiB prompt = 305,216 bytes per observation
    assert message_bytes_bound(policy.spec, max_batch=1) == 2 * 305_216 + 65_536
    assert message_bytes_bound(policy.spec, max_batch=64) == 2 * 64 * 305_216 + 65_536
    from websockets.exceptions import ConnectionClosedError

    rng = np.random.default_rng(2)
    with PolicyServer(policy, port=0, max_batch=1) as srv, PolicyClient("127.0.0.1", srv.port) as bystander:
        assert srv.max_message_bytes == 2 * 305_216 + 65_536 == bystander.metadata["max_message_bytes"]
        with PolicyClient("127.0.0.1", srv.port) as big:
            big.infer(_request(rng))  # a full-size observation fits
            with pytest.raises(PolicyServerError, match="batch of 2 observations.*max_batch"):
                big.infer(_request(rng, batch=2))  # under the byte bound, over the batch bound
            with pytest.raises(ConnectionClosedError) as e:
                big.infer({"state": np.zeros(8, np.float32), "pad": b"\0" * srv.max_message_bytes})
            assert e.value.rcvd.code == 1009 and f"exceeds limit of {srv.max_message_bytes} bytes" in e.value.rcvd.reason
        req = _request(rng)  # the other connection never noticed
        np.testing.assert_allclose(bystander.infer(req)["actions"], _expected(policy, req), atol=1e-6)
        _until(lambda: srv.metrics.protocol_errors == 1, "the oversized message counted")
        snap = srv.metrics.snapshot()
        assert snap["bad_requests"] == 1 and snap["errors"] == 2 and snap["requests"] == 2


def test_client_bound_refuses_past_it_and_frees_on_close(policy):
    with PolicyServer(policy, port=0, max_clients=2) as srv:
        first, second = PolicyClient("127.0.0.1", srv.port), PolicyClient("127.0.0.1", srv.port)
        with pytest.raises(ConnectionError, match=r"server full: max_clients=2.*\(code 1013\)"):
            PolicyClient("127.0.0.1", srv.port)
        assert first.infer(_request(np.random.default_rng(3)))["actions"].shape == (4, 7)  # still served
        second.close()
        _until(lambda: srv.metrics.clients == 1, "the closed client's slot freed")
        with PolicyClient("127.0.0.1", srv.port) as third:
            assert third.infer(_request(np.random.default_rng(4)))["actions"].shape == (4, 7)
        first.close()
        assert srv.metrics.refused_full == 1 and srv.metrics.refused_auth == 0


def test_one_bad_connection_never_hurts_another(policy):
    """While a good client runs requests, others send garbage, a half frame then vanish, raw HTTP noise, and a
    handshake that never completes; every good reply is still the right action."""
    rng = np.random.default_rng(5)
    reqs = [_request(rng) for _ in range(20)]
    with PolicyServer(policy, port=0) as srv:
        results: list[np.ndarray] = []
        started, go_on = threading.Event(), threading.Event()

        def good_client() -> None:
            with PolicyClient("127.0.0.1", srv.port) as c:
                for i, req in enumerate(reqs):
                    results.append(c.infer(req)["actions"])
                    if i == 0:
                        started.set()
                        assert go_on.wait(30)

        th = threading.Thread(target=good_client)
        th.start()
        assert started.wait(30)
        with PolicyClient("127.0.0.1", srv.port) as noisy:  # garbage on a live connection: error replies
            for payload in (b"\xc1", b"\x93\x01", "text"):
                noisy._ws.send(payload)
                assert isinstance(noisy._ws.recv(timeout=10), str)
        half = PolicyClient("127.0.0.1", srv.port)  # a frame header announcing 1,000 bytes, 3 sent, then gone
        half._ws.socket.sendall(b"\x82\xfe\x03\xe8" + b"\x00" * 4 + b"abc")
        half._ws.socket.shutdown(socket.SHUT_RDWR)
        half._ws.socket.close()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as raw:  # not HTTP at all
            raw.sendall(b"\x16\x03\x01 TLS hello to the wrong port\r\n\r\n")
            raw.recv(1024)
        stalled = socket.create_connection(("127.0.0.1", srv.port), timeout=5)  # opens, sends nothing
        go_on.set()
        th.join(60)
        stalled.close()
        assert len(results) == len(reqs)
        for req, got in zip(reqs, results, strict=True):
            np.testing.assert_allclose(got, _expected(policy, req), atol=1e-6)
        _until(lambda: srv.metrics.dropped == 1 and srv.metrics.clients == 0, "the vanished client counted")
        assert srv.metrics.bad_requests == 3 and srv.metrics.requests == len(reqs)
        assert srv.metrics.snapshot()["latency_ms_p99"] >= srv.metrics.snapshot()["latency_ms_p50"] > 0


def test_bad_limits_are_one_line_errors(policy, capsys, tiny_policy_dir, monkeypatch):
    for kwargs, msg in (({"max_clients": 0}, "max_clients=0 must be an integer >= 1"),
                        ({"max_batch": -1}, "max_batch=-1"), ({"api_key": ""}, "api_key must be"),
                        ({"api_key": "two words"}, "without spaces")):
        with pytest.raises(ValueError, match=msg):
            PolicyServer(policy, port=0, **kwargs)
    from robots.serve import main

    for arg, msg in (("max_clients=0", "max_clients='0' must be an integer in [1,"),
                     ("max_batch=x", "max_batch='x'"), ("max_message_mb=-3", "max_message_mb='-3' must be")):
        assert main([f"checkpoint={tiny_policy_dir}", arg]) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and len(err.splitlines()) == 1
    monkeypatch.setenv(API_KEY_ENV, "has space")
    assert main([f"checkpoint={tiny_policy_dir}", "port=0"]) == 2
    assert "api_key must be" in capsys.readouterr().err
