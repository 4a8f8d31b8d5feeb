"""The frozen KL reference travels with the checkpoint: a run resumed from a checkpoint penalizes KL to
the same reference as the uninterrupted run, even when that reference is not the seeded initial
policy (e.g. a run started with ``init_from``). Real ActorWorkers and real checkpoint files."""

import torch
from test_config_keys import POLICY, SPEC, make_traj

from vlarl.checkpoint import REFERENCE_NAME, load_reference, save_reference
from vlarl.config.schema import GRPOConfig, PPOConfig
from vlarl.workers.actor_worker import ActorWorker

CFG = PPOConfig(kl_coef=0.5, update_epochs=2, num_minibatches=2, lr=1e-2, target_kl=0.0)


def _worker(start: dict[str, torch.Tensor] | None, cfg=CFG) -> ActorWorker:
    torch.manual_seed(0)
    w = ActorWorker(POLICY, cfg, SPEC, seed=0)
    if start is not None:  # what init_from does: policy and reference start from other weights
        w.policy.load_state_dict(start)
        w.reference.load_state_dict(start)
    return w


def _params(w: ActorWorker) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in w.policy.parameters()])


def test_resumed_run_has_the_uninterrupted_kl(tmp_path):
    torch.manual_seed(7)
    start = ActorWorker(POLICY, CFG, SPEC, seed=7).policy.state_dict()  # not the seed-0 initial weights
    t1, t2 = make_traj(1), make_traj(2)
    whole = _worker(start)
    whole.train(t1)
    want = whole.train(t2)

    first = _worker(start)
    first.train(t1)
    first.save(str(tmp_path), {"iteration": 1, "env_steps": 0})
    assert save_reference(first, str(tmp_path)) and (tmp_path / REFERENCE_NAME).is_file()

    resumed = _worker(None)  # a fresh process rebuilds its reference from the seed
    resumed.load(str(tmp_path))
    assert load_reference(resumed, str(tmp_path))
    got = resumed.train(t2)
    assert want["kl_ref"] > 0 and got["kl_ref"] == want["kl_ref"]
    assert torch.equal(_params(resumed), _params(whole))

    rebuilt = _worker(None)  # the old behaviour: reference rebuilt from seeded initial weights
    rebuilt.load(str(tmp_path))
    assert rebuilt.train(t2)["kl_ref"] != want["kl_ref"]


def test_no_reference_file_without_kl(tmp_path):
    w = _worker(None, GRPOConfig(group_size=2))
    assert w.reference is None
    assert not save_reference(w, str(tmp_path)) and not (tmp_path / REFERENCE_NAME).exists()
    assert not load_reference(w, str(tmp_path))
    with_kl = _worker(None)
    assert not load_reference(with_kl, str(tmp_path))  # KL on, old checkpoint: keeps the built one, warns


def test_a_resume_with_new_learning_rates_uses_them(tmp_path):
    """``vlarl-train resume=<run> algorithm.lr=... algorithm.critic_lr=...``: Adam's moments come from the
    checkpoint, the learning rates from the new config (optimizer.load_state_dict alone restores the saved ones)."""
    from dataclasses import replace

    cfg = replace(CFG, critic_lr=1e-3)
    first = _worker(None, cfg)
    first.train(make_traj(1))
    first.save(str(tmp_path), {"iteration": 1, "env_steps": 0})
    resumed = _worker(None, replace(cfg, lr=3e-5, critic_lr=3e-4))
    resumed.load(str(tmp_path))
    assert [g["lr"] for g in resumed.optimizer.param_groups] == [3e-5, 3e-4]
    assert resumed.optimizer.param_groups[1]["lr_scale"] == 3e-4 / 3e-5  # annealing keeps the new ratio
    moments = [resumed.optimizer.state[p]["exp_avg"] for p in resumed.policy.parameters()]
    saved = [first.optimizer.state[p]["exp_avg"] for p in first.policy.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(moments, saved, strict=True))
    same = _worker(None, cfg)
    same.load(str(tmp_path))
    assert [g["lr"] for g in same.optimizer.param_groups] == [1e-2, 1e-3]  # the same config: as saved


def test_a_resumed_sac_state_takes_the_new_critic_and_temperature_rates():
    """The soft actor-critics' own optimizers (critics, temperature) follow the same rule on resume."""
    from dataclasses import replace

    from policies.cnn.modeling import CNNPolicy
    from tests.algorithms.test_sac_pixels import SMALL, TINY
    from tests.algorithms.test_sac_pixels import SPEC as PSPEC
    from vlarl.algorithms.sac import SACState

    policy = CNNPolicy(TINY, PSPEC)
    saved = SACState(policy, SMALL, PSPEC).state_dict(with_replay=False)
    back = SACState(policy, replace(SMALL, q_lr=1e-5, alpha_lr=2e-5), PSPEC)
    back.load_state_dict(saved)
    assert back.q_opt.param_groups[0]["lr"] == 1e-5 and back.alpha_opt.param_groups[0]["lr"] == 2e-5
