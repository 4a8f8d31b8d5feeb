"""OpenVLA-OFT (Kim, Finn & Liang, 2025) exactly: parallel decoding of a whole action chunk in one pass.

Sequence: OpenVLA's, plus a proprio token after the patches, then ``chunk x action_dim`` action positions whose
input embeddings are zero ("empty action embeddings") and the stop token </s>::

    [<s> | patches (num_images x N) | proprio | prompt[1:] ... 29871 | 0 x (T * A) | </s>]

Attention is **bidirectional over the whole sequence** (OFT's transformers fork makes Llama's SDPA attention
non-causal; only padded keys are masked, and positions count real tokens only). The hidden state of position
``i - 1`` predicts action position ``i`` (the first one is read at the prompt's last token, as in the reference's
slicing), giving ``[B, T * A, H]`` action hidden states. Two heads read them:

* ``l1``: ``L1RegressionActionHead`` - per timestep the A hidden states concatenated ([B, T, A * H]) through
  an MLP-ResNet (LayerNorm, fc, ReLU, 2 pre-LN residual blocks, LayerNorm, fc) -> [B, T, A] in [-1, 1] units;
* ``tokens``: the LM head at those positions -> logits over the vocabulary, decoded with OpenVLA's bins.

OFT+ (``use_film``): the vision towers are FiLM-conditioned on the average of the language part of the input
embeddings - every input position that is not an action position, i.e. the prompt (<s> ... 29871) and the stop
token, as OFT's ``input_embeddings[~all_actions_mask]`` selects them. The model computes it from ``input_ids``
itself; padded prompt tokens (``attention_mask`` 0) are left out of the average.

Checked against OFT's own code: ``tests/policies/test_openvla_parity.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from policies.ar_vla.openvla import (
    EMPTY_TOKEN,
    STOP_TOKEN,
    ActionStatistics,
    OpenVLA,
    OpenVLAConfig,
    bench_inputs,
    published_config,
    real_positions,
    tiny_config,
    with_empty_token,
)

__all__ = ["OpenVLAOFT", "published_config", "tiny_config", "bench_chunk", "bench_logprob"]


class MLPResNetBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.ffn = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ffn(x)


class MLPResNet(nn.Module):
    def __init__(self, num_blocks: int, input_dim: int, hidden_dim: int, output_dim: int):
        super().__init__()
        self.layer_norm1, self.fc1 = nn.LayerNorm(input_dim), nn.Linear(input_dim, hidden_dim)
        self.mlp_resnet_blocks = nn.ModuleList(MLPResNetBlock(hidden_dim) for _ in range(num_blocks))
        self.layer_norm2, self.fc2 = nn.LayerNorm(hidden_dim), nn.Linear(hidden_dim, output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(self.layer_norm1(x)))
        for block in self.mlp_resnet_blocks:
            x = block(x)
        return self.fc2(self.layer_norm2(x))


class L1RegressionActionHead(nn.Module):
    """Action hidden states [B, T * A, H] -> normalized actions [B, T, A] (keys ``model.*`` as OFT saves them)."""

    def __init__(self, llm_dim: int, action_dim: int, chunk_size: int):
        super().__init__()
        self.chunk_size = chunk_size
        self.model = MLPResNet(2, llm_dim * action_dim, llm_dim, action_dim)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model(hidden.reshape(hidden.shape[0], self.chunk_size, -1))


class ProprioProjector(nn.Module):
    """Normalized proprio [B, P] -> one LLM token [B, H]: fc1 -> GELU -> fc2."""

    def __init__(self, llm_dim: int, proprio_dim: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(proprio_dim, llm_dim), nn.Linear(llm_dim, llm_dim)

    def forward(self, proprio: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(proprio)))


def bidirectional_mask(key_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, S] bool (True = real token) -> additive [B, 1, S, S]: every query sees every real key."""
    B, S = key_mask.shape
    neg = torch.finfo(dtype).min
    row = torch.zeros(B, 1, 1, S, dtype=dtype, device=key_mask.device).masked_fill(~key_mask[:, None, None], neg)
    return row.expand(B, 1, S, S)


