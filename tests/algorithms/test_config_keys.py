"""Every key of every registered algorithm's config changes behaviour: one case per key, each failing if the
key were ignored. Update-level keys run the real ActorWorker.train on a small synthetic rollout of a
real MLP policy (a squashed one for SAC/RLPD, a noise-steering one over a saved diffusion base for DSRL);
runner-level keys (the base ``AlgorithmConfig``'s num_steps, anneal_lr, name, and GRPO's
dynamic_sampling_rounds) are covered in test_grpo_runner.py and listed here so the coverage check below stays
exact for every algorithm in the registry."""

from dataclasses import fields, replace

import h5py
import numpy as np
import pytest
import torch

from policies.base import PolicySpec
from policies.diffusion import DiffusionPolicyConfig, NoiseSteeringConfig
from policies.mlp import MLPPolicyConfig
from policies.registry import make_policy
from vlarl.algorithms.critic_files import save_critics
from vlarl.algorithms.pa_rl import PARLConfig
from vlarl.algorithms.registry import ALGORITHMS
from vlarl.algorithms.sac import QEnsemble
from vlarl.config.schema import DSRLConfig, GRPOConfig, PPOConfig, RLPDConfig, SACConfig, SoftCriticConfig
from vlarl.data.trajectory import Trajectory
from vlarl.workers.actor_worker import ActorWorker

N, B, T, A, D = 6, 8, 2, 2, 5
SPEC = PolicySpec(state_dim=D, action_dim=A, action_low=[-1.0] * A, action_high=[1.0] * A)
POLICY = MLPPolicyConfig(hidden_sizes=[16, 16], chunk_size=T)
NAN = float("nan")


