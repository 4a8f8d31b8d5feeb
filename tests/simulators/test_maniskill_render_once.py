"""obs_mode=rgb renders the cameras once per chunk (``env.render_every_step=false``, the default) and returns
exactly what ManiSkill's every-step rendering returns (``env.render_every_step=true``): the same images bit for
bit, the same state, rewards, flags, episode metrics and ``final_obs``, across episodes that end inside a chunk
and their auto-resets, for both pixel envs (PushCube-RGB and the language task). A spy on the real camera's
``capture`` checks that the default renders once per chunk, so the equality is not that of one path with itself.

Each RGB scene costs 10-20 s to build on this CPU (the software renderer's first picture), so one scene per
mode and env."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.same_rollout import same_chunk_results, same_obs

pytest.importorskip("mani_skill")

MAX_STEPS, CHUNK, CHUNKS = 5, 3, 4  # episodes end at step 2 of chunks 2 and 4 (then auto-reset)
SEED = 3


def _env(name: str, every_step: bool):
    from simulators.registry import make_env
    from tests.helpers.recipes import PPO
    from vlarl import system_env
    from vlarl.config import load_train_config

    system_env.apply()
    cfg = load_train_config([PPO, f"env={name}", "env.image_size=32", f"env.max_episode_steps={MAX_STEPS}",
                             f"env.render_every_step={str(every_step).lower()}"]).env
    return make_env(cfg, num_envs=1)


class _CaptureCount:
    """Counts pictures taken by every sensor camera of scene 0 (wraps the real ``capture``)."""

    def __init__(self, env):
        self.n = 0
        for sensor in env.envs[0].unwrapped.scene.sensors.values():
            real = sensor.capture

            def counted(*a, _real=real, **kw):
                self.n += 1
                return _real(*a, **kw)

            sensor.capture = counted


def _run(env) -> tuple[dict, list, int]:
    """Reset, then CHUNKS chunks of seeded random actions (some outside the action box); returns the reset
    obs, each chunk's result and the pictures taken while stepping."""
    g = torch.Generator().manual_seed(0)
    obs = env.reset(seed=SEED)
    count = _CaptureCount(env)
    results = [env.chunk_step(torch.rand(1, CHUNK, env.spec.action_dim, generator=g) * 2.4 - 1.2)
               for _ in range(CHUNKS)]
    return obs, results, count.n


@pytest.mark.parametrize("name", ["maniskill_pushcube_rgb", "maniskill_pushcube_color_rgb"])
def test_render_once_per_chunk_equals_rendering_every_step(name):
    runs = {}
    for every_step in (True, False):
        env = _env(name, every_step)
        try:
            runs[every_step] = _run(env)
        finally:
            env.close()
    (obs0, ref, pictures_every), (obs1, got, pictures_once) = runs[True], runs[False]
    same_obs(obs0, obs1, "reset")
    ended = same_chunk_results(ref, got)
    finals = [r for r in ref if r.final_obs is not None]
    assert all(not torch.equal(r.final_obs["images"]["base_camera"], r.obs["images"]["base_camera"]) for r in finals)
    assert ended == 2  # two episodes ended inside a chunk (step 2 of 3) and were auto-reset
    # the images moved: the arm's random actions show in the camera from chunk to chunk
    frames = [obs0["images"]["base_camera"]] + [r.obs["images"]["base_camera"] for r in ref]
    assert all(not torch.equal(x, y) for x, y in zip(frames, frames[1:], strict=False))
    # ManiSkill renders inside each of the 10 control steps and at the 2 auto-resets; once per chunk renders at
    # the 4 chunk boundaries (the 2 that ended an episode: its final_obs) and the 2 auto-resets
    assert pictures_every == 2 * MAX_STEPS + 2
    assert pictures_once == CHUNKS + 2
