"""The weight group's backend choice: NCCL only with one rank per GPU, Gloo when two ranks share a GPU.

Two ranks run in two threads of this process over a real TCPStore and a real process group. On the CPU the
device identity is faked (both ranks "hold" the same GPU) to drive the shared-GPU path; the ``gpu``-marked
test puts both ranks on cuda:0 for real."""

from __future__ import annotations

import socket
import threading

import pytest
import torch

from vlarl.scheduler import collective


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _two_ranks(device: torch.device, tensors: dict[str, torch.Tensor]) -> tuple[list[str], dict, int]:
    """Rank 0 sends ``tensors`` at version 7, rank 1 receives into zeros: (both backends, received, version)."""
    addr = ("127.0.0.1", _free_port())
    into = {k: torch.zeros_like(v) for k, v in tensors.items()}
    out: dict[str, object] = {}

    def rank(r: int) -> None:
        try:
            g = collective.join(addr, r, 2, device)
            out[f"backend{r}"] = g.backend
            if r == 0:
                collective.send(g, tensors, version=7)
            else:
                out["version"] = collective.receive(g, into)
        except Exception as e:  # surfaced by the assertion below
            out[f"error{r}"] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(k.startswith("error") for k in out), out
    return [out["backend0"], out["backend1"]], into, out["version"]


def test_pick_backend_needs_one_gpu_per_rank():
    assert collective.pick_backend(["gpu-a", "gpu-b", "gpu-c"]) == "nccl"
    assert collective.pick_backend(["gpu-a", "gpu-a"]) == "gloo"  # actor and rollout collocated on one GPU
    assert collective.pick_backend(["gpu-a", "gpu-b", "gpu-a"]) == "gloo"
    assert collective.pick_backend(["cpu", "gpu-b"]) == "gloo"
    assert collective.device_identity(torch.device("cpu")) == "cpu"


def test_two_ranks_on_one_gpu_agree_on_gloo_and_sync(monkeypatch):
    """Both ranks report the same GPU (faked: the logic under test is the exchange through the store and the
    common choice, not CUDA): both pick Gloo, and the broadcast arrives bit-identical."""
    monkeypatch.setattr(collective, "device_identity", lambda device: "gpu-GPU-0000-fake")
    g = torch.Generator().manual_seed(0)
    sent = {"w": torch.randn(5, 3, generator=g), "b": torch.randn(3, generator=g).half(),
            "n": torch.tensor([4], dtype=torch.int64)}
    backends, got, version = _two_ranks(torch.device("cpu"), sent)
    assert backends == ["gloo", "gloo"] and version == 7
    for k in sent:
        torch.testing.assert_close(got[k], sent[k], rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_two_ranks_on_one_real_gpu_use_gloo_with_cuda_tensors():
    dev = torch.device("cuda", 0)
    sent = {"w": torch.randn(64, 32, device=dev), "b": torch.randn(32, device=dev, dtype=torch.bfloat16)}
    backends, got, version = _two_ranks(dev, sent)
    assert backends == ["gloo", "gloo"] and version == 7
    for k in sent:
        assert got[k].device == dev
        torch.testing.assert_close(got[k], sent[k], rtol=0, atol=0)
