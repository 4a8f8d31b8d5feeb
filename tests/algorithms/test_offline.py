"""Offline chunked IQL and the GR-RL demonstration filter: hand-computed losses, weights and progress, and a
chain task whose demonstrations mix forward steps with detours."""

import math

import pytest
import torch
from tensordict import TensorDict

from policies.base import PolicySpec
from policies.mlp import MLPPolicy, MLPPolicyConfig
from vlarl.algorithms.offline import (
    IQL,
    OfflineConfig,
    advantage_weights,
    chunk_progress,
    expectile_loss,
    filter_transitions,
    fit_offline,
    progress_mask,
)

torch.set_num_threads(1)


def test_expectile_loss_weights_each_side_by_hand():
    # diff = target - prediction; tau = 0.7: below the prediction (diff < 0) weighs 0.3, above weighs 0.7
    out = expectile_loss(torch.tensor([-2.0, 1.0, 0.0]), 0.7)
    assert torch.allclose(out, torch.tensor([0.3 * 4, 0.7 * 1, 0.0]))


def test_advantage_weights_by_hand():
    w = advantage_weights(torch.tensor([0.0, math.log(2.0), 10.0]), beta=1.0, max_weight=100.0)
    assert torch.allclose(w, torch.tensor([1.0, 2.0, 100.0]))  # exp(10) = 22026 is clipped at 100
    assert torch.equal(advantage_weights(torch.tensor([-3.0, 5.0]), beta=0.0, max_weight=100.0), torch.ones(2))


def test_chunk_progress_and_the_filter_by_hand():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[True, True], [True, False], [True, True], [True, True]])
    terminated = torch.tensor([True, False, False, False])
    value = torch.tensor([0.5, 0.5, 0.2, 0.6])
    next_value = torch.tensor([9.0, 0.5, 0.5, 0.4])
    p = chunk_progress(rewards, mask, terminated, value, next_value)
    # 1: reward 1 (terminated, so V(s') = 9 is ignored) - 0.5 = 0.5
    # 2: 0.5 - 0.5 = 0 (the value stood still: no progress; the masked step changes nothing)
    # 3: 0.5 - 0.2 = 0.3;  4: 0.4 - 0.6 = -0.2 (the value fell: a detour)
    assert torch.allclose(p, torch.tensor([0.5, 0.0, 0.3, -0.2]))
    assert progress_mask(p).tolist() == [True, False, True, False]
    assert progress_mask(p, min_progress=0.4).tolist() == [True, False, False, False]


def chain_demos(n_states: int = 10, step: float = 0.1) -> tuple[TensorDict, torch.Tensor]:
    """A 1-D chain x = 0, 0.1, .., 0.9: from every x one forward step (a = +0.1; reward 1 and termination on
    reaching 1) and one detour (a = -0.1, back towards 0). Returns transitions [2 n] and is_forward [2 n]."""
    x = torch.arange(n_states, dtype=torch.float32) * step
    rows = []
    for a in (step, -step):
        nxt = (x + a).clamp(min=0.0)
        done = nxt >= 1.0 - 1e-6
        rows.append(TensorDict({
            "state": x[:, None], "actions": torch.full((n_states, 1, 1), a), "step_rewards": done.float()[:, None],
            "step_mask": torch.ones(n_states, 1, dtype=torch.bool), "terminated": done,
            "truncated": torch.zeros(n_states, dtype=torch.bool), "next_state": nxt[:, None]}, batch_size=[n_states]))
    return torch.cat(rows), torch.cat([torch.ones(n_states), torch.zeros(n_states)]).bool()


def _policy():
    spec = PolicySpec(state_dim=1, action_dim=1, action_low=[-1.0], action_high=[1.0])
    return MLPPolicy(MLPPolicyConfig(hidden_sizes=[32, 32], chunk_size=1, squash=True, normalize_obs=False,
                                     activation="relu", init_log_std=-1.0), spec)


@pytest.mark.parametrize("beta, forward", [(0.0, False), (10.0, True)])
def test_iql_prefers_the_chunks_that_advance_and_bc_does_not(beta, forward):
    torch.manual_seed(0)
    data, _ = chain_demos()
    policy = _policy()
    cfg = OfflineConfig(gamma=0.9, beta=beta, tau=0.05, lr=3e-3, q_lr=3e-3, batch_size=20, critic_hidden_sizes=[32, 32])
    iql = IQL(policy, cfg, state_dim=1, chunk=1, action_dim=1)
    fit_offline(iql, data, steps=200, generator=torch.Generator().manual_seed(0))
    mean_action = float(policy.act({"state": data["state"][:10], "images": {}, "instruction": []}).mean())
    if forward:  # the advantage weights favour +0.1 where both chunks were shown
        assert mean_action > 0.05
    else:  # behaviour cloning averages the two
        assert abs(mean_action) < 0.05


