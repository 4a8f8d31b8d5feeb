"""EnvSpec and PolicySpec stay one idea in two packages (simulators and policies may not import each other)."""

import numpy as np


def test_env_and_policy_specs_declare_the_same_fields():
    """``simulators`` and ``policies`` may not import each other, so each declares its spec class; vlarl copies
    one into the other by field name, into the JSON types a checkpoint stores."""
    import dataclasses
    import json

    from policies.base import PolicySpec
    from simulators.base import ENV_ONLY_FIELDS, EnvSpec
    from vlarl.runner import policy_spec_from_env

    env_fields = [f.name for f in dataclasses.fields(EnvSpec) if f.name not in ENV_ONLY_FIELDS]
    assert env_fields == [f.name for f in dataclasses.fields(PolicySpec)]
    spec = EnvSpec(3, 2, np.array([-1.0, -0.5], dtype=np.float32), np.array([1.0, 0.5], dtype=np.float32),
                   ("base_camera",), (8, 8), 50, "PushCube-v1", "push the cube")
    got = policy_spec_from_env(spec)
    assert got == PolicySpec(3, 2, [-1.0, -0.5], [1.0, 0.5], ["base_camera"], [8, 8], 50, "PushCube-v1", "push the cube")
    assert json.loads(json.dumps(dataclasses.asdict(got))) == dataclasses.asdict(got)
