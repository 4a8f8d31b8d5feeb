"""One tiny exact VLA (SmolVLA by default) over three ManiSkill tasks from pixels and words: demonstrations, SFT,
evaluation per task, and (with --rl-env-steps) RL from the SFT policy, evaluated per task again.

    python scripts/multitask_sft_rl.py --out outputs/multitask [--experiment multitask_smolvla_sft_rl] [--demos 20]
        [--task-demos TASK=N ...] [--paired-words] [--demos-only] [--sft-epochs 40] [--sft-from DIR] [--rl-env-steps 0]
        [-- key=value ...]   (overrides of the experiment, for SFT's policy and vlarl-train)

``--experiment multitask_oft_rlpd``: the exact OpenVLA-OFT, whose RL stage is RLPD; the script then gives RLPD its
own demonstrations (``algorithm.demos=<out>/demos/trajectories.h5``) and builds the SFT policy without them.

1. demonstrations of every task of ``env=maniskill_multitask_rgb`` with frames, robot state and instructions
   (``vlarl.multitask_demos``: the planner's re-timed episodes for PushCube / PullCube, cached under
   outputs/demos; the scripted expert for PushCubeToColor) -> ``<out>/demos/trajectories.h5``; with
   ``--paired-words`` each language-task seed twice, towards the goal it draws and towards the other one (the
   same frames, the other words: N demonstrations there are N seeds, 2N episodes); ``--demos-only`` stops here
   (the towers of ``scripts/pretrain_vision.py`` read them first; a later run with the same ``--out`` reuses them),
2. SFT of the policy ``vlarl-train experiment=<--experiment>`` builds (``vlarl.data.sft.sft_and_save``),
   each row with its step's frame and its episode's instruction -> ``<out>/sft``,
3. ``vlarl-eval`` of it on held-out seeds (1,000,000+), each task on its own (eval.json's ``tasks``); with
   ``--swap-frames`` a second time on another scene's frames (does it read its camera?), with ``--other-words``
   the language task once more under the words that name its other goal (does it read its instruction?),
4. with ``--rl-env-steps N``: ``vlarl-train experiment=<--experiment> init_from=<out>/sft`` for N env
   steps, and ``vlarl-eval`` of its last checkpoint the same way,
5. ``<out>/result.json``: per task success (95% CI), the SFT record, wall times, the commands.
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
    command,
    per_task,
    prepare,
    split_overrides,
    training_policy,
)

EXPERIMENT = "multitask_smolvla_sft_rl"
LANGUAGE_TASK = "PushCubeToColor-v1"  # simulators.language_tasks.TASK_ID (not imported here: it needs ManiSkill)
STAGES = Stages("multitask")
log = STAGES.log


def stage_overrides(experiment: str, overrides: list[str], demos: Path) -> tuple[list[str], list[str]]:
    """(the SFT stage's overrides, the RL stage's). An off-policy experiment (RLPD) reads demonstrations: the ones
    this script writes, unless the overrides name others. The SFT stage does not run the algorithm, so its policy is
    built without them (the file does not exist yet when the config is checked)."""
    from vlarl.config.loader import compose_train_config

    if "demos" not in compose_train_config([f"experiment={experiment}", *overrides]).algorithm or any(
            o.startswith("algorithm.demos=") for o in overrides):
        return list(overrides), list(overrides)
    return [*overrides, "algorithm.demos=''", "algorithm.demo_ratio=0"], [*overrides, f"algorithm.demos={demos}"]


def other_words_overrides() -> tuple[str, ...]:
    """``vlarl-eval`` arguments for the language task alone, each episode reporting the words of its other goal."""
    return (f"env.tasks=[{LANGUAGE_TASK}]", f"+env.task_kwargs.{LANGUAGE_TASK}.instruction=other")


def main(argv: list[str] | None = None) -> int:
    own, overrides = split_overrides(argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="outputs/multitask")
    ap.add_argument("--demos", type=int, default=20, help="demonstrations per task")
    ap.add_argument("--task-demos", action="append", default=[], metavar="TASK=N",
                    help="a task's own demonstration count (repeatable), e.g. PushCubeToColor-v1=150")
    ap.add_argument("--paired-words", action="store_true", help=f"record each {LANGUAGE_TASK} seed twice, towards "
                    "the goal it draws and towards the other one: pairs of demonstrations with the same frames and "
                    "other words (its count is then seeds, each giving two episodes)")
    ap.add_argument("--experiment", default=EXPERIMENT, help="the experiment config that builds the policy and "
                    "its env (e.g. multitask_oft_rlpd for the exact OpenVLA-OFT)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sft-from", default="", help="a saved policy directory to go on training (its normalization "
                    "kept) instead of a fresh policy; the policy overrides after -- are then not used for it")
    ap.add_argument("--rl-env-steps", type=int, default=0, help="RL env steps after SFT (the experiment's "
                    "algorithm: PPO by default); 0 = no RL stage")
    ap.add_argument("--swap-frames", action="store_true", help="evaluate each policy a second time on another "
                    "scene's frames (vlarl-eval swap_frames=true): the success left is what it gets without its eyes")
    ap.add_argument("--other-words", action="store_true", help=f"evaluate each policy on {LANGUAGE_TASK} once more "
                    "with the words naming the other goal (success still counts at the drawn one): the gap to its "
                    "own words is what the instruction is worth to it")
    ap.add_argument("--demos-only", action="store_true", help="record the demonstrations into <out>/demos and stop "
                    "(no SFT, no evaluation): what scripts/pretrain_vision.py reads before the SFT run")
    add_sft_arguments(ap, epochs=40)
    add_held_out_arguments(ap, episodes=50)
    args = ap.parse_args(own)
    check_held_out_seed(ap, args.eval_seed)
    if args.swap_frames:
        from vlarl.evaluation.ablation import check_swap_plan

        try:
            check_swap_plan(args.eval_episodes, args.eval_envs)
        except ValueError as e:
            ap.error(f"--swap-frames (--eval-episodes / --eval-envs): {e}")
    if args.demos_only and (args.rl_env_steps or args.swap_frames or args.other_words or args.sft_from):
        ap.error("--demos-only records the demonstrations and stops: leave out --rl-env-steps, --swap-frames, "
                 "--other-words and --sft-from, or drop --demos-only")
    if args.demos < 1 or args.sft_epochs < 1 or args.rl_env_steps < 0:
        ap.error("--demos and --sft-epochs must be >= 1, --rl-env-steps >= 0")
    task_demos = {}
    for item in args.task_demos:
        task, _, n = item.partition("=")
        if not n.isdigit():
            ap.error(f"--task-demos {item}: write TASK=N with N a whole number, e.g. PushCubeToColor-v1=150")
        task_demos[task] = int(n)
    out = prepare(args.out, create=False)  # made once the config and the counts are checked
    t0 = time.time()

    from tqdm import tqdm

    from simulators.base import EnvError
    from vlarl.config.loader import ConfigError
    from vlarl.data.demonstrations import read_maniskill_h5
    from vlarl.data.sft import sft_and_save
    from vlarl.multitask_demos import TRAJECTORY_FILE, build_multitask_demos, episodes_per_task

    demos = out / "demos" / TRAJECTORY_FILE
    try:
        build, rl_overrides = stage_overrides(args.experiment, overrides, demos)
        cfg, spec, policy = training_policy([f"experiment={args.experiment}", *build], args.seed,
                                            build=not args.sft_from)
    except ConfigError as e:
        ap.error(str(e).strip().splitlines()[0])
    if args.sft_from and Path(args.sft_from).resolve() == out / "sft":
        ap.error(f"--sft-from {args.sft_from} is the folder this run writes its SFT policy to; use another --out")
    if args.sft_from:
        from policies.base import CheckpointError, Policy
        from vlarl.checkpoint_files import check_checkpoint

        try:
            check_checkpoint(args.sft_from)
            policy = Policy.from_pretrained(args.sft_from)
        except CheckpointError as e:
            ap.error(str(e).strip().splitlines()[0])
        if list(policy.spec.image_keys) != list(spec.image_keys):
            ap.error(f"--sft-from {args.sft_from} reads cameras {list(policy.spec.image_keys)}, the env renders "
                     f"{list(spec.image_keys)}; pass a policy trained on this env")
    try:
        episodes_per_task(list(cfg.env.tasks), args.demos, task_demos)
    except EnvError as e:
        ap.error(str(e))
    tasks = list(cfg.env.tasks)  # episodes_per_task above read them already
    if args.other_words and LANGUAGE_TASK not in tasks:
        ap.error(f"--other-words: env.tasks={tasks} does not run {LANGUAGE_TASK}, the task whose words name the "
                 f"goal; add it to env.tasks or leave --other-words out")
    if args.paired_words:
        from vlarl.multitask_demos import paired_tasks

        try:
            paired_tasks(cfg.env)
        except EnvError as e:
            ap.error(f"--paired-words: {e}")
    out.mkdir(parents=True, exist_ok=True)
    if not demos.is_file():
        made = build_multitask_demos(cfg.env, out / "demos", args.demos, seed=args.seed, log=log,
                                     task_episodes=task_demos, paired_words=args.paired_words)
        (out / "demos" / "summary.json").write_text(json.dumps(made, indent=2))
    if args.demos_only:
        log(f"demonstrations: {demos} (--demos-only: no SFT)")
        return 0
    episodes = read_maniskill_h5(demos, cameras=list(spec.image_keys))
    bar = tqdm(total=args.sft_epochs, desc="sft", unit="epoch")

    def progress(epoch: int, loss: float) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}")

    sft_dir = out / "sft"
    if sft_dir.exists():
        shutil.rmtree(sft_dir)
    sft = sft_and_save(policy, episodes, cfg.env, sft_dir, args.sft_epochs, args.batch_size, args.sft_lr,
                       spec.instruction, args.seed, progress, fit_normalization=not args.sft_from)
    sft["from"] = args.sft_from or None
    bar.close()
    log(f"SFT: {sft['episodes']} demos ({sft['demo_steps']} steps) x {args.sft_epochs} epochs, loss "
        f"{sft['loss_first']:.4f} -> {sft['loss_last']:.4f}, {sft['wall_s']:.0f}s -> {sft_dir}")
    def evaluate(checkpoint: Path, name: str, stage: str) -> None:
        STAGES.evaluate(checkpoint, out / name, args.eval_episodes, args.eval_seed, args.eval_envs, stage)
        result[name] = per_task(out / name)
        if args.swap_frames:
            STAGES.evaluate(checkpoint, out / f"{name}_swapped", args.eval_episodes, args.eval_seed, args.eval_envs,
                            f"{stage} on another scene's frames", extra=("swap_frames=true",))
            result[f"{name}_swapped"] = per_task(out / f"{name}_swapped")
        if args.other_words:
            STAGES.evaluate(checkpoint, out / f"{name}_other_words", args.eval_episodes, args.eval_seed,
                            args.eval_envs, f"{stage} on {LANGUAGE_TASK} with the other goal's words",
                            extra=other_words_overrides())
            result[f"{name}_other_words"] = per_task(out / f"{name}_other_words")

    result: dict = {"sft": sft}
    evaluate(sft_dir, "eval_sft", "evaluate SFT")
    if args.rl_env_steps:
        run = out / "rl"
        STAGES.run([command("vlarl-train"), f"experiment={args.experiment}", f"init_from={sft_dir}", f"run_dir={run}",
                    f"total_env_steps={args.rl_env_steps}", f"seed={args.seed}", "eval.episodes=10", *rl_overrides],
                   "RL")
        evaluate(run / "checkpoints" / "latest", "eval_rl", "evaluate SFT + RL")
    result.update(wall_s=time.time() - t0, command="python scripts/multitask_sft_rl.py " + " ".join(sys.argv[1:] if argv is None else argv))
    (out / "result.json").write_text(json.dumps(result, indent=2))
    for stage in ("eval_sft", "eval_sft_swapped", "eval_sft_other_words", "eval_rl", "eval_rl_swapped",
                  "eval_rl_other_words"):
        if stage in result:
            log(f"{stage}: " + ", ".join(f"{t} {r['success_once']:.2f}" for t, r in result[stage]["tasks"].items())
                + f" ({args.eval_episodes} held-out episodes per task from seed {args.eval_seed})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
