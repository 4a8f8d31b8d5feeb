"""Does the VLM process-reward critic make PPO learn faster? Sparse success reward alone vs sparse + critic.

Both arms run `vlarl-train` on ManiSkill PushCube-v1 with env.reward_mode=sparse, the same seeds, the same
env-step budget and the same PPO settings; they differ only in ``reward=vlm_critic``. To make the critic
arm affordable on a CPU machine the policy observes state while the env renders the critic's camera
(64 px) only at chunk boundaries (``env.critic_camera``), and the critic scores those frames. The critic
must have been trained on frames of that camera at that size (``train_critic.py record`` renders the same
camera); without ``--critic`` this script records scripted episodes and trains one first.

    nice -n 10 python scripts/bench_critic_rl.py --critic outputs/critic_pushcube --env-steps 24000 --seeds 0
    nice -n 10 python scripts/bench_critic_rl.py            # records + trains a critic first (slow)

Writes docs/critic_vs_sparse.png (held-out success_once vs env steps, both arms) and prints a table.
Extra `vlarl-train` overrides for both arms go after ``--``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# shared by both arms: state policy, end-effector control, sparse success reward, 5-action chunks
COMMON = [
    "experiment=pushcube_mlp_ppo", "env=maniskill_pushcube", "env.control_mode=pd_ee_delta_pos", "env.reward_mode=sparse",
    "env.ignore_terminations=true", "env.image_size=64", "policy.chunk_size=5", "algorithm.num_steps=10",
    "algorithm.num_minibatches=4", "eval.video_episodes=0", "logger.progress_bar=false",
    "time_limit_minutes=0", "checkpoint_every=100000",
]


def arm_overrides(arm: str, critic: str, args) -> list[str]:
    if arm == "sparse":
        return []
    return ["env.critic_camera=base_camera", "reward=vlm_critic", f"reward.critic_path={critic}",
            f"reward.mode={args.mode}", f"reward.potential_gamma={args.potential_gamma}",
            f"reward.critic_weight={args.critic_weight}"]


def ensure_critic(args, root: Path) -> str:
    """The critic to use: --critic, or one recorded + trained here on the same camera at 64 px."""
    if args.critic:
        return args.critic
    out = root / "critic"
    if (out / "model.safetensors").is_file():
        return str(out)
    script = str(ROOT / "scripts" / "train_critic.py")
    subprocess.run([sys.executable, script, "record", "--out", str(root / "critic_data"), "--image-size", "64"], check=True)
    subprocess.run([sys.executable, script, "train", "--data", str(root / "critic_data"), "--out", str(out)], check=True)
    return str(out)


def rollout_curve(run_dir: Path) -> list[tuple[int, float]]:
    """[(env_steps, success_once of the training rollouts)]: sampled actions, training seeds, recent episodes."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return sorted({int(r["env_steps"]): float(r["rollout/success_once"]) for r in rows
                   if "iteration" in r and "rollout/success_once" in r}.items())


