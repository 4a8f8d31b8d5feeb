"""pi0.5 under the planner: its state-in-prompt tokens are tensor ops, so one rollout and one update trace under
fake tensors (before, ``.numpy()`` on the fake state stopped the trace), and the traced tokens are the real ones."""

from __future__ import annotations

import torch

from vlarl.config import load_train_config


def test_pi05_traces_rollout_and_update():
    from vlarl.config.construct import probe_spec
    from vlarl.planning.trace import trace_policy

    cfg = load_train_config(["~experiment", "env=libero_spatial", "policy=pi05", "env.num_envs=2",
                             "env.num_workers=1"])
    tr = trace_policy(cfg.policy, probe_spec(cfg.env), 2, 4)
    assert tr.rollout.peak > 0 and tr.update.peak > tr.update.parameters > 0
    assert tr.update.optimizer > 0 and tr.update.activations > 0  # components at the peak: Adam state exists


def test_state_prompt_tokens_equal_the_tokenizers_text_path():
    """The tensor assembly equals tokenizing the prompt text, for random states and both kinds of truncation."""
    from policies.flow_vla.pi0 import PI0Config, pi05_prompt, state_prompt_tokens, tokenize
    from policies.vlm.tokenizer import build_byte_tokenizer

    tok = build_byte_tokenizer()
    gen = torch.Generator().manual_seed(0)
    state = torch.rand(3, 8, generator=gen) * 2.4 - 1.2  # outside [-1, 1] too: the end bins
    tasks = ["pick up the black bowl", "open_the drawer\n", "x"]
    for length in (200, 60):  # 60 truncates the prompt
        cfg = PI0Config(type="pi05", tokenizer_max_length=length)
        assert state_prompt_tokens(tok, length).exact
        ids, mask = tokenize(cfg, tok, tasks, state)
        padded = torch.nn.functional.pad(state, (0, cfg.max_state_dim - 8))
        texts = [pi05_prompt(t, s) for t, s in zip(tasks, padded, strict=True)]
        enc = tok(texts, padding="max_length", padding_side="right", truncation=True, max_length=length,
                  return_tensors="pt")
        assert torch.equal(ids, enc["input_ids"]) and torch.equal(mask, enc["attention_mask"].bool())
