"""pi0-FAST against LeRobot 0.4.4 itself (fixture: scripts/reference_fixtures/pi0fast.py).

The fixture holds a tiny random-weight PI0FastPolicy saved by LeRobot (its layout, processors, MEAN_STD
statistics), a tiny FAST tokenizer trained offline by the FAST processor's own ``fit``, fixed observations,
LeRobot's greedy action tokens and decoded actions, and a training batch (FAST tokens made by LeRobot's
``ActionTokenizerProcessorStep``, its cross-entropy loss, the chunk ``detokenize_actions`` recovers).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from policies.ar_vla.pi0fast import FastInputs, make_inputs, tokenize
from policies.ar_vla.pi0fast_checkpoint import load_pi0fast
from policies.ar_vla.pi0fast_tokenizer import FastActionTokenizer, detokenize, tokenize_answer
from policies.base import CheckpointError

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "pi0fast" / "checkpoint"
TOL = 1e-4


@pytest.fixture(scope="module")
def io() -> dict[str, torch.Tensor]:
    torch.set_num_threads(1)
    return load_file(str(FIXTURE / "io.safetensors"))


@pytest.fixture(scope="module")
def ckpt():
    return load_pi0fast(FIXTURE)


def model_inputs(io: dict[str, torch.Tensor]) -> FastInputs:
    cams = sorted(k for k in io if k.startswith("model.image."))
    return FastInputs([io[k] for k in cams], [io[k.replace("image.", "image_mask.")] for k in cams],
                      io["model.tokens"], io["model.token_mask"])


def test_loads_whole(ckpt):
    assert ckpt.report.missing == [] and ckpt.report.unused == []
    assert ckpt.image_keys[-1].endswith("empty_camera_0") and (ckpt.state_dim, ckpt.action_dim) == (6, 3)
    assert ckpt.fast.vocab_size == 128 and ckpt.fast.min_token == json.loads((FIXTURE / "io.json").read_text())[
        "fast"]["min_token"]


def test_observation_to_model_inputs(ckpt, io):
    """Raw images / state / tasks -> the model inputs LeRobot's pre-processing made (prompt with binned state)."""
    tasks = json.loads((FIXTURE / "io.json").read_text())["tasks"]
    state = ckpt.state_norm.normalize(io["raw.observation.state"])
    ids, mask = tokenize(ckpt.config, ckpt.tokenizer, tasks, state)
    assert torch.equal(ids, io["model.tokens"]) and torch.equal(mask, io["model.token_mask"])
    images = [io[f"raw.{k}"] for k in ckpt.image_keys if ".empty_camera_" not in k]
    inputs = make_inputs(ckpt.config, images, ids, mask, empty=ckpt.config.empty_cameras)
    ref = model_inputs(io)
    for ours, theirs, m_ours, m_theirs in zip(inputs.images, ref.images, inputs.image_masks, ref.image_masks,
                                              strict=True):
        assert (ours - theirs).abs().max() < 1e-6 and torch.equal(m_ours, m_theirs)


def test_greedy_tokens_and_actions(ckpt, io):
    inputs = model_inputs(io)
    tokens = ckpt.model.generate(inputs, ckpt.vocab.bos_id, ckpt.config.max_decoding_steps)
    assert torch.equal(tokens, io["greedy_tokens"])
    lo, hi = ckpt.vocab.fast_range(ckpt.fast.vocab_size)
    assert ((tokens >= lo) & (tokens <= hi)).all()  # the fixture's tokens exercise FAST decoding, not text ids
    normalized = detokenize(tokens, ckpt.vocab, ckpt.fast, ckpt.config.n_action_steps, ckpt.action_dim)
    assert (normalized - io["normalized_actions"]).abs().max() < TOL and normalized.abs().max() > 0.1
    actions = ckpt.action_norm.unnormalize(normalized)
    assert (actions - io["actions"]).abs().max() < TOL


def test_training_tokens_loss_and_recovery(ckpt, io):
    """FAST tokens of a chunk (LeRobot's processor step), the training cross-entropy, and decoding them back."""
    end_ids = ckpt.tokenizer.encode("|")
    ids, mask = tokenize_answer(io["train.chunk"], ckpt.vocab, ckpt.fast, ckpt.config.max_action_tokens, end_ids)
    assert torch.equal(ids, io["train.action_tokens"]) and torch.equal(mask, io["train.action_token_mask"])
    with torch.no_grad():
        loss = ckpt.model.answer_loss(model_inputs(io), ids, mask)
    assert abs(loss.item() - io["train.loss"].item()) < TOL
    recovered = detokenize(ids[:, 1:], ckpt.vocab, ckpt.fast, ckpt.config.n_action_steps, ckpt.action_dim)
    assert (recovered - io["train.recovered"]).abs().max() < TOL
    assert (recovered - io["train.chunk"]).abs().max() < 0.1  # FAST at scale 10 is lossy by ~1/20 per coefficient


def test_rescoring_matches_decoding(ckpt, io):
    """The teacher-forced inference layout gives the logits ``generate`` decoded from: greedy tokens are its
    argmax, and a sampled answer re-scores to finite log-probs of the tokens drawn."""
    inputs = model_inputs(io)
    greedy = io["greedy_tokens"]
    with torch.no_grad():
        logits, _ = ckpt.model.sample_logits(inputs, ckpt.vocab.bos_id, greedy)
    assert torch.equal(logits.argmax(-1), greedy)
    g = torch.Generator().manual_seed(3)
    drawn = ckpt.model.generate(inputs, ckpt.vocab.bos_id, 6, temperature=1.0, generator=g)
    with torch.no_grad():
        logp = torch.log_softmax(ckpt.model.sample_logits(inputs, ckpt.vocab.bos_id, drawn)[0], -1)
    picked = logp.gather(-1, drawn[..., None])[..., 0]
    assert picked.shape == (2, 6) and torch.isfinite(picked).all() and (picked < 0).all()


def test_fast_codec_round_trip():
    fast = FastActionTokenizer.from_folder(FIXTURE / "action_tokenizer")
    t = torch.linspace(0, 1, 8)[:, None]
    chunk = (0.4 * torch.sin(6 * t + torch.tensor([0.0, 1.0, 2.0]))).numpy()
    ids = fast.encode(chunk)
    assert 0 < len(ids) < 24 and max(ids) < fast.vocab_size
    assert abs(fast.decode(ids, 8, 3) - chunk).max() < 0.1
    assert (fast.decode([-1], 8, 3) == 0).all()  # undecodable (a special id mapped back): zeros, as LeRobot


def test_wrong_shape_and_missing_files_fail_in_one_line(tmp_path):
    bad = tmp_path / "ckpt"
    shutil.copytree(FIXTURE, bad)
    weights = load_file(str(bad / "model.safetensors"))
    key = "model.paligemma_with_expert.paligemma.lm_head.weight"
    weights[key] = weights[key][:-1]
    save_file(weights, str(bad / "model.safetensors"))
    with pytest.raises(CheckpointError, match="differ in shape.*lm_head"):
        load_pi0fast(bad)
    shutil.rmtree(bad / "action_tokenizer")
    with pytest.raises(CheckpointError, match="fast_path="):
        load_pi0fast(bad)
