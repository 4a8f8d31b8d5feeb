"""A run started from saved weights is told when RL would keep re-estimating the saved policy's state statistics."""

from dataclasses import replace

from policies.ar_vla.openvla_config import OpenVLAOFTPolicyConfig
from policies.mlp import MLPPolicyConfig
from vlarl.runner import init_from_note


def test_init_from_with_running_state_statistics_gets_a_note_naming_the_fix():
    drifting = OpenVLAOFTPolicyConfig(freeze_state_norm=False)  # the config object the runner holds
    note = init_from_note(drifting, "outputs/sft")
    assert note is not None and "init_from=outputs/sft" in note and "set policy.freeze_state_norm=true" in note
    assert init_from_note(replace(drifting, freeze_state_norm=True), "outputs/sft") is None
    assert init_from_note(drifting, "") is None  # a fresh policy's statistics are the rollouts' own
    assert init_from_note(MLPPolicyConfig(), "outputs/sft") is None  # a family without the key
