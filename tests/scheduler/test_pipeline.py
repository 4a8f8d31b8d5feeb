"""Stage routing: every env sub-batch gets its own actions back, in (step, stage) order, through real
Ray actors and real ManiSkill envs; the rollout worker builds the trajectory in global row order from
what it saw; staged env workers behave like unstaged ones."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import ray
import torch

from tests.helpers.recipes import PPO
from vlarl.config import load_train_config
from vlarl.data.builder import cat_results
from vlarl.data.trajectory import cat_obs
from vlarl.runner import policy_spec_from_env
from vlarl.scheduler.pipeline import EnvObs, StagedRollout, stage_rows, stage_to_global
from vlarl.scheduler.transport import from_wire
from vlarl.workers import EnvWorker, RolloutWorker


def test_stage_to_global_inverts_stage_rows():
    W, S, m = 2, 3, 2
    gid = torch.arange(W * S * m)
    parts = [torch.stack([gid[r] for k in range(W) for r in stage_rows(k, s, m, S)]) for s in range(S)]
    torch.testing.assert_close(stage_to_global(parts, W), gid)


def test_staged_env_worker_matches_unstaged():
    cfg = load_train_config([PPO]).env
    one, two = EnvWorker(cfg, 2, 0), EnvWorker(cfg, 2, 0, stages=2)
    try:
        o1, o2 = one.reset([7, 8]), two.reset([7, 8])
        torch.testing.assert_close(o1["state"], o2["state"], rtol=0, atol=0)
        a = torch.linspace(-1, 1, 2 * one.spec().action_dim).view(2, 1, -1)
        r1, r2 = one.chunk_step(a), two.chunk_step(a)
        torch.testing.assert_close(r1.obs["state"], r2.obs["state"], rtol=0, atol=0)
        torch.testing.assert_close(r1.rewards, r2.rewards, rtol=0, atol=0)
    finally:
        one.close()
        two.close()


@pytest.mark.heavy
@pytest.mark.parametrize("overlap", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_every_sub_batch_gets_its_own_actions_in_order(ray_local, overlap):
    cfg = load_train_config([PPO, "policy.hidden_sizes=[8]"])
    W, S, m, N = 2, 2, 1, 3
    envs = [ray.remote(EnvWorker).options(num_cpus=0.2).remote(cfg.env, S * m, k, 1, S) for k in range(W)]
    spec = policy_spec_from_env(ray.get(envs[0].spec.remote()))
    rollout = ray.remote(RolloutWorker).options(num_cpus=0.2).remote(cfg.policy, spec, 0)
    try:
        ray.get([e.record_actions.remote() for e in envs])
        obs = EnvObs([[e.reset.remote([10 * k + j for j in range(S * m)]) for k, e in enumerate(envs)]])
        pipe = StagedRollout(envs, rollout, S, overlap)
        records = list(pipe.run(obs, N))
        assert len(records) == N and all(r.ended.shape == (W * S * m,) for r in records)
        traj = pipe.finish(N).get()  # built on the rollout worker
        assert traj.num_steps == N and traj.num_envs == W * S * m
        for k, e in enumerate(envs):
            executed = ray.get(e.executed_actions.remote())
            assert [(t, s) for t, s, _ in executed] == [(t, s) for t in range(N) for s in range(S)]
            for t, s, a in executed:
                rows = list(stage_rows(k, s, m, S))
                torch.testing.assert_close(a, traj.replay["actions"][t][rows], rtol=0, atol=0)
                # the trajectory's rows of this sub-batch are the observations its reply ended on, in order
                if t + 1 < N:
                    reply = from_wire(ray.get(records[t].result_refs[s][k]))
                    torch.testing.assert_close(traj.obs["state"][t + 1][rows], reply.obs["state"], rtol=0, atol=0)
    finally:
        for a in [*envs, rollout]:
            ray.kill(a)


@ray.remote
class Event:
    """A one-shot event between Ray actors: ``wait`` returns once ``set`` has been called."""

    def __init__(self):
        self._set = asyncio.Event()

    async def set(self):
        self._set.set()

    async def wait(self):
        await self._set.wait()


@pytest.mark.heavy
def test_tail_values_are_each_stages_next_values_computed_as_that_stage_ends(ray_local):
    """The last record carries V(next obs) in global row order, equal to the rollout's value of the
    final observations; with overlap, stage 0's values do not wait for stage 1's last simulation: that
    simulation waits for the event "stage 0's values are computed" (sent by the rollout after them), so a
    pipeline that computed them only after it would leave the env waiting out its minute and then fail the
    order check, while a busy machine only delays both (no sleep decides the order)."""
    cfg = load_train_config([PPO, "policy.hidden_sizes=[8]"])
    W, S, m, N = 2, 2, 2, 2
    computed = Event.options(num_cpus=0).remote()

    class LateLastStage(EnvWorker):  # a real env worker whose last stage-1 step waits for stage 0's values
        def _step(self, stage, a, step):
            if stage == 1 and step == N - 1:
                with contextlib.suppress(ray.exceptions.GetTimeoutError):
                    ray.get(computed.wait.remote(), timeout=60.0)
            return super()._step(stage, a, step)

    class SignallingRollout(RolloutWorker):  # a real rollout worker that says when stage 0's tail is done
        def values_after(self, stage, step, *results, wait_only=0):
            out = super().values_after(stage, step, *results, wait_only=wait_only)
            if stage == 0:
                computed.set.remote()
            return out

    envs = [ray.remote(LateLastStage).options(num_cpus=0.2).remote(cfg.env, S * m, k, 1, S) for k in range(W)]
    spec = policy_spec_from_env(ray.get(envs[0].spec.remote()))
    rollout = ray.remote(SignallingRollout).options(num_cpus=0.2).remote(cfg.policy, spec, 0)
    try:
        obs = EnvObs([[e.reset.remote([10 * k + j for j in range(S * m)]) for k, e in enumerate(envs)]])
        ray.get([w.pop_spans.remote() for w in [*envs, rollout]])
        pipe = StagedRollout(envs, rollout, S, True)
        records = list(pipe.run(obs, N))
        traj = pipe.finish(N).get()
        last = from_wire([ray.get(refs) for refs in records[-1].result_refs])  # [S][W] replies of the last step
        final_obs = cat_obs([cat_results([last[s][k] for s in range(S)]).obs for k in range(W)])  # global order
        want = ray.get(rollout.value.remote(final_obs))
        assert traj.next_value.shape == (W * S * m,)
        torch.testing.assert_close(traj.next_value, want, rtol=1e-5, atol=1e-6)
        assert not traj.final_values[-1].any()  # no episode is truncated after 2 chunk steps
        spans = dict(ray.get([w.pop_spans.remote() for w in [*envs, rollout]]))
        value_s0 = next(e for e in spans["rollout"] if e[0] == "value" and e[3]["stage"] == 0)
        last_env_s1 = [e for w, ev in spans.items() if w.startswith("env") for e in ev
                       if e[0] == "env" and e[3].get("stage") == 1 and e[3].get("step") == N - 1]
        assert last_env_s1, spans.keys()
        assert value_s0[1] < min(e[1] for e in last_env_s1)  # before stage 1's last simulation began
    finally:
        for a in [*envs, rollout, computed]:
            ray.kill(a)