def curve(run_dir: Path) -> tuple[list[tuple[int, float]], dict]:
    """[(env_steps, held-out success_once)] from the periodic and final evaluations (one per env step: a
    run extended with a larger --env-steps resumes from its checkpoint and appends), plus the last eval.json."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    pts: dict[int, float] = {}
    for r in rows:
        for key in ("eval/success_once", "final_eval/success_once"):
            if key in r and "env_steps" in r:
                pts[int(r["env_steps"])] = float(r[key])
    final = json.loads((run_dir / "eval" / "eval.json").read_text())
    pts[int(final["env_steps"])] = float(final["success_once"])
    return sorted(pts.items()), final


def steps_to(pts: list[tuple[int, float]], target: float) -> int | None:
    return next((s for s, v in pts if v >= target), None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--critic", default="", help="trained critic dir (64 px base_camera); empty = record + train one")
    ap.add_argument("--env-steps", type=int, default=24000, help="env-step budget per run")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--arms", nargs="+", default=["sparse", "critic"], choices=["sparse", "critic"])
    ap.add_argument("--eval-every", type=int, default=5, help="iterations between held-out evaluations")
    ap.add_argument("--eval-episodes", type=int, default=32, help="episodes per held-out evaluation")
    ap.add_argument("--mode", default="potential", help="reward.mode of the critic arm")
    ap.add_argument("--potential-gamma", type=float, default=1.0, help="reward.potential_gamma of the critic arm")
    ap.add_argument("--critic-weight", type=float, default=1.0)
    ap.add_argument("--target", type=float, default=0.5, help="success rate whose first env step is reported")
    ap.add_argument("--root", default="outputs/critic_rl", help="run directories go here")
    ap.add_argument("--plot", default=str(ROOT / "docs" / "critic_vs_sparse.png"))
    ap.add_argument("--skip-existing", action="store_true",
                    help="reuse runs under --root that reached --env-steps (shorter ones are extended)")
    ap.add_argument("overrides", nargs="*", help="vlarl-train overrides for both arms (after --)")
    args = ap.parse_args(argv)
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    critic = ensure_critic(args, root) if "critic" in args.arms else ""
    results: dict[str, dict[int, tuple[list, dict, float]]] = {a: {} for a in args.arms}
    for seed in args.seeds:
        for arm in args.arms:
            run_dir = root / f"{arm}_seed{seed}"
            cmd = [str(BIN / "vlarl-train"), f"run_dir={run_dir}", f"seed={seed}", f"total_env_steps={args.env_steps}",
                   f"eval.every_iterations={args.eval_every}", f"eval.periodic_episodes={args.eval_episodes}",
                   f"eval.episodes={args.eval_episodes}", *COMMON, *arm_overrides(arm, critic, args), *args.overrides]
            done = (run_dir / "eval" / "eval.json").is_file() and \
                json.loads((run_dir / "eval" / "eval.json").read_text()).get("env_steps", 0) >= args.env_steps
            if not (args.skip_existing and done):  # an unfinished or shorter run resumes from its checkpoint
                metrics = run_dir / "metrics.jsonl"
                for attempt in range(3):  # Ray's start-up can time out on a loaded machine: try again
                    size = metrics.stat().st_size if metrics.is_file() else -1
                    run = cmd
                    if (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir()):
                        run = [cmd[0], f"resume={run_dir}", f"total_env_steps={args.env_steps}"]  # extend it
                    elif run_dir.exists():
                        shutil.rmtree(run_dir)  # a start that failed before its first checkpoint
                    print("$", " ".join(run), flush=True)
                    if subprocess.run(run).returncode == 0:
                        break
                    if (metrics.stat().st_size if metrics.is_file() else -1) != size or attempt == 2:
                        print(f"{arm} seed {seed} failed")
                        return 1
                    print(f"{arm} seed {seed}: start-up failed, trying again", flush=True)
            pts, final = curve(run_dir)
            results[arm][seed] = (pts, final, rollout_curve(run_dir))
    print(f"\n## held-out success_once vs env steps ({args.eval_episodes} episodes per point)")
    steps = sorted({s for arm in args.arms for pts, _, _ in results[arm].values() for s, _ in pts})
    print("| arm | seed | " + " | ".join(str(s) for s in steps) + " |")
    print("|---|---|" + "---|" * len(steps))
    for arm in args.arms:
        for seed, (pts, _, _) in results[arm].items():
            d = dict(pts)
            print(f"| {arm} | {seed} | " + " | ".join(f"{d[s]:.2f}" if s in d else "" for s in steps) + " |")
    print(f"\n| arm | seed | final held-out success_once | best held-out | steps to {args.target:.0%} held-out | "
          "rollout success_once, last 4 iterations | train wall s |")
    print("|---|---|---|---|---|---|---|")
    for arm in args.arms:
        for seed, (pts, final, roll) in results[arm].items():
            hit = steps_to(pts, args.target)
            last = [v for _, v in roll[-4:]]
            print(f"| {arm} | {seed} | {final['success_once']:.3f} | {max(v for _, v in pts):.3f} | "
                  f"{hit if hit is not None else 'not reached'} | {sum(last) / max(1, len(last)):.3f} | "
                  f"{final.get('train_wall_s', float('nan')):.0f} |")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    colors = {"sparse": "tab:gray", "critic": "tab:blue"}
    labels = {"sparse": "sparse success reward", "critic": f"sparse + VLM critic ({args.mode})"}
    for arm in args.arms:
        for i, (pts, _, roll) in enumerate(results[arm].values()):
            ax.plot(*zip(*pts, strict=True), "o-", color=colors[arm], alpha=0.9,
                    label=f"{labels[arm]}, held-out" if i == 0 else None)
            ax.plot(*zip(*roll, strict=True), "--", color=colors[arm], alpha=0.5, lw=1,
                    label=f"{labels[arm]}, training rollouts" if i == 0 else None)
    ax.set_xlabel("env steps")
    ax.set_ylabel("success rate (success_once)")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"PushCube-v1, PPO, seeds {args.seeds}", fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.plot, dpi=100)
    print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
