import pytest
import torch

from vlarl.algorithms import bootstrap_truncated, compute_gae, normalize_advantages


def test_gae_matches_hand_computation():
    # one env, three steps, episode ends (terminated) at step 1
    r = torch.tensor([[1.0], [2.0], [3.0]])
    v = torch.tensor([[0.5], [1.0], [1.5]])
    d = torch.tensor([[0.0], [1.0], [0.0]])
    nv = torch.tensor([2.0])
    g, lam = 0.9, 0.8
    # by hand:
    d2 = 3.0 + 0.9 * 2.0 - 1.5  # 3.3
    a2 = d2
    d1 = 2.0 + 0.0 - 1.0  # done: no bootstrap -> 1.0
    a1 = d1  # done: no carry
    d0 = 1.0 + 0.9 * 1.0 - 0.5  # 1.4
    a0 = d0 + 0.9 * 0.8 * a1  # 1.4 + 0.72 = 2.12
    adv, ret = compute_gae(r, v, d, nv, g, lam)
    assert adv[:, 0].tolist() == pytest.approx([a0, a1, a2])
    assert ret[:, 0].tolist() == pytest.approx([a0 + 0.5, a1 + 1.0, a2 + 1.5])


def test_gae_lambda_one_is_discounted_return_minus_value():
    r = torch.tensor([[1.0], [1.0], [1.0]])
    v = torch.zeros(3, 1)
    d = torch.zeros(3, 1)
    adv, _ = compute_gae(r, v, d, torch.tensor([10.0]), gamma=0.5, gae_lambda=1.0)
    # G0 = 1 + .5 + .25 + .125 * 10
    assert adv[0, 0].item() == pytest.approx(1 + 0.5 + 0.25 + 0.125 * 10)


def test_bootstrap_truncated_adds_discounted_final_value_only_where_truncated():
    r = torch.tensor([[1.0, 1.0]])
    tr = torch.tensor([[1.0, 0.0]])
    fv = torch.tensor([[4.0, 100.0]])
    out = bootstrap_truncated(r, tr, fv, gamma=0.5)
    assert out.tolist() == [[3.0, 1.0]]


def test_normalize_advantages_global():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    n = normalize_advantages(a)
    assert n.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert n.std().item() == pytest.approx(1.0, abs=1e-4)


def test_gae_all_done_batch_is_one_step_td():
    # every step terminates: no bootstrap, no carry -> A = r - V, whatever gamma/lambda/next_value
    r = torch.tensor([[1.0, 0.0], [2.0, -1.0]])
    v = torch.tensor([[0.5, 0.25], [1.0, 0.0]])
    d = torch.ones(2, 2)
    adv, ret = compute_gae(r, v, d, torch.tensor([100.0, 100.0]), gamma=0.99, gae_lambda=0.95)
    assert torch.allclose(adv, r - v)
    assert torch.allclose(ret, r)


def test_truncation_mid_chunk_bootstraps_but_termination_does_not():
    # PPO's compute_advantages: env 0 truncated (time limit) at step 0, env 1 terminated at step 0.
    from vlarl.algorithms.ppo import compute_advantages
    from vlarl.data.trajectory import Trajectory

    N, B = 2, 2
    traj = Trajectory(
        obs={"state": torch.zeros(N, B, 1), "images": {}, "instruction": []}, replay={},
        logprob=torch.zeros(N, B, 2, 1), values=torch.tensor([[1.0, 1.0], [2.0, 2.0]]),
        rewards=torch.tensor([[1.0, 1.0], [0.0, 0.0]]),
        dones=torch.tensor([[0.0, 1.0], [0.0, 0.0]]), truncated=torch.tensor([[1.0, 0.0], [0.0, 0.0]]),
        final_values=torch.tensor([[4.0, 4.0], [0.0, 0.0]]), next_value=torch.tensor([3.0, 3.0]),
    )
    g, lam = 0.5, 0.9
    adv, _ = compute_advantages(traj, g, lam)
    # step 1 (both envs, fresh episode): delta = 0 + .5 * 3 - 2 = -0.5
    assert adv[1].tolist() == pytest.approx([-0.5, -0.5])
    # env 0 step 0: r + g * V(final_obs) - V = 1 + 2 - 1 = 2, no carry across the reset
    # env 1 step 0: terminated: r - V = 0, no bootstrap from final_values
    assert adv[0].tolist() == pytest.approx([2.0, 0.0])