def test_gr_rl_filter_drops_the_detours():
    torch.manual_seed(0)
    data, is_forward = chain_demos()
    cfg = OfflineConfig(gamma=0.9, tau=0.05, q_lr=3e-3, batch_size=20, critic_hidden_sizes=[32, 32])
    iql = IQL(_policy(), cfg, state_dim=1, chunk=1, action_dim=1)
    fit_offline(iql, data, steps=200, generator=torch.Generator().manual_seed(0))
    progress = iql.progress(data)
    kept, stats = filter_transitions(iql, data)
    assert (progress[is_forward] > 0).float().mean() >= 0.9  # forward steps advance
    assert (progress[~is_forward] <= 0).float().mean() >= 0.9  # detours (and standing still at 0) do not
    assert stats["kept"] + stats["dropped"] == 20 and kept.batch_size[0] == stats["kept"]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="expectile"):
        IQL(_policy(), OfflineConfig(expectile=1.0), 1, 1, 1)
    spec = PolicySpec(state_dim=1, action_dim=1, action_low=[-1.0], action_high=[1.0])
    with pytest.raises(ValueError, match="squash"):
        IQL(MLPPolicy(MLPPolicyConfig(chunk_size=1), spec), OfflineConfig(), 1, 1, 1)


def test_online_sac_starts_from_the_offline_critics(tmp_path):
    """``algorithm.critics_from``: the Q and target-Q weights IQL fitted are the ones SAC's state holds, and an
    ensemble of another shape is refused with the key to change."""
    from vlarl.algorithms.critic_files import save_critics
    from vlarl.algorithms.sac import SACState
    from vlarl.config.schema import SACConfig

    torch.manual_seed(0)
    data, _ = chain_demos()
    cfg = OfflineConfig(gamma=0.9, tau=0.05, q_lr=3e-3, batch_size=20, critic_hidden_sizes=[32, 32])
    iql = IQL(_policy(), cfg, state_dim=1, chunk=1, action_dim=1)
    fit_offline(iql, data, steps=20, generator=torch.Generator().manual_seed(0))
    path = save_critics(tmp_path / "critics.pt", iql.q, iql.q_target)
    spec = PolicySpec(state_dim=1, action_dim=1, action_low=[-1.0], action_high=[1.0])
    sac_cfg = SACConfig(critic_hidden_sizes=[32, 32], num_critics=2, critics_from=str(path))
    st = SACState(_policy(), sac_cfg, spec)
    for net, saved in ((st.q, iql.q), (st.q_target, iql.q_target)):
        for (name, p), (_, p_saved) in zip(net.named_parameters(), saved.named_parameters(), strict=True):
            assert torch.equal(p, p_saved), name
    assert not torch.equal(iql.q.out.weight, iql.q_target.out.weight)  # the two were saved apart
    # the scores the online critic gives are the offline ones
    x = data["state"][:5]
    assert torch.allclose(st.values(st.q, x, data["actions"][:5]), iql._q(iql.q, x, data["actions"][:5]))
    with pytest.raises(ValueError, match="in_dim=2 but this config builds in_dim=3"):
        SACState(_policy_t2(), sac_cfg, spec)
    from vlarl.algorithms.sac import validate_sac

    assert "algorithm.critic_hidden_sizes" in validate_sac(SACConfig(critics_from=str(path)), num_envs=4)
    assert "critic_loss" in validate_sac(SACConfig(critic_hidden_sizes=[32, 32], critics_from=str(path),
                                                   critic_loss="hl_gauss"), num_envs=4)
    assert validate_sac(sac_cfg, num_envs=4) is None
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    assert "is not a critics file" in validate_sac(SACConfig(critics_from=str(tmp_path / "junk.pt")), num_envs=4)


def _policy_t2():
    spec = PolicySpec(state_dim=1, action_dim=1, action_low=[-1.0], action_high=[1.0])
    return MLPPolicy(MLPPolicyConfig(hidden_sizes=[32, 32], chunk_size=2, squash=True, normalize_obs=False,
                                     activation="relu"), spec)
