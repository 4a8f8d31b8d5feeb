"""How far can noise steering (DSRL) move a frozen flow or diffusion policy? For the first observation of some
demonstrations: the base's chunk from the zero noise, the spread of its first action over noises drawn from
N(0, I) clipped to the steering box, and the gap between the zero-noise action and the demonstrated one.

    python scripts/probe_noise_authority.py --base outputs/s11/mt60/sft --demos outputs/s11/mt60/demos/trajectories.h5

A spread that is small against the gap says the steering cannot reach the expert's action from this base, whatever
the noise actor learns (docs/vla_pixels.md, "DSRL with critics on the scene state"). Prints a table per
demonstration and the mean ratio per action axis; ``--json`` writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def probe(base_dir: str, demos: str, episodes: int = 6, samples: int = 64, bound: float = 1.5,
          seed: int = 0) -> list[dict]:
    """One row per demonstration (spread evenly over the file): task, instruction, zero-noise first action,
    demonstrated first action, per-axis std over ``samples`` noises and |gap|."""
    import h5py
    import numpy as np
    import torch

    from policies.base import Policy

    torch.set_num_threads(1)
    base = Policy.from_pretrained(base_dir).eval()
    T, M = tuple(base.chunk_shape(1)[1:])
    g = torch.Generator().manual_seed(seed)
    rows = []
    with h5py.File(demos, "r") as f:
        names = sorted((k for k in f if k.startswith("traj_")), key=lambda k: int(k.split("_")[1]))
        step = max(1, len(names) // episodes)
        for name in names[::step][:episodes]:
            ep = f[name]
            missing = [c for c in base.spec.image_keys if f"images/{c}" not in ep]
            if missing:
                raise ValueError(f"{demos}: {name} has no frames of camera(s) {missing}, which the base at "
                                 f"{base_dir} reads; probe with demonstrations recorded with images")
            words = ep.attrs.get("instruction", base.spec.instruction)
            obs = {"state": torch.as_tensor(np.asarray(ep["obs"][0]), dtype=torch.float32)[None].expand(samples, -1),
                   "images": {c: torch.as_tensor(np.asarray(ep[f"images/{c}"][0]))[None].expand(samples, -1, -1, -1)
                              for c in base.spec.image_keys},
                   "instruction": [str(words)] * samples}
            with torch.no_grad():
                noise = torch.randn(samples, T, M, generator=g).clamp(-bound, bound)
                spread = base.act(obs, noise=noise)[:, 0].std(0)
                zero = base.act({**obs, "state": obs["state"][:1], "instruction": obs["instruction"][:1],
                                 "images": {c: v[:1] for c, v in obs["images"].items()}},
                                noise=torch.zeros(1, T, M))[0, 0]
            expert = torch.as_tensor(np.asarray(ep["actions"][0]), dtype=torch.float32)
            rows.append({"demo": name, "task": str(ep.attrs.get("task", "")), "instruction": str(words),
                         "zero_noise": zero.tolist(), "expert": expert.tolist(), "std": spread.tolist(),
                         "gap": (zero - expert).abs().tolist()})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="a saved flow or diffusion policy dir (save_pretrained)")
    ap.add_argument("--demos", required=True, help="a ManiSkill-layout .h5 of demonstrations (traj_<i>/obs, actions)")
    ap.add_argument("--episodes", type=int, default=6)
    ap.add_argument("--samples", type=int, default=64, help="noises per observation")
    ap.add_argument("--bound", type=float, default=1.5, help="the steering box (policy.noise_bound)")
    ap.add_argument("--json", default="", help="also write the rows here")
    args = ap.parse_args(argv)
    for flag, path in (("--base", Path(args.base) / "config.json"), ("--demos", Path(args.demos))):
        if not path.is_file():
            print(f"probe_noise_authority: {flag} {path} does not exist; pass a saved policy dir and a demonstration "
                  f".h5", file=sys.stderr)
            return 2
    if args.episodes < 1 or args.samples < 2 or args.bound <= 0:
        print("probe_noise_authority: --episodes >= 1, --samples >= 2 and --bound > 0", file=sys.stderr)
        return 2
    rows = probe(args.base, args.demos, args.episodes, args.samples, args.bound)
    fmt = lambda xs: " ".join(f"{x:+.2f}" for x in xs)  # noqa: E731
    print("| demo | task | instruction | zero-noise a0 | expert a0 | std over noise | gap |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['demo']} | {r['task']} | {r['instruction']} | {fmt(r['zero_noise'])} | {fmt(r['expert'])} | "
              f"{fmt(r['std'])} | {fmt(r['gap'])} |")
    axes = len(rows[0]["std"])
    ratio = [sum(r["std"][i] for r in rows) / max(sum(r["gap"][i] for r in rows), 1e-9) for i in range(axes)]
    print(f"mean std / mean gap per axis: {fmt(ratio)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "std_over_gap": ratio}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
