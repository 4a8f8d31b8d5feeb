"""SFT a tiny exact VLA on the language task and measure whether it follows the words.

    python scripts/make_language_fixture.py --family smolvla --out tests/fixtures/language/smolvla
    (defaults: 100 demonstrations, --sft-epochs 120, --batch-size 32, --sft-lr 1e-3, 100 held-out episodes)

1. record the scripted expert on ``PushCubeToColor-v1`` (``simulators/language_tasks.py``; seeds 0..; each
   episode's instruction names the red or the blue goal),
2. SFT the tiny ``--family`` VLA (state + instruction; ``policy.freeze_vlm=false`` so the words reach the
   expert through a trained VLM) and save it with its env (``vlarl.data.sft.sft_and_save``),
3. ``vlarl-eval`` it on held-out seeds (1,000,000+) twice: with the instruction that names the goal that counts,
   and with ``+env.task_kwargs.instruction=other`` (the words name the other goal),
4. write ``result.json``: both success rates and their difference (the issue asks >= 50 points after RL).

The saved policy is small (well under 1 MB at the tiny size) and serves as the default tier's fixture for
``tests/policies/test_language_following.py``. Extra ``key=value`` arguments after ``--`` go to the policy build.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from vlarl.experiments import (
    Stages,
    add_held_out_arguments,
    add_sft_arguments,
    check_held_out_seed,
    prepare,
    split_overrides,
    training_policy,
)

STAGES = Stages("language_fixture")
log = STAGES.log


def main(argv: list[str] | None = None) -> int:
    own, overrides = split_overrides(argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="smolvla", help="a VLA family that reads instructions (smolvla, pi0, pi05)")
    ap.add_argument("--out", default="tests/fixtures/language/smolvla")
    ap.add_argument("--work", default="outputs/language_fixture", help="demonstrations and evaluations")
    ap.add_argument("--demos", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    add_sft_arguments(ap, epochs=120)
    add_held_out_arguments(ap, episodes=100)
    args = ap.parse_args(own)
    check_held_out_seed(ap, args.eval_seed)
    work = prepare(args.work)
    out = Path(args.out).resolve()
    t0 = time.time()

    from tqdm import tqdm

    from vlarl.data.demonstrations import read_maniskill_h5
    from vlarl.data.expert_demos import record_demos
    from vlarl.data.sft import sft_and_save

    demos = work / f"pushcube_color_{args.demos}.h5"
    if not demos.is_file():
        record_demos(demos, args.demos, seed=args.seed, task="pushcube_color", log=log)
    cfg, spec, policy = training_policy(
        [f"policy={args.family}", "env=maniskill_pushcube_color",
         "policy.freeze_vlm=false", "+policy.arch.tokenizer_max_length=48", *overrides], args.seed)
    episodes = read_maniskill_h5(demos, args.demos, successful_only=True)
    bar = tqdm(total=args.sft_epochs, desc="sft", unit="epoch")

    def progress(epoch: int, loss: float) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}")

    if out.exists():
        shutil.rmtree(out)
    sft = sft_and_save(policy, episodes, cfg.env, out, args.sft_epochs, args.batch_size, args.sft_lr, spec.instruction,
                       args.seed, progress)
    bar.close()
    log(f"SFT: {sft['episodes']} demos ({sft['demo_steps']} steps) x {args.sft_epochs} epochs, loss "
        f"{sft['loss_first']:.4f} -> {sft['loss_last']:.4f}, {sft['wall_s']:.0f}s -> {out}")
    named = STAGES.evaluate(out, work / "eval_named", args.eval_episodes, args.eval_seed, args.eval_envs,
                            "evaluate (named goal)")
    other = STAGES.evaluate(out, work / "eval_other", args.eval_episodes, args.eval_seed, args.eval_envs,
                            "evaluate (other goal's words)", extra=("+env.task_kwargs.instruction=other",))
    result = {"family": args.family, "sft": sft, "named": named, "other": other,
              "difference": named["success_once"] - other["success_once"], "wall_s": time.time() - t0,
              "command": "python scripts/make_language_fixture.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    (work / "result.json").write_text(json.dumps(result, indent=2))
    log(f"success with the named goal's words {named['success_once']:.2f}, with the other goal's words "
        f"{other['success_once']:.2f} ({args.eval_episodes} held-out episodes from seed {args.eval_seed}) -> "
        f"{work / 'result.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
