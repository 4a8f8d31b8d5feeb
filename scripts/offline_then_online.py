"""Offline then online (CO-RFT) on ManiSkill PushCube-v1 or PickCube-v1 (``--task``), with the GR-RL demonstration
filter, in one command:

    nice -n 10 python scripts/offline_then_online.py --out outputs/offline_pushcube --demos 30
    nice -n 10 python scripts/offline_then_online.py --task pickcube --out outputs/offline_pickcube --demos 30
    nice -n 10 python scripts/offline_then_online.py --out outputs/offline_mixed --demos 15 --failures 15

1. record ``--demos`` successful scripted expert demonstrations (``scripts/pushcube_expert.py``) and, with
   ``--failures K`` (PushCube), K failed ones interleaved (a mixed-quality dataset, the file stores which is which),
   unless ``--demo-file`` exists,
2. imitation: behaviour cloning of the squashed MLP actor of ``experiment=pushcube_mlp_rlpd`` (or
   ``pickcube_mlp_rlpd``) on their chunks (IQL's actor step with ``beta = 0``), saved and evaluated held-out
   (``vlarl-eval``, seeds 1,000,000+); with failed demonstrations also "filtered BC" on the successful ones only
   (the honest baseline when success labels are known),
3. offline chunked IQL (``vlarl.algorithms.offline``) on all demonstration transitions (failed episodes: reward 0,
   truncated at the time limit): fit V and Q, score every transition's progress, drop those that do not advance
   (GR-RL filter; how many of the failed and successful episodes' transitions it kept is printed), fit again on
   the rest with advantage weights, saved and evaluated,
4. online: ``vlarl-train experiment=<that experiment> init_from=<offline policy>
   algorithm.critics_from=<offline>/critics.pt`` (RLPD, the same demonstrations mixed in, the critics IQL fitted;
   ``--fresh-critics`` starts new ones), evaluated on the same seeds (``--online-env-steps 0`` skips it),
5. print the table and write ``result.json``. Extra ``key=value`` arguments after ``--`` go to ``vlarl-train``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from vlarl import experiments
from vlarl.experiments import Stages, command, prepare, split_overrides, training_policy

#: --task -> the RLPD experiment whose policy, env and algorithm settings every phase uses
EXPERIMENTS = {"pushcube": "pushcube_mlp_rlpd", "pickcube": "pickcube_mlp_rlpd"}


STAGES = Stages("offline_then_online")
log = STAGES.log


def fresh_policy(cfg, spec, seed: int):
    """The experiment's policy, freshly initialized from ``seed`` (imitation and IQL each start from one)."""
    from policies.registry import make_policy

    torch.manual_seed(seed)
    return make_policy(cfg.policy, spec)


def save(policy, cfg, out: Path) -> Path:
    from vlarl.data.sft import save_policy_dir

    return save_policy_dir(policy, cfg.env, out)


def evaluate(checkpoint: Path, out: Path, args, stage: str) -> dict:
    return STAGES.evaluate(checkpoint, out, args.eval_episodes, args.eval_seed, args.eval_envs, stage)


