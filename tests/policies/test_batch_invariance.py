"""A row's output does not depend on what it is batched with: every VLA family that reads words scores a chunk
alone as it scores it in a batch whose other rows carry longer or shorter instructions (so its prompt is padded
there, or pads the others).

Why: a multi-task rollout batches every task's words, while an evaluation runs one task at a time. When padding
moved the rotary positions of OpenVLA-OFT's prompt, the same network acted one way in training (mixed batches)
and another in evaluation (session 33): the sampled SFT start solved PullCube in 0.75 of training episodes and in
0.27 of held-out ones, and PPO improved the behaviour the evaluation never saw."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from vla_helpers import make_obs, openvla_config

from policies import make_policy
from policies.ar_vla import ARVLAConfig
from policies.flow_vla import FlowVLAConfig
from policies.vlm import BackboneConfig
from tests.helpers.recipes import PPO
from vlarl.config import load_train_config

torch.set_num_threads(1)

#: words of clearly different token counts, so a batch of them pads
WORDS = ["push it", "push the cube to the blue goal and stop there", "pull the cube back to the goal region now"]


def _yaml(name: str, **kw):
    return replace(load_train_config([PPO, f"policy={name}"]).policy, **kw)


FAMILIES = {
    "openvla": lambda: openvla_config("openvla", chunk_size=2),
    "openvla_oft_tokens": lambda: openvla_config("openvla_oft", action_head="tokens", chunk_size=2),
    "openvla_oft_l1": lambda: openvla_config("openvla_oft", action_head="l1", chunk_size=2),
    "smolvla": lambda: _yaml("smolvla"),
    "pi0": lambda: _yaml("pi0"),
    "pi05": lambda: _yaml("pi05"),
    "pi0fast": lambda: _yaml("pi0fast"),
    "flow_vla": lambda: FlowVLAConfig(backbone=BackboneConfig(kind="siglip_qwen2"), chunk_size=2),
    "ar_vla": lambda: ARVLAConfig(n_action_bins=32, chunk_size=2, backbone=BackboneConfig(kind="siglip_llama")),
}


def _row(x, i: int):
    """Row ``i`` of an observation or replay (nested dicts, tensors, lists) as a batch of one."""
    if isinstance(x, dict):
        return {k: _row(v, i) for k, v in x.items()}
    return x[i : i + 1]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_rows_log_prob_and_action_do_not_depend_on_its_batch(family, vla_spec):
    torch.manual_seed(0)
    policy = make_policy(FAMILIES[family](), vla_spec)
    policy.eval()
    obs = {**make_obs(3), "instruction": list(WORDS)}
    sample = policy.sample(obs)
    with torch.no_grad():
        batch_lp, _, batch_v = policy.evaluate(obs, sample.replay)
        batch_act = policy.act(obs)
        for i in range(3):
            lp, _, v = policy.evaluate(_row(obs, i), _row(sample.replay, i))
            torch.testing.assert_close(lp, batch_lp[i : i + 1], atol=2e-4, rtol=1e-4,
                                       msg=lambda m, i=i: f"row {i} ({WORDS[i]!r}) log-prob: {m}")
            torch.testing.assert_close(v.reshape(-1), batch_v.reshape(-1)[i : i + 1], atol=2e-4, rtol=1e-4)
            if family not in ("smolvla", "pi0", "pi05", "flow_vla"):  # their act draws fresh noise per call
                torch.testing.assert_close(policy.act(_row(obs, i)), batch_act[i : i + 1], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("architecture", ["openvla", "openvla_oft"])
def test_openvla_hidden_states_of_a_padded_prompt_are_its_unpadded_ones(architecture, vla_spec):
    """The networks themselves (a token head's log-probs over 256 random-weight bins move too little to show it): the
    last layer's hidden states of a short prompt padded to a long one's length equal those it has alone."""
    torch.manual_seed(0)
    policy = make_policy(openvla_config(architecture, chunk_size=2), vla_spec)
    policy.eval()
    obs = {**make_obs(2), "instruction": [WORDS[0], WORDS[1]]}
    ids, mask, pv, proprio = policy._inputs(obs)
    assert int(mask[0].sum()) < mask.shape[1]  # the short prompt is padded in the batch
    alone_ids, alone_mask, _, _ = policy._inputs(_row(obs, 0))
    with torch.no_grad():
        if architecture == "openvla_oft":
            batch = policy.model.parallel_hidden(ids, pv, proprio, mask)[0][:1]
            alone = policy.model.parallel_hidden(alone_ids, pv[:1], proprio[:1], alone_mask)[0]
        else:
            batch = policy.model.hidden(ids, pv, mask)[:1, -3:]
            alone = policy.model.hidden(alone_ids, pv[:1], alone_mask)[:, -3:]
            torch.testing.assert_close(policy.model.generate(ids, pv, 3, mask)[:1],
                                       policy.model.generate(alone_ids, pv[:1], 3, alone_mask))
    torch.testing.assert_close(batch, alone, atol=1e-5, rtol=1e-4)


def test_openvla_cached_decoding_gives_the_full_pass_hidden_states_on_a_padded_batch(vla_spec):
    """``OpenVLA.decode`` (the KV-cache loop behind greedy ``generate`` and the RL policy's sampling): the hidden
    state it hands ``choose`` at each step equals a full causal pass over the padded prompt and the tokens chosen
    so far, so each new token's position continues from its own row's real tokens, not from the padded length."""
    torch.manual_seed(0)
    policy = make_policy(openvla_config("openvla", chunk_size=2), vla_spec)
    policy.eval()
    obs = {**make_obs(2), "instruction": [WORDS[0], WORDS[1]]}
    ids, mask, pv, _ = policy._inputs(obs)
    assert int(mask[0].sum()) < mask.shape[1]  # the short prompt is padded in the batch
    vocab = policy.model.language_model.config.vocab_size
    seen: list[torch.Tensor] = []
    fed: list[torch.Tensor] = []

    def choose(h: torch.Tensor) -> torch.Tensor:
        seen.append(h)
        fed.append(torch.randint(0, vocab, (h.shape[0],)))
        return fed[-1]

    with torch.no_grad():
        emb, keys = policy.model.embed(ids, pv, attention_mask=mask)
        policy.model.decode(emb, keys, 4, choose)
        full_ids = torch.cat([ids, torch.stack(fed[:-1], 1)], 1)
        full_mask = torch.cat([mask, mask.new_ones(mask.shape[0], 3)], 1)
        full = policy.model.hidden(full_ids, pv, full_mask)[:, -4:]
    assert len(seen) == 4
    torch.testing.assert_close(torch.stack(seen, 1), full, atol=1e-5, rtol=1e-4)