class OpenVLAOFT(OpenVLA):
    """OpenVLA + OFT's parallel decoding, proprio projector and (``action_head="l1"``) L1 regression head."""

    def __init__(self, config: OpenVLAConfig):
        super().__init__(config)
        H = config.llm_dim
        self.n_action_positions = config.chunk_size * config.action_dim
        self.proprio_projector = ProprioProjector(H, config.proprio_dim) if config.proprio_dim else None
        self.action_head = (L1RegressionActionHead(H, config.action_dim, config.chunk_size)
                            if config.action_head == "l1" else None)

    def vision_features(self, pixel_values: torch.Tensor, text: torch.Tensor,
                        attention_mask: torch.Tensor | None) -> torch.Tensor:
        if not self.config.use_film:
            return super().vision_features(pixel_values, text, attention_mask)
        language = self.film_language(text, attention_mask)
        return self.projector(self.vision_backbone(pixel_values.to(text.dtype), language))

    def film_language(self, text: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Prompt embeddings [B, L, H] (+ key mask [B, L]) -> FiLM's language average [B, H] over the prompt and
        the stop token (the positions OFT counts as language)."""
        B = text.shape[0]
        stop = self.language_model.get_input_embeddings()(torch.full((B, 1), STOP_TOKEN, device=text.device))
        language = torch.cat([text, stop.to(text.dtype)], 1)
        if attention_mask is None:
            return language.mean(1)
        keep = torch.cat([attention_mask.bool(), attention_mask.new_ones(B, 1).bool()], 1)[..., None]
        return (language * keep).sum(1) / keep.sum(1)

    def action_hidden(self, input_ids: torch.Tensor, pixel_values: torch.Tensor, proprio: torch.Tensor | None = None,
                      attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One bidirectional pass -> (action hidden states [B, T * A, H], prefix summary [B, H]).

        ``input_ids`` [B, L] is the prompt (29871 appended if missing); ``proprio`` [B, P] normalized. The
        prefix summary is the hidden state at the prompt's last token (where the first action is read).
        ``attention_mask`` [B, L] (1 = real) masks padded prompt tokens as keys."""
        if not bool((input_ids[:, -1] == EMPTY_TOKEN).all()):
            if attention_mask is not None:
                attention_mask = torch.cat([attention_mask, attention_mask.new_ones(attention_mask.shape[0], 1)], 1)
            input_ids = with_empty_token(input_ids)
        return self.parallel_hidden(input_ids, pixel_values, proprio, attention_mask)

    def parallel_hidden(self, input_ids: torch.Tensor, pixel_values: torch.Tensor, proprio: torch.Tensor | None,
                        attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``action_hidden`` for a prompt that already ends with 29871 (no data-dependent branch: exportable)."""
        B, L = input_ids.shape
        if (self.proprio_projector is None) != (proprio is None):
            raise ValueError("proprio must be given exactly when the checkpoint has a proprio projector "
                             f"(proprio_dim={self.config.proprio_dim})")
        extra = self.proprio_projector(proprio.to(self.proprio_projector.fc1.weight.dtype))[:, None] if proprio is not None \
            else None
        emb, keys = self.embed(input_ids, pixel_values, extra, attention_mask)
        n = self.n_action_positions
        stop = self.language_model.get_input_embeddings()(input_ids.new_full((B, 1), STOP_TOKEN))
        emb = torch.cat([emb, emb.new_zeros(B, n, emb.shape[-1]), stop], 1)
        keys = torch.ones(B, emb.shape[1], dtype=torch.bool, device=emb.device) if keys is None else \
            torch.cat([keys, keys.new_ones(B, n + 1)], 1)
        mask = bidirectional_mask(keys, emb.dtype)
        hidden = self.language_model.model(inputs_embeds=emb, attention_mask=mask,
                                           position_ids=real_positions(keys)).last_hidden_state
        start = emb.shape[1] - n - 2  # the prompt's last token
        return hidden[:, start : start + n], hidden[:, start]

    def token_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Action hidden states [B, n, H] -> logits over the whole vocabulary [B, n, V] (fp32)."""
        return self.language_model.lm_head(hidden).float()

    def predict_action(self, input_ids: torch.Tensor, pixel_values: torch.Tensor, stats: ActionStatistics,
                       proprio: torch.Tensor | None = None) -> torch.Tensor:
        """OFT's ``predict_action``: env-unit chunk [B, T, A] from the L1 head, else greedy action tokens."""
        hidden, _ = self.action_hidden(input_ids, pixel_values, proprio)
        if self.action_head is not None:
            x = self.action_head(hidden).float()
        else:
            x = self.bins.decode(self.token_logits(hidden).argmax(-1))
            x = x.view(hidden.shape[0], self.config.chunk_size, self.config.action_dim)
        return stats.unnormalize(x)


# ---- scripts/bench_vla_memory.py hooks --------------------------------------------------------------------
def bench_chunk(model: OpenVLAOFT, batch: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    """One chunk in one bidirectional pass (L1 head, or greedy tokens)."""
    ids, pv = bench_inputs(model, batch, device)
    p = torch.zeros(batch, model.config.proprio_dim, device=device) if model.proprio_projector is not None else None
    h, _ = model.action_hidden(ids, pv, p)
    return model.action_head(h) if model.action_head is not None else model.token_logits(h).argmax(-1)


def bench_logprob(model: OpenVLAOFT, batch: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    """Log-prob [B] of a stored chunk: a unit-std Gaussian around the L1 head (the continuous RL policy)."""
    ids, pv = bench_inputs(model, batch, device)
    p = torch.zeros(batch, model.config.proprio_dim, device=device) if model.proprio_projector is not None else None
    h, _ = model.action_hidden(ids, pv, p)
    if model.action_head is None:
        logp = model.token_logits(h)[..., model.bins.token_ids.to(device)].log_softmax(-1)
        return logp[..., 0].sum(-1)
    mean = model.action_head(h).float()
    return torch.distributions.Normal(mean, 1.0).log_prob(torch.zeros_like(mean)).sum((-1, -2))