def make_traj(seed: int = 0) -> Trajectory:
    """Rollout of the seed-0 policy on random states, with behaviour log-probs perturbed (so clips
    bind), episode ends (terminated and truncated, one mid-chunk), stale samples and group outcomes."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    actor = ActorWorker(POLICY, PPOConfig(), SPEC, seed=0)
    states = torch.randn(N, B, D, generator=g)
    samples = [actor.policy.sample({"state": states[t], "images": {}, "instruction": []}) for t in range(N)]
    logprob = torch.stack([s.logprob for s in samples])
    logprob = logprob + torch.empty_like(logprob).uniform_(-1.0, 1.0, generator=g)
    dones = torch.zeros(N, B)
    trunc = torch.zeros(N, B)
    dones[2, [0, 2, 4, 6]] = 1.0
    trunc[4, [1, 3]] = 1.0
    step_mask = torch.ones(N, B, T, dtype=torch.bool)
    step_mask[2, 0, 1] = False  # episode of env 0 ended after the first action of the chunk
    step_mask[4, 1, 1] = False
    step_rewards = torch.randn(N, B, T, generator=g) * step_mask
    ep_success = torch.full((N, B), NAN)
    ep_return = torch.full((N, B), NAN)
    ends = dones.bool() | trunc.bool()
    success = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0])  # groups of 2: all-s, mixed, all-f, mixed
    for b in range(B):
        t = int(ends[:, b].float().argmax()) if ends[:, b].any() else None
        if t is None:  # give every env an episode end at the last step
            dones[N - 1, b] = 1.0
            t = N - 1
        ep_success[t, b] = success[b]
        ep_return[t, b] = float(step_rewards[: t + 1, b].sum())
    version = torch.zeros(N, B)
    version[:2] = -3.0  # sampled 3 versions ago
    return Trajectory(  # two instructions over the envs (two tasks), for algorithm.norm_adv_by
        obs={"state": states, "images": {}, "instruction": ["pick" if b < 3 else "place" for b in range(B)]},
        replay={"actions": torch.stack([s.replay["actions"] for s in samples])},
        logprob=logprob,
        values=torch.stack([s.value for s in samples]),
        rewards=step_rewards.sum(-1),
        dones=dones,
        truncated=trunc,
        final_values=torch.randn(N, B, generator=g),
        next_value=torch.randn(B, generator=g),
        step_mask=step_mask, step_rewards=step_rewards, episode_success=ep_success, episode_return=ep_return,
        policy_version=version,
    )


def train_once(cfg, traj: Trajectory | None = None, updates: int = 1):
    torch.manual_seed(0)
    actor = ActorWorker(POLICY, cfg, SPEC, seed=0)
    metrics = {}
    for _ in range(updates):
        metrics = actor.train(traj if traj is not None else make_traj())
    return actor.policy, metrics


def params(policy) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for n, p in policy.named_parameters() if not n.startswith("norm")])


PPO_BASE = dict(update_epochs=2, num_minibatches=4, lr=1e-2, target_kl=0.0)
GRPO_BASE = dict(group_size=2, update_epochs=2, num_minibatches=2, lr=1e-2, target_kl=0.0)

# key -> (extra base settings, changed value)
SHARED = {
    "lr": ({}, 1e-3),
    "update_epochs": ({}, 1),
    "num_minibatches": ({}, 1),
    "clip_low": ({}, 0.05),
    "clip_high": ({}, 0.6),
    "dual_clip": ({}, 1.5),
    "ent_coef": ({}, 0.5),
    "max_grad_norm": ({}, 0.0),
    "target_kl": ({}, 1e-6),
    "norm_adv": ({}, "flip"),
    "norm_adv_by": ({"norm_adv": True}, "instruction"),
    "logprob_level": ({}, "token"),
    "loss_agg_mode": ({"logprob_level": "token"}, "traj-mean"),
    "kl_coef": ({}, 1.0),
    "kl_estimator": ({"kl_coef": 1.0}, "k1"),
    "max_staleness": ({}, 1),
    "decoupled": ({}, True),
    "behaviour_weight_cap": ({"decoupled": True}, 1.01),
}
PPO_ONLY = {
    "gamma": ({}, 0.99),
    "gae_lambda": ({}, 0.5),
    "value_clip": ({}, 0.01),
    "value_loss": ({}, "huber"),
    "huber_delta": ({"value_loss": "huber"}, 0.1),
    "vf_coef": ({}, 2.0),
    "reward_scale": ({}, 3.0),
    "reward_level": ({"logprob_level": "action"}, "action"),
    "critic_warmup_iterations": ({}, 1),
    "critic_lr": ({}, 0.1),
    "value_after_kl_stop": ({"target_kl": 1e-6}, True),
}
GRPO_ONLY = {
    "group_size": ({}, 4),
    "score": ({}, "return"),
    "scale_by_std": ({"score": "return"}, False),
    "adv_eps": ({"score": "return"}, 10.0),
    "filter_groups": ({}, True),
}
BASE_KEYS = {"name", "num_steps", "anneal_lr"}  # AlgorithmConfig: read by the runner for every algorithm
RUNNER_LEVEL = BASE_KEYS | {"dynamic_sampling_rounds"}  # test_grpo_runner.py
EXTRA_TESTS = {"skip_nonfinite_grads", "seq-mean-token-mean"}  # below

CASES = [("ppo", k, *v) for k, v in {**SHARED, **PPO_ONLY}.items()] + [
    ("grpo", k, *v) for k, v in {**SHARED, **GRPO_ONLY}.items()]


def base_cfg(algo: str, extra: dict):
    if algo == "ppo":
        return PPOConfig(**{**PPO_BASE, **extra})
    return GRPOConfig(**{**GRPO_BASE, **extra})


# The unchanged configuration's trained weights, keyed by the config's repr: most cases share a base (training is
# seeded, so the base trains to the same weights each time), and training it once per base halves the cases' time.
_BASE_RESULTS: dict[str, torch.Tensor] = {}


def base_result(cfg, train) -> torch.Tensor:
    """``train(cfg)``, computed once per distinct ``cfg`` in this module's run."""
    key = repr(cfg)
    if key not in _BASE_RESULTS:
        _BASE_RESULTS[key] = train(cfg)
    return _BASE_RESULTS[key]


