"""Loading an optimizer's saved state into one built from the current config.

``torch.optim.Optimizer.load_state_dict`` restores each group's hyperparameters with the moments, so a run resumed
with new learning rates (``vlarl-train resume=<run> algorithm.lr=...``) silently trained at the saved ones."""

from __future__ import annotations

from typing import Any

import torch

#: the group entries the current config decides (``lr_scale``: the value head's ratio to the policy lr under annealing)
CONFIG_KEYS = ("lr", "lr_scale")


def load_keeping_config(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """``optimizer.load_state_dict(saved)`` with the moments and step counts from ``saved`` and each group's
    ``CONFIG_KEYS`` as the optimizer was built (from this run's config)."""
    built = [{k: g[k] for k in CONFIG_KEYS if k in g} for g in optimizer.param_groups]
    optimizer.load_state_dict(saved)
    for group, keep in zip(optimizer.param_groups, built, strict=True):
        group.update(keep)
