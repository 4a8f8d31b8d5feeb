"""``vlarl-export formats=[lerobot]`` for ``policy=diffusion_policy``: the writer ``vlarl.export`` calls.

``write`` is ``DiffusionPolicyRL.save_lerobot`` (``checkpoint.save_lerobot``: config, weights under LeRobot's
names, processors and statistics); ``reload`` builds the same family from the written directory
(``pretrained_path``), which the exporter checks against the eager policy before publishing it. The layout holds
every transform of this family exactly (LeRobot's own normalizer formulas, no clipping), so ``exact`` is true.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any


def write(policy: Any, out: str | Path, vlm_path: str | Path | None = None) -> dict[str, Any]:
    """Write ``policy`` as a LeRobot ``diffusion`` directory ``out``; ``vlm_path`` is unused (no VLM)."""
    d = policy.save_lerobot(out)
    return {"files": sorted(p.name for p in Path(d).iterdir()), "exact": True}


def reload(policy: Any, out: str | Path) -> Any:
    """The written directory loaded back as ``policy``'s class, with its state split and schedule."""
    cfg = dataclasses.replace(policy.config, pretrained_path=str(out), chunk_size=0)
    return type(policy)(cfg, policy.spec)
