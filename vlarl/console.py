"""The prologue every console command (``vlarl-train``, ``vlarl-eval``, ``vlarl-collect``, ``vlarl-demos``) shares,
so each ``main`` starts with one call: its arguments, ``--help``, the rendering environment, torch threads."""

from __future__ import annotations

import os
import sys


def arguments(argv: list[str] | None, usage: str, torch_threads: bool = True) -> list[str] | None:
    """The command's arguments (``sys.argv[1:]`` unless ``argv`` is given), or None once ``usage`` is printed
    for ``-h``/``--help``. Before returning them it applies ``.vlarl-system/env.sh`` (child processes inherit
    it) and, with ``torch_threads``, sets torch's threads to ``$VLARL_TORCH_THREADS`` (default 1)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(usage)
        return None
    from vlarl import system_env

    system_env.apply()
    if torch_threads:
        import torch

        torch.set_num_threads(int(os.environ.get("VLARL_TORCH_THREADS", "1")))
    return args