@pytest.mark.parametrize("algo, key, extra, value", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_key_changes_the_update(algo, key, extra, value):
    base = base_cfg(algo, extra)
    if value == "flip":
        value = not getattr(base, key)
    changed = replace(base, **{key: value})
    p0 = base_result(base, lambda cfg: params(train_once(cfg)[0]))
    p1 = params(train_once(changed)[0])
    assert torch.isfinite(p0).all() and torch.isfinite(p1).all()
    assert not torch.allclose(p0, p1), f"algorithm.{key}={value} left the update unchanged"


def test_every_algorithm_key_is_covered():
    """Each registered algorithm's config holds exactly the keys a case here (or the runner's tests) covers:
    a key added without a case, or one borrowed from another algorithm, fails this."""
    covered = {
        "ppo": set(SHARED) | set(PPO_ONLY) | BASE_KEYS | {"skip_nonfinite_grads"},
        "grpo": set(SHARED) | set(GRPO_ONLY) | RUNNER_LEVEL | {"skip_nonfinite_grads"},
        "sac": set(SOFT) | set(SAC_ONLY) | BASE_KEYS | PIXEL_ONLY,
        "rlpd": set(SOFT) | set(SAC_ONLY) | BASE_KEYS | PIXEL_ONLY,  # SAC's keys with RLPD's defaults
        "dsrl": set(SOFT) | set(DSRL_ONLY) | BASE_KEYS,
        "pa_rl": set(PA_RL_CASES) | PA_RL_REFUSED | BASE_KEYS | PIXEL_ONLY,
    }
    assert set(ALGORITHMS) == set(covered)
    for name, spec in ALGORITHMS.items():
        assert {f.name for f in fields(spec.config)} == covered[name], name
    assert type(RLPDConfig()).__mro__[1] is SACConfig and DSRLConfig.__mro__[1] is SoftCriticConfig


def test_skip_nonfinite_grads_skips_and_counts():
    """One NaN reward poisons exactly one sample's advantage (GAE runs backwards from t=0 only), so
    exactly one minibatch per epoch has a NaN gradient: that optimizer step is skipped and counted."""
    traj = make_traj()
    traj.rewards[0, 0] = float("nan")
    cfg = PPOConfig(**PPO_BASE, norm_adv=False)  # PPO_BASE: 2 epochs x 4 minibatches
    torch.manual_seed(0)
    actor = ActorWorker(POLICY, cfg, SPEC, seed=0)
    m = actor.train(traj)
    assert m["skipped_steps"] == cfg.update_epochs
    taken = {int(st["step"]) for st in actor.optimizer.state.values()}
    assert taken == {cfg.update_epochs * cfg.num_minibatches - cfg.update_epochs}  # Adam stepped on the rest
    assert torch.isfinite(params(actor.policy)).all() and m["grad_norm"] == m["grad_norm"]
    # the same batch without the NaN: no step is skipped
    assert train_once(cfg, make_traj())[1]["skipped_steps"] == 0
    # off: the NaN step is taken, the weights turn NaN and the next forward pass fails
    with pytest.raises(ValueError, match="nan"):
        train_once(replace(cfg, skip_nonfinite_grads=False), traj)


def test_score_reward_to_go_differs_from_return():
    a, _ = train_once(GRPOConfig(**GRPO_BASE, score="return"))
    b, m = train_once(GRPOConfig(**GRPO_BASE, score="reward_to_go"))
    assert m["samples"] > 0 and not torch.allclose(params(a), params(b))


def test_seq_mean_token_mean_differs_from_token_mean_with_padding():
    a, _ = train_once(PPOConfig(**PPO_BASE, logprob_level="token", loss_agg_mode="token-mean"))
    b, _ = train_once(PPOConfig(**PPO_BASE, logprob_level="token", loss_agg_mode="seq-mean-token-mean"))
    assert not torch.allclose(params(a), params(b))


def test_critic_warmup_leaves_the_actor_untouched():
    torch.manual_seed(0)
    before = ActorWorker(POLICY, PPOConfig(), SPEC, seed=0).policy
    after, m = train_once(PPOConfig(**PPO_BASE, critic_warmup_iterations=1))
    assert m["critic_warmup"] == 1.0
    for n, p in before.named_parameters():
        same = torch.equal(p, dict(after.named_parameters())[n])
        assert same == (not n.startswith("critic")), n
    _, m2 = train_once(PPOConfig(**PPO_BASE, critic_warmup_iterations=1), updates=2)
    assert m2["critic_warmup"] == 0.0


def test_value_after_kl_stop_trains_the_critic_alone_for_the_epochs_left():
    """``target_kl`` ends the policy's epochs after the first; with ``value_after_kl_stop`` the critic goes on
    for the other two: the actor's weights are those of the stopped update, the critic's moved further."""
    cfg = PPOConfig(**{**PPO_BASE, "update_epochs": 3, "target_kl": 1e-6})
    stopped, m0 = train_once(cfg)
    went_on, m1 = train_once(replace(cfg, value_after_kl_stop=True))
    assert (m0["epochs"], m0["value_epochs"]) == (1.0, 0.0)
    assert (m1["epochs"], m1["value_epochs"]) == (1.0, 2.0)
    assert m1["approx_kl"] == m0["approx_kl"]  # the policy's statistics are those it stopped at
    a, b = dict(stopped.named_parameters()), dict(went_on.named_parameters())
    for n in a:
        assert torch.equal(a[n], b[n]) == (not n.startswith("critic")), n


def test_update_metrics_are_reported():
    _, m = train_once(PPOConfig(**PPO_BASE, kl_coef=0.1, dual_clip=2.0, decoupled=True, max_staleness=1))
    for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "dual_clipfrac", "kl_ref",
              "grad_norm", "value_error", "explained_variance", "skipped_steps", "stale_dropped",
              "behaviour_weight_capfrac"):
        assert k in m and m[k] == m[k], k
    assert m["stale_dropped"] == 2 * B
    _, g = train_once(GRPOConfig(**GRPO_BASE, filter_groups=True))
    assert g["samples"] > 0 and g["score_mean"] == pytest.approx(0.5)


