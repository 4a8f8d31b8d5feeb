"""assets/: the task metadata the project keeps there is what the simulator modules register."""

from __future__ import annotations

import pytest

from simulators.assets import assets_dir, load_json
from simulators.base import EnvError
from simulators.registry import registered_suites


def test_simulator_modules_register_their_suites_from_assets():
    libero = load_json("tasks/libero_suites.json")
    maniskill = load_json("tasks/maniskill_suites.json")
    suites = registered_suites()
    for name, data in libero.items():
        assert suites[name]["env"] == "libero" and suites[name]["max_episode_steps"] == data["max_episode_steps"]
        assert suites[name]["env_overrides"] == {"task": name}
    for name, data in maniskill.items():
        assert suites[name]["env"] == "maniskill" and suites[name]["tasks"] == data["tasks"]
    from simulators.libero import SUITE_MAX_STEPS  # the env's own step limits come from the same file

    assert SUITE_MAX_STEPS == {name: data["max_episode_steps"] for name, data in libero.items()}
    assert (assets_dir() / "README.md").is_file()


def test_a_missing_asset_is_one_line_naming_it():
    with pytest.raises(EnvError, match=r"assets/tasks/nope.json is missing"):
        load_json("tasks/nope.json")
