"""FAST action tokenization (Pertsch et al., 2025) and pi0-FAST's mapping of its ids onto PaliGemma's vocabulary.

FAST compresses a normalized chunk ``[T, A]``: a type-II orthonormal DCT along time, coefficients scaled by
``scale`` and rounded, shifted by ``-min_token`` and written (time-major) as one character per coefficient;
a byte-level BPE trained on such strings turns it into ids ``0 .. vocab_size - 1``. Decoding reverses it:
BPE ids -> characters -> ``ord + min_token`` -> ``/ scale`` -> inverse DCT.

pi0-FAST writes FAST id ``f`` as the PaliGemma id ``V - 1 - skip - f`` (``V`` the text tokenizer's vocabulary
size, ``skip`` = 128 special ids at the end left alone). Its answer reads ``"Action: " <FAST ids> "|"``;
``detokenize`` follows LeRobot 0.4.4's ``detokenize_actions``: cut at the first ``"|"``, drop every
``"Action: "`` id run, map back, decode with "relaxed" length (the coefficients are cut or zero-padded to
``T * A``); a sequence that cannot be decoded (an id below the FAST range, e.g. a special id) gives zeros.

The tokenizer folder is the one the hub repository ``physical-intelligence/fast`` lays out (and the FAST
processor's ``save_pretrained`` writes): ``processor_config.json`` (``scale``, ``min_token``, ``vocab_size``)
and ``tokenizer.json`` (the BPE). Its remote code is not needed: the transform is written here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer


def dct_matrix(n: int) -> np.ndarray:
    """The orthonormal DCT-II matrix ``[n, n]`` (float64): ``coeff = M @ x``, ``x = M.T @ coeff``."""
    k, t = np.arange(n)[:, None], np.arange(n)[None, :]
    m = np.cos(math.pi * (2 * t + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    m[0] /= math.sqrt(2.0)
    return m


@dataclass
class FastActionTokenizer:
    """FAST's DCT + BPE: ``encode(chunk [T, A]) -> ids``, ``decode(ids, T, A) -> chunk [T, A]`` (float64)."""

    bpe: Tokenizer
    scale: float
    min_token: int
    vocab_size: int

    @classmethod
    def from_folder(cls, folder: str | Path) -> FastActionTokenizer:
        folder = Path(folder)
        cfg_file, bpe_file = folder / "processor_config.json", folder / "tokenizer.json"
        if not cfg_file.is_file() or not bpe_file.is_file():
            raise FileNotFoundError(f"FAST tokenizer {folder}: needs processor_config.json and tokenizer.json "
                                    "(the layout of physical-intelligence/fast); point at a local copy")
        cfg = json.loads(cfg_file.read_text())
        return cls(Tokenizer.from_file(str(bpe_file)), float(cfg.get("scale", 10)), int(cfg.get("min_token", 0)),
                   int(cfg.get("vocab_size", 1024)))

    def save(self, folder: str | Path) -> Path:
        """Write ``processor_config.json`` + ``tokenizer.json`` (what ``from_folder`` reads)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.bpe.save(str(folder / "tokenizer.json"))
        cfg = {"scale": self.scale, "min_token": self.min_token, "vocab_size": self.vocab_size}
        (folder / "processor_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        return folder

    def encode(self, chunk: np.ndarray) -> list[int]:
        """``chunk [T, A]`` (normalized) -> FAST ids (variable length)."""
        chunk = np.asarray(chunk, dtype=np.float64)
        coeff = np.around(dct_matrix(chunk.shape[0]) @ chunk * self.scale)
        text = "".join(map(chr, np.maximum(coeff.flatten() - self.min_token, 0).astype(int)))
        return self.bpe.encode(text).ids

    def decode(self, ids: list[int], horizon: int, action_dim: int) -> np.ndarray:
        """FAST ids -> ``[horizon, action_dim]``; coefficients cut / zero-padded to fit, zeros if undecodable."""
        try:
            coeff = np.array([ord(c) for c in self.bpe.decode(list(ids))], dtype=np.int64) + self.min_token
            need = horizon * action_dim
            coeff = coeff[:need] if coeff.shape[0] >= need else np.pad(coeff, (0, need - coeff.shape[0]))
            coeff = coeff.reshape(horizon, action_dim)
        except (OverflowError, ValueError, TypeError):  # e.g. a negative id (a special id mapped back)
            coeff = np.zeros((horizon, action_dim))
        return dct_matrix(horizon).T @ (coeff / self.scale)


@dataclass
class Pi0FastVocabulary:
    """Where FAST ids sit in the text vocabulary and the answer's marker ids (from the text tokenizer)."""

    text_vocab_size: int  # the text tokenizer's vocab_size (PaliGemma: 257152)
    skip: int  # ids left alone at the end of the vocabulary (128)
    prefix_ids: list[int]  # "Action: " without special tokens
    end_id: int  # "|"
    bos_id: int

    @classmethod
    def from_tokenizer(cls, tokenizer, skip: int = 128) -> Pi0FastVocabulary:
        return cls(int(tokenizer.vocab_size), skip, list(tokenizer.encode("Action: ", add_special_tokens=False)),
                   int(tokenizer.convert_tokens_to_ids("|")), int(tokenizer.bos_token_id))

    def to_text_ids(self, fast_ids: torch.Tensor | list[int]) -> torch.Tensor:
        """FAST ids -> PaliGemma ids (the map is its own inverse)."""
        return self.text_vocab_size - 1 - self.skip - torch.as_tensor(fast_ids, dtype=torch.long)

    def fast_range(self, fast_vocab: int) -> tuple[int, int]:
        """The PaliGemma ids ``[lo, hi]`` (inclusive) that FAST ids ``0 .. fast_vocab - 1`` land on."""
        hi = self.text_vocab_size - 1 - self.skip
        return hi - fast_vocab + 1, hi

    def answer_fast_ids(self, generated: list[int]) -> list[int]:
        """LeRobot's cleaning of a generated answer: cut at the first "|", drop every "Action: " run, map back."""
        seq = list(generated)
        if self.end_id in seq:
            seq = seq[: seq.index(self.end_id)]
        n, i = len(self.prefix_ids), 0
        while n and i <= len(seq) - n:
            if seq[i : i + n] == self.prefix_ids:
                seq = seq[:i] + seq[i + n :]
            else:
                i += 1
        return self.to_text_ids(seq).tolist()


