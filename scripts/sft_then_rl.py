"""SFT-then-RL on ManiSkill PushCube-v1 in one command (issue 4), on a CPU machine:

    python scripts/sft_then_rl.py --family flow_vla --out outputs/sft_rl_flow
    python scripts/sft_then_rl.py --family ar_vla --out outputs/sft_rl_ar

1. record scripted expert demonstrations (success-filtered, seeds 0..; ManiSkill trajectory HDF5),
2. SFT a tiny VLA of ``--family`` on them (``vlarl.data.sft``) and ``save_pretrained`` it,
3. ``vlarl-eval`` it on held-out seeds (1,000,000+),
4. ``vlarl-train experiment=pushcube_<family>_sft_rl init_from=<sft dir>`` (chunked PPO),
5. ``vlarl-eval`` the fine-tuned checkpoint on the same held-out seeds,
6. print SFT vs SFT+RL success (95% CIs), env steps and wall time, and write ``result.json``.

The policy, env and PPO settings live in ``configs/experiment/pushcube_<family>_sft_rl.yaml`` (``flow_vla``: the
tiny exact SmolVLA, ``policy=smolvla``; ``-- policy=pi05 '~policy.arch.num_vlm_layers'`` swaps in
the tiny exact pi0.5, ``-- policy=flow_vla`` the look-alike); the SFT
budget (demos, epochs) is chosen here so the SFT policy is mediocre and RL has room to improve.
Extra ``key=value`` arguments after ``--`` go to ``vlarl-train`` (and to the policy built for SFT).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from vlarl import experiments
from vlarl.experiments import Stages, command, prepare, read_metrics, split_overrides, training_policy

EXPERIMENTS = {"flow_vla": "pushcube_flow_sft_rl", "ar_vla": "pushcube_ar_sft_rl", "openvla_oft": "pushcube_oft_sft_rl",
               "diffusion_policy": "pushcube_diffusion_policy_sft_rl"}
STAGES = Stages("sft_then_rl")
log = STAGES.log


def sft(args, overrides: list[str], demos: Path, out: Path) -> dict:
    """Build the policy exactly as ``vlarl-train`` will, fine-tune it on the demonstrations, save it."""
    from tqdm import tqdm

    from vlarl.data.demonstrations import read_maniskill_h5
    from vlarl.data.sft import sft_and_save

    cfg, spec, policy = training_policy([f"experiment={EXPERIMENTS[args.family]}", *overrides], args.seed)
    episodes = read_maniskill_h5(demos, args.demos, successful_only=True)
    bar = tqdm(total=args.sft_epochs, desc="sft", unit="epoch")

    def progress(epoch: int, loss: float) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}")

    res = sft_and_save(policy, episodes, cfg.env, out, args.sft_epochs, args.batch_size, args.sft_lr,
                       spec.instruction, args.seed, progress)
    bar.close()
    log(f"SFT: {res['episodes']} demos ({res['demo_steps']} steps) x {args.sft_epochs} epochs, loss "
        f"{res['loss_first']:.4f} -> {res['loss_last']:.4f}, {res['wall_s']:.0f}s -> {out}")
    return res


def evaluate(checkpoint: Path, out: Path, args, stage: str) -> dict:
    return STAGES.evaluate(checkpoint, out, args.eval_episodes, args.eval_seed, args.eval_envs, stage)


def table(res: dict) -> str:
    rows = [("SFT", res["sft_eval"], res["sft"]["demo_steps"] * res["sft"]["epochs"], res["sft"]["wall_s"]),
            ("SFT + RL (PPO)", res["rl_eval"], res["rl"]["env_steps"], res["rl"]["wall_s"])]
    out = ["| stage | success_once [95% CI] | success_at_end | env steps | wall s |", "|---|---|---|---|---|"]
    for name, ev, steps, wall in rows:
        lo, hi = ev["success_once_ci95"]
        out.append(f"| {name} | {ev['success_once']:.2f} [{lo:.2f}, {hi:.2f}] | {ev['success_at_end']:.2f} | "
                   f"{steps} | {wall:.0f} |")
    d = res["rl_eval"]["success_once"] - res["sft_eval"]["success_once"]
    out.append(f"\nRL changed held-out success by {100 * d:+.0f} points ({res['sft_eval']['episodes']} episodes, "
               f"seeds {res['sft_eval']['seeds'][0]}..{res['sft_eval']['seeds'][1]}); "
               f"SFT env steps = demo steps x epochs (seen, not simulated)")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv, overrides = split_overrides(argv)
    p = experiments.sft_rl_parser(__doc__, demos=20, sft_epochs=15, eval_episodes=100, rl="PPO")
    p.add_argument("--family", choices=sorted(EXPERIMENTS), default="flow_vla")
    p.add_argument("--demo-seed", type=int, default=0, help="first demonstration seed (evaluation uses 1,000,000+)")
    p.add_argument("--rl-tag", default="", help="name of this RL run (rl_<tag>/, result_<tag>.json) beside others")
    p.add_argument("--sft-only", action="store_true", help="stop after the SFT policy and its evaluation "
                   "(then run RL seeds with --reuse-sft --seed N --rl-tag seedN)")
    args = p.parse_args(argv)
    from vlarl.data.expert_demos import record_demos

    experiments.check_held_out_seed(p, args.eval_seed)
    out = prepare(args.out)
    t_all = time.time()
    res: dict = {"family": args.family, "experiment": EXPERIMENTS[args.family], "overrides": overrides,
                 "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])}
    previous = out / "result_sft.json"
    if args.reuse_sft and previous.is_file():
        res.update({k: v for k, v in json.loads(previous.read_text()).items() if k in ("demos", "sft", "sft_eval")})
        log(f"1-3/5 reusing the SFT policy and its evaluation in {out} (--reuse-sft)")
    else:
        log(f"1/5 recording {args.demos} expert demonstrations")
        demos = out / "demos" / "pushcube_expert.h5"
        res["demos"] = record_demos(demos, args.demos, args.demo_seed, log=log)
        log("2/5 supervised fine-tuning")
        res["sft"] = sft(args, overrides, demos, out / "sft")
        log("3/5 evaluating the SFT policy on held-out seeds")
        res["sft_eval"] = evaluate(out / "sft", out / "eval_sft", args, "vlarl-eval (SFT)")
        previous.write_text(json.dumps({k: res[k] for k in ("demos", "sft", "sft_eval")}, indent=2))
    log(f"    SFT success_once = {res['sft_eval']['success_once']:.2f}")
    if args.sft_only:
        return 0
    log("4/5 PPO fine-tuning from the SFT policy")
    run_dir = out / (f"rl_{args.rl_tag}" if args.rl_tag else "rl")
    train = [command("vlarl-train"), f"experiment={EXPERIMENTS[args.family]}", f"init_from={out / 'sft'}",
             f"run_dir={run_dir}", f"seed={args.seed}", "eval.episodes=8", "eval.video_episodes=0", *overrides]
    if args.rl_env_steps:
        train.append(f"total_env_steps={args.rl_env_steps}")
    t0 = time.time()
    STAGES.run(train, "vlarl-train (PPO)")
    metrics = read_metrics(run_dir)
    steps = int(max((r.get("env_steps", 0) for r in metrics), default=0))
    res["rl"] = {"env_steps": steps, "wall_s": time.time() - t0, "run_dir": str(run_dir),
                 "curve": [{"env_steps": r["env_steps"], "rollout_success_once": r.get("rollout/success_once")}
                           for r in metrics if "iteration" in r]}
    log("5/5 evaluating the SFT+RL policy on the same held-out seeds")
    res["rl_eval"] = evaluate(run_dir / "checkpoints" / "latest", run_dir / "eval_heldout", args, "vlarl-eval (SFT+RL)")
    res["improvement_points"] = 100 * (res["rl_eval"]["success_once"] - res["sft_eval"]["success_once"])
    res["wall_s"] = time.time() - t_all
    result = out / (f"result_{args.rl_tag}.json" if args.rl_tag else "result.json")
    result.write_text(json.dumps(res, indent=2))
    print(table(res))
    log(f"wrote {result} ({res['wall_s']:.0f}s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
