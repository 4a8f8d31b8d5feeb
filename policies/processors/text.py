"""Steps on the instruction: the prompt a network is trained on, built from the env's task strings.

``Prompt("In: What action should the robot take to {instruction}?\\nOut:")`` writes ``batch["prompt"]``
(one string per row; an observation with fewer instructions than rows repeats them, and one with none uses
``default``). Tokenizing the prompt stays with the network's tokenizer, which the checkpoint saves beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from policies.processors.base import Batch, ProcessorStep, register_step


def batch_size(batch: Batch) -> int:
    """Rows of a batch: its state's, else its first image's, else its instructions' count."""
    if "state" in batch:
        return int(torch.as_tensor(batch["state"]).shape[0])
    images = batch.get("images") or {}
    if images:
        return int(torch.as_tensor(next(iter(images.values()))).shape[0])
    return len(batch.get("instruction", []))


@register_step("prompt")
@dataclass(eq=False)
class Prompt(ProcessorStep):
    """``batch["instruction"]: list[str]`` -> ``batch["prompt"]: list[str]`` of length B via ``template``
    (``{instruction}`` is replaced; ``lower`` lower-cases it first, as OpenVLA's LIBERO prompts do)."""

    template: str = "{instruction}"
    default: str = ""
    lower: bool = False
    newline: bool = False  # end each prompt with a newline (SmolVLA)

    def forward(self, batch: Batch) -> Batch:
        rows = batch_size(batch)
        given = list(batch.get("instruction", []) or [])
        texts = [given[i % len(given)] if given else self.default for i in range(rows)]
        out = []
        for t in texts:
            p = self.template.replace("{instruction}", t.lower() if self.lower else t)
            out.append(p if not self.newline or p.endswith("\n") else p + "\n")
        return {**batch, "prompt": out}
