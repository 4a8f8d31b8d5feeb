"""``scripts/pushcube_diffusion_dsrl.py --base DIR``: DSRL around a policy directory the user already has. A
directory that is not a saved policy is refused in one line before anything is written, and (slow) the whole path
evaluates the base, trains with the base's chunk, evaluates again and checks the base bit-identical. (That the
steering takes its chunk from the base is tested on the policy: ``tests/algorithms/test_dsrl.py``.)"""

from __future__ import annotations

import json

import pytest
import torch

from scripts.pushcube_diffusion_dsrl import main
from tests.helpers.recipes import PPO

torch.set_num_threads(1)


def test_a_directory_that_is_not_a_saved_policy_is_refused_before_anything_is_written(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(out), "--base", str(tmp_path / "empty")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert str(tmp_path / "empty") in err and "save_pretrained" in err
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.sim
def test_dsrl_around_a_given_base_trains_and_leaves_the_base_bit_identical(tmp_path):
    from dataclasses import asdict

    import yaml

    from policies.registry import make_policy
    from scripts.pushcube_diffusion_dsrl import SFT_OVERRIDES
    from simulators.registry import make_env
    from vlarl.checkpoint import ENV_CONFIG_NAME
    from vlarl.config import load_train_config
    from vlarl.runner import policy_spec_from_env

    # an untrained diffusion policy for PushCube's spaces, saved as the SFT stage saves one, with chunk 3 where the
    # SFT stage's is 4
    cfg = load_train_config([PPO, *SFT_OVERRIDES, "policy.chunk_size=3"])
    probe = make_env(cfg.env, num_envs=1)
    spec = policy_spec_from_env(probe.spec)
    probe.close()
    torch.manual_seed(0)
    base = tmp_path / "base"
    make_policy(cfg.policy, spec).save_pretrained(base)
    (base / ENV_CONFIG_NAME).write_text(json.dumps(asdict(cfg.env)))
    out = tmp_path / "out"
    assert main(["--out", str(out), "--base", str(base), "--eval-episodes", "2", "--eval-envs", "1", "--",
                 "total_env_steps=256", "env.num_envs=2", "algorithm.learning_starts=8", "eval.episodes=2"]) == 0
    res = json.loads((out / "result.json").read_text())
    assert res["sft"] == {"base": str(base.resolve())}
    assert res["sft_eval"]["episodes"] == 2 and res["rl_eval"]["episodes"] == 2
    assert res["rl"]["env_steps"] >= 256
    assert res["frozen"]["bit_identical"] and res["frozen"]["tensors"] > 0
    assert yaml.safe_load((out / "dsrl" / "config.yaml").read_text())["policy"]["chunk_size"] == 3