def test_normalize_advantages_masked_padding_is_ignored_and_untouched():
    a = torch.tensor([1.0, 3.0, 1000.0])
    m = torch.tensor([True, True, False])
    n = normalize_advantages(a, mask=m)
    # mean 2, unbiased std sqrt(2)
    assert n[:2].tolist() == pytest.approx([-1 / 2**0.5, 1 / 2**0.5], rel=1e-5)
    assert n[2].item() == 1000.0


def _norm_worker(rank: int, path: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    local = torch.tensor([1.0, 2.0]) if rank == 0 else torch.tensor([3.0, 4.0, 5.0, 6.0])
    torch.save(normalize_advantages(local), f"{out}.{rank}")
    dist.destroy_process_group()


def test_normalize_advantages_is_global_across_ranks(tmp_path):
    """Two gloo ranks with different batch sizes normalize with the statistics of all 6 values."""
    import torch.multiprocessing as mp

    out = str(tmp_path / "adv")
    mp.start_processes(_norm_worker, args=(str(tmp_path / "rdzv"), out), nprocs=2, join=True, start_method="fork")
    both = torch.cat([torch.load(f"{out}.0"), torch.load(f"{out}.1")])
    full = torch.arange(1.0, 7.0)
    assert both.tolist() == pytest.approx(((full - full.mean()) / full.std()).tolist(), rel=1e-5)


def test_grouped_normalization_puts_each_group_on_its_own_scale():
    """Two tasks' advantages on different scales (PullCube's near 10, the language task's near 0): per group each is
    zero-mean unit-std, where the batch statistics leave the small task all below zero."""
    a = torch.tensor([10.0, 12.0, 0.1, 0.3, 14.0, 0.2])
    groups = ["pull", "pull", "words", "words", "pull", "words"]
    n = normalize_advantages(a, groups=groups)
    for g in ("pull", "words"):
        x = n[[i for i, k in enumerate(groups) if k == g]]
        assert x.mean().item() == pytest.approx(0.0, abs=1e-6)
        assert x.std().item() == pytest.approx(1.0, rel=1e-5)
    whole = normalize_advantages(a)
    assert (whole[[2, 3, 5]] < 0).all() and n[3].item() > 0


def test_grouped_normalization_keeps_masked_entries_and_broadcasts_over_actions():
    a = torch.tensor([[1.0, 3.0], [5.0, 1000.0], [-2.0, 2.0]])
    m = torch.tensor([[True, True], [True, False], [True, True]])
    n = normalize_advantages(a, mask=m, groups=["x", "x", "y"])
    assert n[1, 1].item() == 1000.0
    assert n[:2][m[:2]].tolist() == pytest.approx([-1.0, 0.0, 1.0], rel=1e-5)  # 1, 3, 5: mean 3, std 2
    assert n[2].tolist() == pytest.approx([-2 / 8**0.5, 2 / 8**0.5], rel=1e-5)
    with pytest.raises(ValueError, match="3 group keys for 2 rows"):
        normalize_advantages(a[:2], groups=["x", "x", "y"])


def _grouped_norm_worker(rank: int, path: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    # rank 1 has no row of group "b": its statistics come from rank 0 alone
    local, groups = ((torch.tensor([1.0, 2.0, 10.0]), ["a", "a", "b"]) if rank == 0 else
                     (torch.tensor([3.0, 4.0]), ["a", "a"]))
    torch.save(normalize_advantages(local, groups=groups), f"{out}.{rank}")
    dist.destroy_process_group()


def test_grouped_normalization_is_global_across_ranks(tmp_path):
    import torch.multiprocessing as mp

    out = str(tmp_path / "adv")
    mp.start_processes(_grouped_norm_worker, args=(str(tmp_path / "rdzv"), out), nprocs=2, join=True,
                       start_method="fork")
    r0, r1 = torch.load(f"{out}.0"), torch.load(f"{out}.1")
    a = torch.arange(1.0, 5.0)
    za = (a - a.mean()) / a.std()
    assert torch.cat([r0[:2], r1]).tolist() == pytest.approx(za.tolist(), rel=1e-5)
    assert r0[2].item() == pytest.approx(0.0, abs=1e-6)  # one value: its mean
