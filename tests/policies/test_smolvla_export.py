"""SmolVLA's deterministic chunk (prefix + 10 Euler steps) exports: torch.export and ONNX (ONNX Runtime),
one dynamic-batch program checked at batch 1 and 8 against eager within 1e-4, on the LeRobot fixture."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from policies.flow_vla.interface import FlowInputs
from policies.flow_vla.smolvla import SmolVLA
from policies.flow_vla.smolvla_checkpoint import load_smolvla

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "smolvla" / "checkpoint"
pytestmark = pytest.mark.slow


class ChunkGraph(nn.Module):
    """(cameras..., tokens, token mask, state, noise) -> chunk [B, T, A_pad]: what a deployment runs."""

    def __init__(self, model: SmolVLA):
        super().__init__()
        self.model = model

    def forward(self, top, wrist, tokens, token_mask, state, noise):
        present = torch.ones_like(token_mask[:, 0])
        return self.model.sample_actions(FlowInputs([top, wrist], [present, present], tokens, token_mask, state), noise)


def batch_of(io: dict[str, torch.Tensor], n: int) -> tuple[torch.Tensor, ...]:
    idx = torch.arange(n) % 2
    keys = ("model.image.0", "model.image.1", "model.tokens", "model.token_mask", "model.state", "noise")
    return tuple(io[k][idx] for k in keys)


@pytest.fixture(scope="module")
def graph_and_io():
    torch.set_num_threads(1)
    return ChunkGraph(load_smolvla(FIXTURE).model).eval(), load_file(str(FIXTURE / "io.safetensors"))


def _dynamic():
    b = torch.export.Dim("batch", min=1, max=64)
    return tuple({0: b} for _ in range(6))


def test_torch_export_matches_eager(graph_and_io):
    graph, io = graph_and_io
    program = torch.export.export(graph, batch_of(io, 2), dynamic_shapes=_dynamic())
    for n in (1, 8):
        args = batch_of(io, n)
        with torch.no_grad():
            assert (program.module()(*args) - graph(*args)).abs().max().item() <= 1e-4


def test_onnx_matches_eager(graph_and_io, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    graph, io = graph_and_io
    names = ["top", "wrist", "tokens", "token_mask", "state", "noise"]
    program = torch.onnx.export(graph, batch_of(io, 2), dynamo=True, input_names=names, output_names=["chunk"],
                                dynamic_shapes=_dynamic(), verbose=False)
    program.save(str(tmp_path / "smolvla.onnx"))
    session = ort.InferenceSession(str(tmp_path / "smolvla.onnx"), providers=["CPUExecutionProvider"])
    for n in (1, 8):
        args = batch_of(io, n)
        out = session.run(None, {k: v.numpy() for k, v in zip(names, args, strict=True)})[0]
        with torch.no_grad():
            assert (torch.from_numpy(out) - graph(*args)).abs().max().item() <= 1e-4
