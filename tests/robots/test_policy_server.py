"""Policy server: openpi's own client gets the right actions; bad requests get an error and the server lives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policies.base import Policy
from robots.policy_client import PolicyClient, PolicyServerError, healthz
from robots.policy_server import PolicyServer
from robots.wire import WireError, packb, unpackb


def _request(rng: np.random.Generator, state_dim: int = 8) -> dict:
    return {
        "state": rng.normal(size=state_dim).astype(np.float32),
        "images": {k: rng.integers(0, 255, (224, 224, 3), dtype=np.uint8) for k in ("base", "wrist")},
        "prompt": "pick up the cube",
    }


def _expected(policy: Policy, req: dict) -> np.ndarray:
    obs = {"state": torch.from_numpy(req["state"])[None], "images": {}, "instruction": [req["prompt"]]}
    return policy.act(obs)[0].numpy()


@pytest.fixture
def server(tiny_policy_dir):
    policy = Policy.from_pretrained(tiny_policy_dir)
    with PolicyServer(policy, host="127.0.0.1", port=0) as srv:
        yield srv


def test_wire_roundtrip_and_refusals():
    data = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "s": np.float64(2.5), "t": "x", "n": [1, 2]}
    out = unpackb(packb(data))
    np.testing.assert_array_equal(out["a"], data["a"])
    assert out["a"].dtype == np.float32 and out["s"] == 2.5 and out["t"] == "x" and out["n"] == [1, 2]
    with pytest.raises(WireError, match="dtype"):
        packb({"o": np.array([object()], dtype=object)})
    with pytest.raises(WireError, match="not valid msgpack"):
        unpackb(b"\xc1\xff garbage")


def test_wire_is_byte_compatible_with_openpi_client():
    openpi_msgpack = pytest.importorskip("openpi_client.msgpack_numpy")
    data = {"state": np.linspace(0, 1, 5, dtype=np.float32), "img": np.zeros((2, 2, 3), np.uint8), "k": np.int64(3)}
    ours, theirs = packb(data), openpi_msgpack.packb(data)
    assert ours == theirs
    back = openpi_msgpack.unpackb(ours)
    np.testing.assert_array_equal(back["state"], data["state"])


def test_openpi_client_gets_correct_actions(server, tiny_policy_dir):
    wcp = pytest.importorskip("openpi_client.websocket_client_policy")
    policy = Policy.from_pretrained(tiny_policy_dir).eval()
    client = wcp.WebsocketClientPolicy(host="127.0.0.1", port=server.port)
    meta = client.get_server_metadata()
    assert meta["chunk_size"] == 4 and meta["action_dim"] == 7 and meta["image_keys"] == ["base", "wrist"]
    rng = np.random.default_rng(0)
    for _ in range(3):
        req = _request(rng)
        reply = client.infer(req)
        assert reply["actions"].shape == (4, 7) and reply["actions"].dtype == np.float32
        np.testing.assert_allclose(reply["actions"], _expected(policy, req), atol=1e-6)
        assert reply["server_timing"]["infer_ms"] > 0
    assert np.abs(reply["actions"]).max() > 0.05  # the tiny policy's actions are not all zero


def test_malformed_messages_get_error_and_server_survives(server):
    rng = np.random.default_rng(1)
    with PolicyClient("127.0.0.1", server.port) as client:
        bad = [
            {"images": {}, "prompt": "x"},  # no state
            {**_request(rng), "state": np.zeros(5, np.float32)},  # wrong state size
            {**_request(rng), "images": {"base": np.zeros((224, 224, 3), np.uint8)}},  # missing camera
            {**_request(rng), "state": np.full(8, np.nan, np.float32)},
        ]
        messages = ["no 'state'", r"shape \[8\]", "needs image 'wrist'", "NaN"]
        for req, msg in zip(bad, messages, strict=True):
            with pytest.raises(PolicyServerError, match=msg):
                client.infer(req)
        client._ws.send(b"\xc1 not msgpack")
        assert "not valid msgpack" in client._ws.recv()
        client._ws.send("text frame")
        assert "binary" in client._ws.recv()
        good = client.infer(_request(rng))  # same connection still serves
        assert good["actions"].shape == (4, 7)
        assert len(client.latencies_ms) == 5 and all(t > 0 for t in client.latencies_ms)
    assert server.errors_sent == 6 and server.requests_served == 1
    with PolicyClient("127.0.0.1", server.port) as again:  # and new clients are welcome
        assert again.infer(_request(rng))["actions"].shape == (4, 7)


def test_healthz_and_batched_requests(server):
    assert healthz("127.0.0.1", server.port)
    rng = np.random.default_rng(2)
    with PolicyClient("127.0.0.1", server.port) as client:
        req = _request(rng)
        batch = {"state": np.stack([req["state"]] * 3),
                 "images": {k: np.stack([v] * 3) for k, v in req["images"].items()}, "prompt": req["prompt"]}
        out = client.infer(batch)["actions"]
        assert out.shape == (3, 4, 7)
        np.testing.assert_allclose(out[0], out[2])


class _SlowPolicy(torch.nn.Module):
    """Wraps a policy whose act() blocks until ``release`` is set: a stand-in for a big model's inference time,
    with events instead of clocks (``busy`` says the model is computing)."""

    def __init__(self, inner: Policy):
        import threading

        super().__init__()
        self.inner = inner
        self.spec, self.chunk_size, self.name = inner.spec, inner.chunk_size, "slow"
        self.busy, self.release = threading.Event(), threading.Event()

    def act(self, obs):
        self.busy.set()
        assert self.release.wait(60), "the test never released the model"
        return self.inner.act(obs)


def test_inference_does_not_block_the_event_loop(tiny_policy_dir):
    import threading

    slow = _SlowPolicy(Policy.from_pretrained(tiny_policy_dir))
    with PolicyServer(slow, port=0) as srv:
        rng = np.random.default_rng(4)
        client = PolicyClient("127.0.0.1", srv.port)
        result = {}
        th = threading.Thread(target=lambda: result.update(client.infer(_request(rng))))
        th.start()
        assert slow.busy.wait(30)  # the model is now computing, and stays so until released
        assert healthz("127.0.0.1", srv.port)
        with PolicyClient("127.0.0.1", srv.port) as other:  # a new client still connects and gets metadata
            assert other.metadata["policy"] == "slow"
        assert not result and th.is_alive()  # all of that happened while inference was still running
        slow.release.set()
        th.join()
        assert result["actions"].shape == (4, 7)
        client.close()


def test_serve_cli_rejects_bad_arguments(capsys):
    from robots.serve import main

    assert main([]) == 2 and "checkpoint=<policy dir>" in capsys.readouterr().err
    assert main(["checkpoint=/nonexistent/dir"]) == 2 and "does not exist" in capsys.readouterr().err
