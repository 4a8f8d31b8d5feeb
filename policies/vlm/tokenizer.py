"""Text tokenizers for tiny VLMs and the uniform-bin action tokenizer (OpenVLA-style).

Real checkpoints bring their own tokenizer (loaded from a local directory). Tiny models built from a
config get a byte-level BPE tokenizer with no merges: every string tokenizes, the vocabulary is
small (256 bytes + specials) and it is a real ``PreTrainedTokenizerFast`` saved with the policy.

Action tokens live on *reserved vocabulary ids* that are looked up through the tokenizer, never
hard-coded: either added tokens named ``<action_{i}>`` (``strategy="added"``) or the last ``n_bins``
ids of the vocabulary in bin order (``strategy="tail"``), or OpenVLA's exact convention
(``strategy="openvla"``): 255 bins whose ids count *down* from the end of the base vocabulary (bin i
on ``vocab_size - 1 - i``), so an OpenVLA checkpoint's action tokens decode to the actions it was trained on.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

ACTION_TOKEN = "<action_{}>"
STRATEGIES = ("added", "tail", "openvla")
OPENVLA_BINS = 255  # OpenVLA digitizes [-1, 1] with 256 edges: 255 bins


def build_byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with no merges and <pad>/<bos>/<eos> specials (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>"})
    return fast


def add_action_tokens(tokenizer: PreTrainedTokenizerBase, n_bins: int, strategy: str) -> None:
    """Reserve ``n_bins`` vocabulary entries for action bins (adds tokens for ``strategy='added'``)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"policy.action_token_strategy='{strategy}' is unknown; choose one of {STRATEGIES}")
    if strategy == "added":
        names = [ACTION_TOKEN.format(i) for i in range(n_bins)]
        missing = [n for n in names if n not in tokenizer.get_vocab()]
        if missing:
            tokenizer.add_tokens(missing, special_tokens=True)


class ActionTokenizer:
    """Uniform bins over normalized actions in [-1, 1] <-> reserved vocabulary ids.

    ``token_ids``: LongTensor [n_bins], the vocabulary id of bin ``i`` (found through the tokenizer).
    ``encode(actions [..., A]) -> bins [..., A]``; ``decode(bins) -> bin centers`` in [-1, 1].
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, n_bins: int = 256, strategy: str = "added"):
        if n_bins < 2:
            raise ValueError(f"policy.n_action_bins must be >= 2, got {n_bins}")
        add_action_tokens(tokenizer, n_bins, strategy)
        if strategy == "added":
            ids = tokenizer.convert_tokens_to_ids([ACTION_TOKEN.format(i) for i in range(n_bins)])
        elif strategy == "openvla":
            if n_bins != OPENVLA_BINS:
                raise ValueError(f"action_token_strategy=openvla uses {OPENVLA_BINS} bins; set "
                                 f"policy.n_action_bins={OPENVLA_BINS} (got {n_bins})")
            vocab = tokenizer.vocab_size  # the base vocabulary, as OpenVLA counts it (added tokens excluded)
            if vocab <= n_bins:
                raise ValueError(f"tokenizer has {vocab} tokens, too few to reserve n_action_bins={n_bins}")
            ids = [vocab - 1 - i for i in range(n_bins)]
        else:
            vocab = len(tokenizer)
            if vocab <= n_bins:
                raise ValueError(f"tokenizer has {vocab} tokens, too few to reserve n_action_bins={n_bins}")
            ids = list(range(vocab - n_bins, vocab))
        self.n_bins = n_bins
        self.strategy = strategy
        self.token_ids = torch.tensor(ids, dtype=torch.long)
        edges = torch.linspace(-1.0, 1.0, n_bins + 1)
        self.centers = (edges[:-1] + edges[1:]) / 2

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """Normalized actions [..., A] in [-1, 1] -> bin indices [..., A] (long)."""
        x = actions.clamp(-1.0, 1.0)
        return ((x + 1.0) / 2.0 * self.n_bins).long().clamp(0, self.n_bins - 1)

    def decode(self, bins: torch.Tensor) -> torch.Tensor:
        """Bin indices [..., A] -> bin centers [..., A] in [-1, 1]."""
        return self.centers.to(bins.device)[bins]