def main(argv: list[str] | None = None) -> int:
    argv, overrides = split_overrides(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--task", default="pushcube", choices=sorted(EXPERIMENTS), help="ManiSkill task (scripted expert)")
    p.add_argument("--demos", type=int, default=30, help="successful demonstrations to record")
    p.add_argument("--failures", type=int, default=0,
                   help="failed demonstrations to record besides them (PushCube): a mixed-quality dataset")
    p.add_argument("--demo-file", default="", help="a ManiSkill .h5 of demonstrations; default <out>/demos.h5")
    p.add_argument("--bc-steps", type=int, default=2000)
    p.add_argument("--offline-steps", type=int, default=4000)
    p.add_argument("--beta", type=float, default=3.0)
    p.add_argument("--expectile", type=float, default=0.7)
    p.add_argument("--min-progress", type=float, default=0.0)
    p.add_argument("--online-env-steps", type=int, default=10000, help="0 = no online phase")
    p.add_argument("--skip-online-if-bc", type=float, default=None, metavar="RATE",
                   help="skip the online phase when BC on all demonstrations already reaches this held-out success "
                        "(no room left to measure)")
    p.add_argument("--fresh-critics", action="store_true",
                   help="start the online critics from scratch (default: from the offline IQL critics)")
    p.add_argument("--seed", type=int, default=0)
    experiments.add_held_out_arguments(p, episodes=50)
    args = p.parse_args(argv)
    from vlarl.algorithms.critic_files import CRITICS_FILE, save_critics
    from vlarl.algorithms.offline import IQL, OfflineConfig, filter_transitions, fit_offline
    from vlarl.algorithms.replay import demo_transitions
    from vlarl.data.demonstrations import read_maniskill_h5
    from vlarl.data.expert_demos import failures_problem, record_demos
    from vlarl.data.sft import fit_state_normalization

    problem = failures_problem(args.task, args.failures)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    loss = next((o.split("=", 1)[1] for o in overrides if o.startswith("algorithm.critic_loss=")), "mse")
    if args.online_env_steps > 0 and not args.fresh_critics and loss != "mse":
        print(f"algorithm.critic_loss={loss} cannot start from the offline IQL critics (they regress a scalar); add "
              f"--fresh-critics or drop the override", file=sys.stderr)  # vlarl-train would refuse it after BC and IQL
        return 2
    experiments.check_held_out_seed(p, args.eval_seed)
    out = prepare(args.out)
    res: dict = {"task": args.task, "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "overrides": overrides}
    demos = Path(args.demo_file) if args.demo_file else out / "demos.h5"
    if not demos.is_file():
        log(f"recording {args.demos} successful + {args.failures} failed expert demonstrations into {demos}")
        record_demos(demos, args.demos, 0, log=log, task=args.task, failures=args.failures)
    episodes = read_maniskill_h5(demos, args.demos + args.failures)
    good = [e for e in episodes if e.success]
    from_failed = torch.cat([torch.full((len(e.actions),), not e.success) for e in episodes])  # per transition
    res["demos"] = {"file": str(demos), "successful": len(good), "failed": len(episodes) - len(good),
                    "steps_successful": int((~from_failed).sum()), "steps_failed": int(from_failed.sum())}
    log(f"    {len(good)} successful ({res['demos']['steps_successful']} steps) and {len(episodes) - len(good)} "
        f"failed ({res['demos']['steps_failed']} steps) demonstrations")
    g = torch.Generator().manual_seed(args.seed)
    result_file = out / "result.json"

    log("1/4 imitation (behaviour cloning: IQL's actor step with beta = 0)")
    experiment = EXPERIMENTS[args.task]
    cfg, spec, bc = training_policy([f"experiment={experiment}", f"algorithm.demos={demos}"], args.seed)
    fit_state_normalization(bc, episodes)
    data = demo_transitions(episodes, bc.chunk_size)
    iql_cfg = OfflineConfig(gamma=cfg.algorithm.gamma, beta=0.0, expectile=args.expectile,
                            min_progress=args.min_progress, critic_hidden_sizes=list(cfg.algorithm.critic_hidden_sizes),
                            num_critics=cfg.algorithm.num_critics)  # shaped as the online ensemble it starts
    t0 = time.time()
    fit_offline(IQL(bc, iql_cfg, spec.state_dim, bc.chunk_size, spec.action_dim), data, args.bc_steps,
                train_critic=False, generator=g)
    res["bc"] = {"transitions": int(data.batch_size[0]), "steps": args.bc_steps, "wall_s": time.time() - t0}
    res["bc_eval"] = evaluate(save(bc, cfg, out / "bc"), out / "eval_bc", args, "vlarl-eval (imitation)")
    result_file.write_text(json.dumps(res, indent=2))  # partial results survive a stopped run
    if len(good) < len(episodes):
        log("1b/4 filtered BC: imitation of the successful demonstrations only")
        bc_f = fresh_policy(cfg, spec, args.seed)
        fit_state_normalization(bc_f, good)
        data_f = demo_transitions(good, bc_f.chunk_size)
        t0 = time.time()  # its own generator: IQL below draws the same batches as in a run without failures
        fit_offline(IQL(bc_f, iql_cfg, spec.state_dim, bc_f.chunk_size, spec.action_dim), data_f, args.bc_steps,
                    train_critic=False, generator=torch.Generator().manual_seed(args.seed))
        res["bc_filtered"] = {"transitions": int(data_f.batch_size[0]), "steps": args.bc_steps,
                              "wall_s": time.time() - t0}
        res["bc_filtered_eval"] = evaluate(save(bc_f, cfg, out / "bc_filtered"), out / "eval_bc_filtered", args,
                                           "vlarl-eval (filtered imitation)")
        result_file.write_text(json.dumps(res, indent=2))

    log("2/4 offline chunked IQL with the GR-RL filter")
    policy = fresh_policy(cfg, spec, args.seed)
    fit_state_normalization(policy, episodes)
    iql = IQL(policy, OfflineConfig(**{**asdict(iql_cfg), "beta": args.beta}), spec.state_dim, policy.chunk_size,
              spec.action_dim)
    t0 = time.time()
    fit_offline(iql, data, args.offline_steps // 2, generator=g)  # V and Q (and the actor) on every transition
    kept, stats = filter_transitions(iql, data, groups={"successful": ~from_failed, "failed": from_failed})
    log(f"    GR-RL filter kept {stats['kept']} of {stats['kept'] + stats['dropped']} transitions: "
        f"{stats['kept_successful']} of {stats['of_successful']} from successful episodes, "
        f"{stats['kept_failed']} of {stats['of_failed']} from failed ones")
    history = fit_offline(iql, kept, args.offline_steps - args.offline_steps // 2, generator=g)
    res["offline"] = {**stats, "steps": args.offline_steps, "beta": args.beta, "expectile": args.expectile,
                      "last": history[-1], "wall_s": time.time() - t0}
    res["offline_eval"] = evaluate(save(policy, cfg, out / "offline"), out / "eval_offline", args,
                                   "vlarl-eval (offline)")
    critics = save_critics(out / "offline" / CRITICS_FILE, iql.q, iql.q_target)
    result_file.write_text(json.dumps(res, indent=2))
    online = args.online_env_steps > 0
    if online and args.skip_online_if_bc is not None and res["bc_eval"]["success_once"] >= args.skip_online_if_bc:
        log(f"skipping the online phase: BC on all demonstrations already reaches {res['bc_eval']['success_once']:.2f}"
            f" >= {args.skip_online_if_bc} held-out (no room)")
        res["online_skipped"] = f"bc success_once {res['bc_eval']['success_once']:.2f} >= {args.skip_online_if_bc}"
        online = False
    if online:
        log("3/4 online RLPD from the offline policy")
        run_dir = out / "online"
        STAGES.run([command("vlarl-train"), f"experiment={experiment}", f"algorithm.demos={demos}",
              f"algorithm.num_demos={len(episodes)}", f"init_from={out / 'offline'}", f"run_dir={run_dir}",
              f"seed={args.seed}", f"total_env_steps={args.online_env_steps}", "eval.video_episodes=0",
              "eval.every_iterations=0", *([] if args.fresh_critics else [f"algorithm.critics_from={critics}"]),
              *overrides], "vlarl-train (online)")
        log("4/4 evaluating the online policy on the same held-out seeds")
        res["online_eval"] = evaluate(run_dir / "checkpoints" / "latest", run_dir / "eval_heldout", args,
                                      "vlarl-eval (online)")
    result_file.write_text(json.dumps(res, indent=2))
    print(table(res))
    return 0


STAGES = (("bc", "BC, all demonstrations"), ("bc_filtered", "BC, successful demonstrations only"),
          ("offline", "offline IQL + GR-RL filter, all demonstrations"), ("online", "online RLPD from offline"))


def table(res: dict) -> str:
    """The markdown table of every stage that was evaluated."""
    d = res["demos"]
    rows = [f"demonstrations: {d['successful']} successful ({d['steps_successful']} steps), {d['failed']} failed "
            f"({d['steps_failed']} steps)", "", "| stage | success_once [95% CI] |", "|---|---|"]
    for stage, name in STAGES:
        if f"{stage}_eval" in res:
            ev = res[f"{stage}_eval"]
            lo, hi = ev["success_once_ci95"]
            rows.append(f"| {name} | {ev['success_once']:.2f} [{lo:.2f}, {hi:.2f}] |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