def test_critic_lr_moves_only_the_value_head_faster():
    """algorithm.critic_lr gives the value head (``critic.*``) its own Adam group; the actor's update is
    unchanged, and lr annealing keeps the ratio between the two groups."""
    no_clip = {**PPO_BASE, "max_grad_norm": 0.0}  # a global-norm clip would couple the two groups' steps
    base, _ = train_once(PPOConfig(**no_clip))
    fast, _ = train_once(PPOConfig(**no_clip, critic_lr=PPO_BASE["lr"] * 10))
    torch.manual_seed(0)
    start = ActorWorker(POLICY, PPOConfig(), SPEC, seed=0).policy
    moved = {}
    for tag, m in (("base", base), ("fast", fast)):
        after = dict(m.named_parameters())
        moved[tag] = {n: (after[n] - p).abs().sum().item() for n, p in start.named_parameters()}
    critic = [n for n in moved["base"] if n.startswith("critic.")]
    actor = [n for n in moved["base"] if not n.startswith("critic.")]
    assert critic and actor
    assert sum(moved["fast"][n] for n in critic) > 3 * sum(moved["base"][n] for n in critic)
    assert all(moved["fast"][n] == pytest.approx(moved["base"][n], rel=1e-4, abs=1e-7) for n in actor)
    worker = ActorWorker(POLICY, PPOConfig(lr=1e-3, critic_lr=5e-3), SPEC, seed=0)
    assert [g["lr"] for g in worker.optimizer.param_groups] == [1e-3, 5e-3]
    worker.set_lr(5e-4)
    assert [g["lr"] for g in worker.optimizer.param_groups] == pytest.approx([5e-4, 2.5e-3])


# --- soft actor-critic (SAC, RLPD, DSRL): the replay, critics, temperature and actor keys -------------------------

SQUASHED = MLPPolicyConfig(hidden_sizes=[16, 16], chunk_size=T, squash=True)
C = 3  # the rollouts' privileged critic_state width (algorithm.critic_obs=critic_state)
SOFT_SPEC = replace(SPEC, critic_state_dim=C)
SOFT_BASE = dict(num_steps=1, batch_size=16, buffer_size=64, learning_starts=0, utd_ratio=0.5,
                 critic_hidden_sizes=[16, 16], lr=3e-3, q_lr=3e-3, alpha_lr=3e-3, tau=0.05, gamma=0.9)

