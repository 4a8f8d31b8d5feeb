"""Pretrain a tiny VLA's vision towers on the task's scenes (``vlarl.vision_pretrain``), then save the policy for
SFT to go on training it.

    python scripts/pretrain_vision.py --experiment multitask_oft_sft_rl --demos <dir>/demos/trajectories.h5 \
        --out outputs/oft_seen [--frames 4000] [--epochs 30] [--num-envs 16] [--seed 0] [-- key=value ...]
    python scripts/multitask_sft_rl.py --experiment multitask_oft_sft_rl --sft-from outputs/oft_seen ... [-- ...]

The policy is built as ``vlarl-train experiment=<--experiment> <overrides>`` builds it, its state statistics fitted
on ``--demos`` (what SFT would fit; ``--sft-from`` keeps them), its towers trained to predict the scene state from
the frame over ``--frames`` frames of random arm motion (env seeds from ``--seed``, below the held-out ones), and
saved to ``--out`` with ``pretrain.json``: the validation R^2 before and after, per target dim, and the wall time.
With ``-- policy.freeze_vision=true`` the towers are trained here and kept as they are by SFT and RL after it.
With ``-- +policy.arch.use_film=true`` (OFT+) the towers are pretrained with their FiLM maps at zero (the identity),
which SFT then trains to let the words modulate the pretrained features. With ``--grounded`` as well, the FiLM maps
are trained here instead: the language task's frames are also labelled with where the goal their words name is, and
the towers learn to find it from the frame and the words (``vlarl.vision_pretrain``); keep what they learned through
SFT and RL with ``policy.freeze_film=true policy.freeze_embeddings=true``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from tqdm import tqdm


def main(argv: list[str] | None = None) -> int:
    from vlarl.config.loader import ConfigError
    from vlarl.experiments import split_overrides, training_policy

    own, overrides = split_overrides(argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiment", default="multitask_oft_sft_rl")
    ap.add_argument("--demos", required=True, help="the demonstrations SFT will read (their state statistics)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--frames", type=int, default=4000)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--num-envs", type=int, default=16)
    ap.add_argument("--scene-steps", type=int, default=20, help="env steps per scene while collecting (shorter: "
                    "more scenes, so more cube and goal positions, per frame)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--grounded", action="store_true", help="OFT+ only: also teach the FiLM towers where the goal "
                    "the words name is (frames of a language task, e.g. PushCubeToColor-v1)")
    args = ap.parse_args(own)
    if not Path(args.demos).is_file():
        ap.error(f"--demos {args.demos} is not a file; record them with scripts/multitask_sft_rl.py --demos-only --out <dir>")
    if args.frames < 2 or args.epochs < 1:
        ap.error("--frames must be >= 2 and --epochs >= 1")
    try:
        cfg, spec, policy = training_policy([f"experiment={args.experiment}", *overrides, "env.critic_state=true"],
                                            args.seed)
    except ConfigError as e:
        ap.error(str(e).strip().splitlines()[0])
    from simulators.registry import make_env
    from vlarl.data.demonstrations import read_maniskill_h5
    from vlarl.data.sft import fit_state_normalization, save_policy_dir
    from vlarl.vision_pretrain import check_supported, collect_frames, pretrain_towers

    try:
        check_supported(policy)
    except ValueError as e:
        ap.error(str(e))
    if args.grounded and not policy.model.vision_backbone.film:
        ap.error("--grounded teaches the FiLM maps to read the words: add -- +policy.arch.use_film=true (OFT+)")
    camera = list(spec.image_keys)[0]
    fit_state_normalization(policy, read_maniskill_h5(args.demos, cameras=list(spec.image_keys)))
    env = make_env(dataclasses.replace(cfg.env, critic_state=True, max_episode_steps=args.scene_steps),
                   num_envs=args.num_envs)
    bar = tqdm(total=args.frames, desc="frames", unit="frame")
    try:
        data = collect_frames(env, camera, args.frames, policy.chunk_size, args.seed,
                              log=lambda n: bar.update(min(n, args.frames) - bar.n))
    finally:
        env.close()
        bar.close()
    ebar = tqdm(total=args.epochs, desc="pretrain", unit="epoch")

    def progress(epoch: int, loss: float, val: float) -> None:
        ebar.update(1)
        ebar.set_postfix(loss=f"{loss:.4f}", val_r2=f"{val:.3f}")

    try:
        record = pretrain_towers(policy, data, args.epochs, lr=args.lr, seed=args.seed, grounded=args.grounded,
                                 log=progress)
    except ValueError as e:
        ap.error(str(e))
    finally:
        ebar.close()
    out = save_policy_dir(policy, cfg.env, args.out)
    record.update(camera=camera, experiment=args.experiment, overrides=overrides, demos=args.demos, seed=args.seed)
    (out / "pretrain.json").write_text(json.dumps(record, indent=2))
    print(f"[pretrain_vision] {record['frames']} frames ({record['episodes']} scenes), {record['targets']} scene-state "
          f"dims: validation R^2 {record['val_r2_before']:.3f} -> {record['val_r2_after']:.3f} in "
          f"{record['wall_s']:.0f} s; saved {out}")
    if args.grounded:
        print(f"[pretrain_vision] where the words point ({record['grounding_frames']} frames): validation R^2 "
              f"{record['grounding_r2_before']:.3f} -> {record['grounding_r2_after']:.3f}, with the other words "
              f"{record['grounding_r2_other_words']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
