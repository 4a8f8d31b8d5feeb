"""Record ManiSkill demonstrations and train a VLM process-reward critic on them.

    # 1. record scripted PushCube episodes (successes + failures), 64 px RGB, CPU backend
    python scripts/train_critic.py record --out data/critic/pushcube --episodes 48 --failures 16
    # 2. train a tiny critic on them; prints VOC / reversed-pair negative rate / done P/R on held-out episodes
    python scripts/train_critic.py train --data data/critic/pushcube --out outputs/critic_pushcube
    # 3. re-evaluate a saved critic on the same held-out split (same --seed / --holdout)
    python scripts/train_critic.py eval --critic outputs/critic_pushcube --data data/critic/pushcube
    # 4. improve it on your policy's own rollouts: train with reward.save_episodes=<dir>, then fine-tune
    python scripts/train_critic.py train --data <dir> --init outputs/critic_pushcube --out outputs/critic_ft

Episodes are stored as one ``episodes.npz`` (frames uint8 [E, L, H, W, 3], lengths [E], success [E],
instruction) so that rollouts saved by any other tool can be trained on too; ``--data`` takes such a file or a
directory of them (``vlarl.data.critic_episodes``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from simulators.maniskill_experts import scripted_pushcube_action

# -- recording ------------------------------------------------------------------------------------


def record(out: Path, episodes: int, failures: int, seed: int, image_size: int, max_steps: int) -> Path:
    """Roll out the scripted controller on PushCube-v1 and save frames of every episode."""
    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv
    from vlarl import system_env

    system_env.apply()
    cfg = ManiSkillConfig(task="PushCube-v1", control_mode="pd_ee_delta_pos", obs_mode="rgb",
                          image_size=image_size, reward_mode="sparse", max_episode_steps=max_steps)
    env = ManiSkillEnv(cfg, num_envs=1)
    u = env.envs[0].unwrapped
    rng = np.random.default_rng(seed)
    frames = np.zeros((episodes + failures, max_steps + 1, image_size, image_size, 3), np.uint8)
    lengths = np.zeros(episodes + failures, np.int64)
    success = np.zeros(episodes + failures, bool)
    t0 = time.time()
    for e in range(episodes + failures):
        fail_dir = 0.0 if e < episodes else float(rng.choice([-1.0, 1.0]))
        speed = float(rng.uniform(0.15, 0.3))
        obs = env.reset(seed=[seed + e])
        frames[e, 0] = obs["images"]["base_camera"][0].numpy()
        phase, n = 0, 0
        for _ in range(max_steps):
            a, phase = scripted_pushcube_action(u, phase, fail_dir, rng, speed)
            res = env.chunk_step(a.reshape(1, 1, 4))
            n += 1
            last = res.final_obs if res.final_obs is not None else res.obs
            frames[e, n] = last["images"]["base_camera"][0].numpy()
            if bool(res.done.any()):
                success[e] = bool(res.episode["success_once"][0] > 0)
                break
        lengths[e] = n + 1
        print(f"episode {e}: {n + 1} frames, success={success[e]} ({time.time() - t0:.0f}s)", flush=True)
    env.close()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "episodes.npz"
    np.savez_compressed(path, frames=frames, lengths=lengths, success=success,
                        instruction=np.array(env.instruction))
    return path


def load_episodes(data: Path):
    """An ``episodes.npz`` file, or every ``*.npz`` in a directory -> list of Episode."""
    from vlarl.data.critic_episodes import load_episodes as load

    return load(data)


# -- training -------------------------------------------------------------------------------------
def split_episodes(episodes: list, holdout: float, seed: int) -> tuple[list, list]:
    """(train, held-out): a seeded permutation; the held-out share is ``holdout`` (at least 2 episodes)."""
    order = np.random.default_rng(seed).permutation(len(episodes))
    n_test = max(2, int(len(episodes) * holdout))
    test = [episodes[i] for i in order[:n_test]]
    train_eps = [episodes[i] for i in order[n_test:]]
    if not any(e.success for e in test):
        raise SystemExit("held-out split has no successful episode; record more episodes or raise --holdout")
    if not any(e.success for e in train_eps):
        raise SystemExit("training split has no successful episode; record more episodes or lower --holdout")
    return train_eps, test


def evaluate(args) -> dict:
    """Quality of a saved critic on the held-out split that ``train`` with the same --seed/--holdout used."""
    from policies.critics import Critic
    from policies.critics.metrics import critic_quality

    torch.set_num_threads(args.threads)
    _, test = split_episodes(load_episodes(Path(args.data)), args.holdout, args.seed)
    q = critic_quality(Critic.from_pretrained(args.critic), test)
    print(json.dumps(q))
    return q


def train(args) -> dict:
    from policies.critics import (
        CriticTrainConfig,
        PairMix,
        ProcessRewardConfig,
        ProcessRewardCritic,
        train_critic,
    )
    from policies.critics.metrics import critic_quality
    from policies.critics.train import reference_frames
    from simulators.maniskill import INSTRUCTIONS

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    episodes = load_episodes(Path(args.data))
    train_eps, test = split_episodes(episodes, args.holdout, args.seed)
    image_size = int(episodes[0].frames.shape[1])
    if args.init:  # fine-tune a trained critic (e.g. on the policy's own rollouts)
        from policies.critics import Critic

        critic = Critic.from_pretrained(args.init)
    else:
        critic = ProcessRewardCritic(ProcessRewardConfig(image_size=image_size))
    other = [s for s in INSTRUCTIONS.values() if s != episodes[0].instruction]
    before = critic_quality(critic, test)
    print("untrained critic on held-out episodes:", json.dumps(before))
    tcfg = CriticTrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                             reference_prob=args.reference_prob, mix=PairMix(failed=args.failed_share, done_window=args.done_window,
                                                                 end_focus=args.end_focus))
    log = train_critic(critic, train_eps, tcfg, distractor_instructions=other, log_every=max(1, args.steps // 10))
    after = critic_quality(critic, test)
    print("trained critic on held-out episodes:  ", json.dumps(after))
    with_ref = None
    if args.reference_prob > 0:  # one-shot: a training episode's frames shown in context
        ref = reference_frames(next(e for e in train_eps if e.success), tcfg.reference_frames)
        with_ref = critic_quality(critic, test, reference=ref)
        print("trained, with a reference trajectory: ", json.dumps(with_ref))
    out = Path(args.out)
    critic.save_pretrained(out)
    report = {"untrained": before, "trained": after, "trained_with_reference": with_ref, "train_episodes": len(train_eps),
              "heldout_episodes": len(test), "steps": args.steps, "final_loss": log[-1]["loss"] if log else None}
    (out / "quality.json").write_text(json.dumps(report, indent=2))
    print(f"saved critic to {out}")
    return report


def _split_arguments(sp: argparse.ArgumentParser) -> None:
    """What ``train`` and ``eval`` both take: the recorded data, its held-out share and split seed, threads."""
    sp.add_argument("--data", required=True)
    sp.add_argument("--holdout", type=float, default=0.25)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--threads", type=int, default=1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="record scripted ManiSkill PushCube episodes")
    r.add_argument("--out", required=True)
    r.add_argument("--episodes", type=int, default=48, help="successful (scripted) episodes")
    r.add_argument("--failures", type=int, default=16, help="failing episodes (sideways pushes)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--image-size", type=int, default=64)
    r.add_argument("--max-steps", type=int, default=40)
    t = sub.add_parser("train", help="train a critic on recorded episodes")
    _split_arguments(t)
    t.add_argument("--out", required=True)
    t.add_argument("--steps", type=int, default=600)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--failed-share", type=float, default=0.15, help="weight of failed-episode pairs in a batch")
    t.add_argument("--init", default="", help="a trained critic dir to start from (fine-tuning) instead of a new one")
    t.add_argument("--done-window", type=int, default=0, help="the last N+1 frames of a success are labelled done")
    t.add_argument("--end-focus", type=float, default=0.0,
                   help="share of forward pairs ending in a success's last 4 frames (done-head positives + look-alikes)")
    t.add_argument("--reference-prob", type=float, default=0.0, help="share of batches with a reference episode")
    v = sub.add_parser("eval", help="quality of a saved critic on the held-out split of train")
    v.add_argument("--critic", required=True)
    _split_arguments(v)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.cmd == "record":
        path = record(Path(args.out), args.episodes, args.failures, args.seed, args.image_size, args.max_steps)
        print(f"saved {path}")
    elif args.cmd == "eval":
        evaluate(args)
    else:
        train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