# key -> (extra base settings, changed value); the files are written by the ``soft_files`` fixture
SOFT = {
    "lr": ({}, 1e-4),  # the actor's
    "max_grad_norm": ({}, 1e-6),
    "gamma": ({}, 0.5),
    "tau": ({}, 1.0),
    "q_lr": ({}, 1e-4),
    "alpha_lr": ({}, 1e-4),
    "init_alpha": ({}, 1.0),
    "target_entropy_per_dim": ({}, -5.0),
    "backup_entropy": ({}, True),
    "batch_size": ({}, 8),
    "buffer_size": ({}, 16),
    "learning_starts": ({}, 10_000),
    "utd_ratio": ({}, 1.0),
    "actor_every": ({}, 2),
    "reward_scale": ({}, 5.0),
    "num_critics": ({}, 3),
    "critic_subset": ({}, 1),
    "critic_hidden_sizes": ({}, [8]),
    "critic_layer_norm": ({}, False),
    "critic_loss": ({}, "hl_gauss"),
    "hl_gauss_bins": ({"critic_loss": "hl_gauss"}, 11),
    "hl_gauss_v_min": ({"critic_loss": "hl_gauss"}, -3.0),
    "hl_gauss_v_max": ({"critic_loss": "hl_gauss"}, 4.0),
    "hl_gauss_sigma_ratio": ({"critic_loss": "hl_gauss"}, 2.0),
    "critic_obs": ({}, "critic_state"),  # the critics read the rollout's privileged critic_state, not the state
}
SAC_ONLY = {
    "demos": ({"demos": "{demos_a}", "demo_ratio": 0.5}, "{demos_b}"),
    "num_demos": ({"demos": "{demos_a}", "demo_ratio": 0.5}, 1),
    "demo_ratio": ({"demos": "{demos_a}", "demo_ratio": 0.5}, 0.25),
    "bc_weight": ({"demos": "{demos_a}", "demo_ratio": 0.5}, 1.0),
    "actor_warmup_steps": ({}, 10_000),
    "critics_from": ({}, "{critics}"),
    "pretrain_updates": ({"demos": "{demos_a}", "demo_ratio": 0.5}, 4),
    "pretrain_bc_weight": ({"demos": "{demos_a}", "demo_ratio": 0.5, "pretrain_updates": 4}, 50.0),
}
#: keys of pixel critics only (refused for the state policy here): their no-op checks are in
#: test_pixel_rlpd_knobs.py (image_shift: the shifted frames move the critic's update)
PIXEL_ONLY = {"image_shift"}
DSRL_ONLY = {"critic_input": ({}, "action")}
#: pa_rl (an actor trained by imitation): the soft keys it reads, its own, and those it refuses (no temperature, no
#: SAC actor term or offline phase; test_pa_rl.py checks each refusal)
PA_RL_REFUSED = {"init_alpha", "alpha_lr", "target_entropy_per_dim", "backup_entropy", "bc_weight", "pretrain_updates",
                 "pretrain_bc_weight"}
PA_RL_ONLY = {
    "candidates": ({}, 1),
    "keep_data_action": ({}, "flip"),
    "keep_acted": ({}, "flip"),
    "pessimism": ({}, 5.0),
    "min_gain": ({}, 0.5),
    "action_steps": ({}, 2),
    "action_step_size": ({"action_steps": 2}, 0.5),
}
PA_RL_CASES = {k: v for k, v in {**SOFT, **SAC_ONLY, **PA_RL_ONLY}.items() if k not in PA_RL_REFUSED}


@pytest.fixture(scope="module")
def soft_files(tmp_path_factory) -> dict[str, str]:
    """Two demonstration files (different chunks), a critics file shaped as SOFT_BASE's ensemble, a saved base."""
    d = tmp_path_factory.mktemp("soft")
    out = {}
    for tag, value in (("demos_a", 0.3), ("demos_b", -0.6)):
        with h5py.File(d / f"{tag}.h5", "w") as f:
            for i in range(3):
                g = f.create_group(f"traj_{i}")
                g.create_dataset("actions", data=np.full((5, A), value * (i + 1) / 3, np.float32))
                g.create_dataset("obs", data=np.linspace(-1, 1, 6 * D, dtype=np.float32).reshape(6, D) * (i + 1))
        out[tag] = str(d / f"{tag}.h5")
    torch.manual_seed(7)
    q = QEnsemble(D + T * A, [16, 16], 1, 2, True)
    out["critics"] = str(save_critics(d / "critics.pt", q, q))
    torch.manual_seed(0)
    make_policy(DiffusionPolicyConfig(chunk_size=T), SPEC).save_pretrained(d / "base")
    out["base"] = str(d / "base")
    return out


