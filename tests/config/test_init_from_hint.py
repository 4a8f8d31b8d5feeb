"""``init_from`` refused for a policy built otherwise than the checkpoint names the overrides that rebuild it. The
OFT's ``arch`` is a free-form dict the command line names only in part, so a key the checkpoint sets and the command
line leaves out (``use_film``) must come back as a ``+policy...`` override with the built policy's value beside it."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("mani_skill")

TASK = "PushCubeToColor-v1"


def _tiny_oft(*more: str):
    from vlarl.experiments import training_policy

    return training_policy(["experiment=multitask_oft_sft_rl", f"env.tasks=[{TASK}]", "env.image_size=32", *more], 0)


def test_a_film_checkpoint_into_a_plain_config_names_the_plus_override(tmp_path):
    from policies.base import CheckpointError
    from vlarl.init_from import load_init_weights

    _, spec, film = _tiny_oft("+policy.arch.use_film=true")
    film_keys = [k for k in film.state_dict() if k.count(".") and k.split(".")[-2] in ("scale", "shift")]
    with torch.no_grad():  # distinctive FiLM maps (they start at zero, as any fresh build's do)
        for k in film_keys:
            film.state_dict()[k].fill_(0.25)
    film.save_pretrained(tmp_path / "film")
    plain_cfg, _, _ = _tiny_oft()
    with pytest.raises(CheckpointError) as err:
        load_init_weights(tmp_path / "film", plain_cfg.policy, spec)
    message = str(err.value)
    assert "differing keys: +policy.arch.use_film=true (now: false)" in message, message
    assert "\n" not in message
    # with the override the same checkpoint loads, and its FiLM maps come with it
    film_cfg, _, _ = _tiny_oft("+policy.arch.use_film=true")
    state = load_init_weights(tmp_path / "film", film_cfg.policy, spec)
    assert film_keys and all(torch.all(state[k] == 0.25) for k in film_keys)


def test_a_key_mismatch_with_equal_configs_is_named_by_its_first_keys():
    from vlarl.init_from import _key_difference

    net = torch.nn.Linear(2, 2)
    extra = {"weight": torch.zeros(2, 2), "head.a": torch.zeros(1), "head.b": torch.zeros(1), "head.c": torch.zeros(1)}
    with pytest.raises(RuntimeError) as err:
        net.load_state_dict(extra)
    assert _key_difference(err.value) == "missing key(s) bias; unexpected key(s) head.a, head.b and 1 more"