def detokenize(generated: torch.Tensor, vocab: Pi0FastVocabulary, fast: FastActionTokenizer, horizon: int,
               action_dim: int) -> torch.Tensor:
    """Generated PaliGemma ids ``[B, L]`` -> normalized actions ``[B, horizon, action_dim]`` (float32)."""
    chunks = [fast.decode(vocab.answer_fast_ids(row.tolist()), horizon, action_dim) for row in generated.cpu()]
    return torch.tensor(np.stack(chunks), dtype=torch.float32, device=generated.device)


def tokenize_answer(chunks: torch.Tensor, vocab: Pi0FastVocabulary, fast: FastActionTokenizer, max_tokens: int,
                    end_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalized chunks ``[B, T, A]`` -> the training answer ``<bos> "Action: " <FAST> end_ids`` as PaliGemma ids,
    right-padded with 0 / truncated to ``max_tokens``: (ids ``[B, max_tokens]``, mask ``[B, max_tokens]`` bool).

    ``end_ids`` is the text tokenizer's ``encode("|")`` with its special tokens (PaliGemma, loaded as LeRobot loads
    it: ``"|" <eos>``), as LeRobot's ``ActionTokenizerProcessorStep`` writes it.
    """
    rows, masks = [], []
    for chunk in chunks.detach().cpu().numpy():
        seq = [vocab.bos_id, *vocab.prefix_ids, *vocab.to_text_ids(fast.encode(chunk)).tolist(), *end_ids]
        seq = seq[:max_tokens]
        masks.append([True] * len(seq) + [False] * (max_tokens - len(seq)))
        rows.append(seq + [0] * (max_tokens - len(seq)))
    return torch.tensor(rows, device=chunks.device), torch.tensor(masks, device=chunks.device)