def soft_traj(policy, noise: bool = False, seed: int = 3) -> Trajectory:
    """Two chunk steps of B envs sampled by ``policy`` with random per-action rewards; no episode ends, so every
    transition bootstraps (gamma, tau and backup_entropy matter) except two terminated ones."""
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(2, B, D, generator=g)
    obs = [{"state": states[t], "images": {}, "instruction": ["push"] * B} for t in range(2)]
    samples = [policy.sample(o) for o in obs]
    dones = torch.zeros(2, B)
    dones[1, :2] = 1.0
    step_rewards = torch.randn(2, B, T, generator=g)
    keys = ("actions", "noise") if noise else ("actions",)
    critic_state = torch.randn(3, B, C, generator=g)  # obs, then the next obs of the last step
    return Trajectory(
        obs={"state": states, "images": {}, "instruction": ["push"] * B, "critic_state": critic_state[:2]},
        replay={k: torch.stack([s.replay[k] if k in s.replay else s.actions for s in samples]) for k in keys},
        logprob=torch.stack([s.logprob for s in samples]), values=torch.zeros(2, B), rewards=step_rewards.sum(-1),
        dones=dones, truncated=torch.zeros(2, B), final_values=torch.zeros(2, B), next_value=torch.zeros(B),
        step_rewards=step_rewards, step_mask=torch.ones(2, B, T, dtype=torch.bool),
        next_state=torch.randn(2, B, D, generator=g), next_critic_state=critic_state[1:])


def train_soft(policy_cfg, cfg) -> torch.Tensor:
    """Two updates of the real ActorWorker on two rollouts; the trained actor's weights and the temperature, flat."""
    torch.manual_seed(0)
    actor = ActorWorker(policy_cfg, cfg, SOFT_SPEC, seed=0)
    noise = isinstance(cfg, DSRLConfig)
    for seed in (3, 4):
        actor.train(soft_traj(actor.policy, noise, seed))
    trained = [p.detach().flatten() for p in actor.policy.parameters() if p.requires_grad]
    state = actor.alg_state.noise if noise else actor.alg_state
    return torch.cat([*trained, state.log_alpha.detach().reshape(1)])


def _filled(settings: dict, files: dict[str, str]) -> dict:
    return {k: v.format(**files) if isinstance(v, str) else v for k, v in settings.items()}


SOFT_CASES = [("sac", k, *v) for k, v in {**SOFT, **SAC_ONLY}.items()] + [
    ("dsrl", k, *v) for k, v in {**SOFT, **DSRL_ONLY}.items()] + [("pa_rl", k, *v) for k, v in PA_RL_CASES.items()]
SOFT_CONFIGS = {"sac": SACConfig, "dsrl": DSRLConfig, "pa_rl": PARLConfig}


@pytest.mark.parametrize("algo, key, extra, value", SOFT_CASES, ids=[f"{c[0]}-{c[1]}" for c in SOFT_CASES])
def test_soft_critic_key_changes_the_update(algo, key, extra, value, soft_files):
    config = SOFT_CONFIGS[algo]
    policy_cfg = {"sac": SQUASHED, "pa_rl": DiffusionPolicyConfig(chunk_size=T),  # pa_rl's actor imitates
                  "dsrl": NoiseSteeringConfig(base_path=soft_files["base"], chunk_size=T, hidden_sizes=[16, 16])}[algo]
    own = {"demo_ratio": 0.0, "num_critics": 2} if algo == "pa_rl" else {}  # SAC's defaults for RLPD's
    base = config(**_filled({**SOFT_BASE, **own, **extra}, soft_files))
    if value == "flip":
        value = not getattr(base, key)
    changed = replace(base, **_filled({key: value}, soft_files))
    a, b = base_result(base, lambda cfg: train_soft(policy_cfg, cfg)), train_soft(policy_cfg, changed)
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    assert not torch.allclose(a, b), f"algorithm={algo} algorithm.{key}={value} left the update unchanged"
