"""A tiny pi0-FAST built from config alone (CPU tests, ``policy=pi0fast`` without a checkpoint): Gemma and SigLIP
at toy widths, an offline byte-level text tokenizer padded to ``TEXT_VOCAB`` ids (so FAST's ids, placed below the
last 128, never meet a text id), and a FAST tokenizer fitted here on seeded smooth chunks.

``fit_fast`` is FAST's recipe written for this project: orthonormal DCT along time, ``round(coeff * scale)``,
shifted to start at 0 and written as characters, then a BPE (the ``tokenizers`` library's trainer) over those
strings whose initial alphabet is the whole coefficient range. The published FAST tokenizer (a byte-level BPE
of 2048 ids) loads with a checkpoint; this one only has to be a valid instance of the same transform.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from policies.ar_vla.pi0fast_tokenizer import FastActionTokenizer, dct_matrix

TEXT_VOCAB = 520
FAST_VOCAB = 128
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]


def tiny_dims() -> dict[str, Any]:
    """Toy sizes: Gemma width 64, 2 layers, 8 heads of 8; SigLIP width 32 on 32 px, patch 8 (16 image tokens)."""
    return {"vlm": {"width": 64, "depth": 2, "mlp_dim": 128, "num_heads": 8, "num_kv_heads": 1, "head_dim": 8},
            "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "patch_size": 8, "image_size": 32},
            "vocab_size": TEXT_VOCAB}


def text_tokenizer(vocab_size: int = TEXT_VOCAB) -> PreTrainedTokenizerFast:
    """Bytes as tokens (no merges), ``<bos>`` prepended, placeholder entries up to ``vocab_size``."""
    symbols = SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet())
    symbols += [f"<unused{i}>" for i in range(vocab_size - len(symbols))]
    tok = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(symbols)}, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   unk_token="<unk>")


def smooth_chunks(n: int, horizon: int, action_dim: int, seed: int = 0) -> list[np.ndarray]:
    """Seeded sinusoids ``[horizon, action_dim]`` in [-1, 1]: stand-ins for normalized action chunks."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, horizon)[:, None]
    return [np.clip(rng.normal(size=(1, action_dim)) * 0.5 + rng.uniform(0.1, 0.6, (1, action_dim))
                    * np.sin(2 * np.pi * rng.uniform(0.3, 1.5, (1, action_dim)) * t
                             + rng.uniform(0, 6.3, (1, action_dim))), -1.0, 1.0) for _ in range(n)]


def fit_fast(chunks: list[np.ndarray], scale: float = 10.0, vocab_size: int = FAST_VOCAB) -> FastActionTokenizer:
    """A FAST tokenizer fitted on ``chunks`` (each ``[T, A]``); raises if the coefficient range exceeds the vocab."""
    m = dct_matrix(chunks[0].shape[0])
    coeffs = [np.around(m @ c * scale).flatten().astype(int) for c in chunks]
    lo, hi = min(int(c.min()) for c in coeffs), max(int(c.max()) for c in coeffs)
    if hi - lo >= vocab_size:
        raise ValueError(f"fit_fast: {hi - lo + 1} coefficient values do not fit a vocabulary of {vocab_size}; "
                         f"raise vocab_size or lower scale")
    bpe = Tokenizer(models.BPE())
    bpe.decoder = decoders.Fuse()  # one character per coefficient: decode concatenates the merged pieces
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[], show_progress=False,
                                  initial_alphabet=[chr(i) for i in range(hi - lo + 1)])
    bpe.train_from_iterator(("".join(map(chr, c - lo)) for c in coeffs), trainer=trainer)
    return FastActionTokenizer(bpe, scale, lo, vocab_size)
