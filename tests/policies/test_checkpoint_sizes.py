"""Flow checkpoints' sizes: read from the safetensors header, checked on the meta device before allocation.

A published-size pi0 is written as a real safetensors file whose data region is a sparse hole
(``scripts/bench_checkpoint_refusal.py``: ~8 GB apparent, ~128 kB on disk), so these tests cost seconds.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from policies.base import CheckpointError
from policies.flow_vla import PI0PolicyConfig, SmolVLAPolicyConfig
from policies.flow_vla.pi0_checkpoint import load_pi0
from policies.flow_vla.smolvla_checkpoint import load_smolvla
from scripts.bench_checkpoint_refusal import WRONG, write_published_checkpoint
from tests.helpers.recipes import PPO
from vlarl.config import load_train_config

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "reference"
PI0 = FIXTURES / "pi0" / "checkpoint"


def _copy(tmp_path: Path, src: Path = PI0) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("io.*"))
    return dst


def _refusal(path: Path, **kw) -> str:
    with pytest.raises(CheckpointError) as e:
        load_pi0(path, **kw)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_published_size_with_one_wrong_shape_is_refused_in_one_line_under_1gb():
    """The benchmark in its own process: the refusal names the tensor, and the process never held 1 GB."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_checkpoint_refusal.py"), "--json"],
                          capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin",
                                                                          "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["refused"] and r["one_line"] and r["names_the_tensor"], r
    assert f"{WRONG} (2048, 8192) vs (2048, 16384)" in r["message"]
    assert r["weights_apparent_gb"] > 7 and r["weights_on_disk_kb"] < 10_000  # published size, sparse on disk
    assert r["peak_rss_mb"] < 1024, r


def test_published_size_passes_the_size_check_without_a_side_file(tmp_path):
    """Shapes of the published variants need no tiny_dims.json: the size and key checks pass, and the next
    thing the loader needs (the tokenizer folder) is what it asks for - before any weight is allocated."""
    write_published_checkpoint(tmp_path / "pi0", "pi0", wrong=None)
    msg = _refusal(tmp_path / "pi0")
    assert "tokenizer 'paligemma_tokenizer' is not a local folder" in msg and "policy.vlm_path=" in msg


def test_config_that_disagrees_with_published_shapes_is_named_before_allocation(tmp_path):
    path = tmp_path / "pi0"
    write_published_checkpoint(path, "pi0", wrong=None)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "max_action_dim": 24}))  # the config disagrees with shapes
    msg = _refusal(path)
    assert "differ in shape" in msg and "action_in_proj.weight" in msg


def test_tiny_sizes_need_only_what_shapes_cannot_say(tmp_path):
    """Without tiny_dims.json the loader names the file and the two keys; with just those two, it builds the
    same network as with the full side file (widths, depths, MLP sizes, vocab and SigLIP read from shapes)."""
    path = _copy(tmp_path)
    full = json.loads((path / "tiny_dims.json").read_text())
    (path / "tiny_dims.json").unlink()
    msg = _refusal(path)
    assert "write tiny_dims.json beside the weights" in msg
    assert '"vlm": {"head_dim"}' in msg and '"vision": {"num_attention_heads"}' in msg
    (path / "tiny_dims.json").write_text(json.dumps({"vlm": {"head_dim": 8}, "vision": {"num_attention_heads": 2}}))
    ckpt, ref = load_pi0(path), load_pi0(PI0)
    assert ckpt.config.dims == full == ref.config.dims
    assert ckpt.report.missing == [] and ckpt.report.unused == []
    ours, theirs = ckpt.model.state_dict(), ref.model.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_dims_argument_and_side_file_disagreeing_with_shapes(tmp_path):
    path = _copy(tmp_path)
    msg = _refusal(path, dims={"vlm": {"head_dim": 8}, "vision": {"num_attention_heads": 2}, "vocab_size": 300})
    assert "3 tensors differ in shape" in msg and "(264, 32) vs (300, 32)" in msg  # embeddings and LM heads
    (path / "tiny_dims.json").write_text(json.dumps({"vlm": {"head_dim": 7}, "vision": {"num_attention_heads": 2}}))
    assert "not multiples of head_dim=7" in _refusal(path)
    (path / "tiny_dims.json").write_text("[1, 2]")
    assert "must hold a JSON object" in _refusal(path)


def test_a_file_that_is_not_safetensors_is_one_line(tmp_path):
    path = _copy(tmp_path)
    (path / "model.safetensors").write_bytes(b"\xff" * 64)
    assert "is not a safetensors file" in _refusal(path)


def test_smolvla_shapes_are_checked_before_allocation(tmp_path):
    """SmolVLA: the SmolVLM config in vlm_path sets the sizes; one that disagrees with the weights is named."""
    path = _copy(tmp_path, FIXTURES / "smolvla" / "checkpoint")
    vlm = path / "vlm" / "config.json"
    cfg = json.loads(vlm.read_text())
    cfg["text_config"]["intermediate_size"] = cfg["text_config"].get("intermediate_size", 64) * 2
    vlm.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="differ in shape from the SmolVLM config") as e:
        load_smolvla(path)
    assert "mlp" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("policy", ["pi0", "smolvla"])
def test_the_folder_error_names_a_key_the_command_line_accepts(tmp_path, policy):
    """The one name is ``vlm_path``: the error's ``policy.<key>=`` parses on the command line."""
    src = PI0 if policy == "pi0" else FIXTURES / "smolvla" / "checkpoint"
    path = _copy(tmp_path, src)
    shutil.rmtree(path / ("tokenizer" if policy == "pi0" else "vlm"))
    with pytest.raises(CheckpointError) as e:
        (load_pi0 if policy == "pi0" else load_smolvla)(path)
    keys = re.findall(r"policy\.(\w+)=", str(e.value))
    assert keys == ["vlm_path"]
    assert "vlm_path=" in str(e.value).replace("policy.vlm_path=", "")  # the Python API's name too
    cls = PI0PolicyConfig if policy == "pi0" else SmolVLAPolicyConfig
    assert keys[0] in cls.__dataclass_fields__
    cfg = load_train_config([PPO, f"policy={policy}", f"policy.{keys[0]}={src}"])
    assert cfg.policy.vlm_path == str(src)


def test_tokenizer_path_is_a_deprecated_alias(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = load_pi0(PI0, tokenizer_path=PI0 / "tokenizer")
    assert any(issubclass(w.category, DeprecationWarning) and "vlm_path" in str(w.message) for w in caught)
    assert ckpt.tokenizer is not None
