"""Processor steps: each one's map against the reference code it replaces (bit-equal), save/load, refusals."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from policies.ar_vla.openvla import ActionStatistics
from policies.base import CheckpointError, PolicySpec
from policies.flow_vla import pi0 as pi0_mod
from policies.flow_vla import smolvla as smolvla_mod
from policies.flow_vla.smolvla_checkpoint import Normalizer
from policies.processors import (
    CameraMap,
    FlipImages,
    ImageSize,
    ImagesToFloat,
    Normalize,
    PadVector,
    Processor,
    ProcessorMismatch,
    ProcessorStep,
    Prompt,
    ResizeWithPad,
    RunningNormalize,
    SignFlip,
    available_steps,
    register_step,
)


def _spec(state: int = 3, action: int = 2, cameras: tuple[str, ...] = ("base", "wrist"), size: int = 8) -> PolicySpec:
    return PolicySpec(state_dim=state, action_dim=action, action_low=[-1.0] * action, action_high=[1.0] * action,
                      image_keys=list(cameras), image_size=[size, size] if cameras else None)


def _batch(b: int = 4, size: int = 8, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"images": {k: torch.randint(0, 256, (b, size, size, 3), generator=g, dtype=torch.uint8)
                       for k in ("base", "wrist")},
            "state": torch.randn(b, 3, generator=g), "action": torch.randn(b, 5, 2, generator=g),
            "instruction": ["pick the cube"] * b}


def _stats(dim: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lo = torch.randn(dim, generator=g)
    hi = lo + torch.rand(dim, generator=g) + 0.1
    hi[0] = lo[0]  # a constant dim: the eps rule
    return {"mean": torch.randn(dim, generator=g), "std": torch.rand(dim, generator=g), "min": lo, "max": hi,
            "q01": lo, "q99": hi, "q10": lo, "q90": hi}


def _full_processor() -> Processor:
    g = torch.Generator().manual_seed(3)
    return Processor([
        FlipImages(cameras=["wrist"]),
        CameraMap.fit(["observation.images.wrist", "observation.images.base", "observation.images.left"],
                      ["base", "wrist"]),
        ImagesToFloat(),
        ResizeWithPad(size=6, align="left_top"),
        Normalize.from_stats("state", "quantiles", {"q01": -torch.rand(3, generator=g), "q99": torch.rand(3, generator=g)}),
        PadVector("state", 3, 8),
        Normalize.from_bounds("action", [-2.0, -1.0], [2.0, 3.0], eps=1e-8, mask=[True, False], precision="float64"),
        SignFlip("action", [1]),
        PadVector("action", 2, 4),
        Prompt("In: {instruction}?", lower=True),
    ])


# -- the maps, against the code they replace -------------------------------------------------------------
@pytest.mark.parametrize("mode", ["MEAN_STD", "QUANTILES", "QUANTILE10", "MIN_MAX", "IDENTITY"])
def test_normalize_is_bit_equal_to_lerobot_normalizer(mode):
    stats = _stats(5, seed=1)
    ref = Normalizer(mode, {} if mode == "IDENTITY" else stats)
    step = Normalize.from_stats("state", mode, stats if mode != "IDENTITY" else {"mean": stats["mean"]})
    x = torch.randn(7, 5) * 3
    assert torch.equal(step.normalize(x), ref.normalize(x))
    assert torch.equal(step.unnormalize(x), ref.unnormalize(x))


def test_bounds_with_mask_in_float64_is_bit_equal_to_openvla_statistics():
    entry = {k: v.tolist() for k, v in _stats(4, seed=2).items()}
    entry["mask"] = [True, True, False, True]
    ref = ActionStatistics.from_entry(entry, "bounds_q99", eps=1e-8)
    step = Normalize.from_bounds("action", ref.low, ref.high, eps=1e-8, mask=ref.mask, precision="float64")
    y = torch.rand(6, 3, 4) * 2.4 - 1.2
    assert torch.equal(step.unnormalize(y), ref.unnormalize(y))
    proprio = Normalize.from_bounds("state", ref.low, ref.high, eps=1e-8, mask=ref.mask, precision="float64", clip=1.0)
    x = torch.randn(6, 4) * 2
    assert torch.equal(proprio.normalize(x), ref.normalize(x))


def test_running_normalize_folds_batches_into_the_population_statistics():
    step = RunningNormalize("state", 3, clip=5.0)
    g = torch.Generator().manual_seed(4)
    data = [torch.randn(16, 3, generator=g) * 4 + 2 for _ in range(3)]
    for x in data:
        Processor([step]).update({"state": x})
    every = torch.cat(data)
    assert float(step.count) == pytest.approx(48 + 1e-4)
    torch.testing.assert_close(step.mean, every.mean(0), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(step.var, every.var(0, unbiased=False), rtol=1e-3, atol=1e-3)
    x = torch.randn(5, 3, generator=g) * 10
    want = ((x - step.mean) / torch.sqrt(step.var + 1e-8)).clamp(-5.0, 5.0)
    assert torch.equal(step({"state": x})["state"], want) and step({"state": x})["state"].abs().max() <= 5.0


@pytest.mark.parametrize(("module", "align", "pad", "only"), [(pi0_mod, "center", -1.0, True),
                                                             (smolvla_mod, "left_top", 0.0, False)])
def test_resize_with_pad_is_bit_equal_to_the_networks_own(module, align, pad, only):
    img = torch.rand(2, 3, 12, 7)
    step = ResizeWithPad(size=10, align=align, pad_value=pad, only_if_needed=only)
    assert torch.equal(step.resize(img), module.prepare_image(img, 10))
    same = torch.rand(2, 3, 10, 10)
    assert torch.equal(step.resize(same), module.prepare_image(same, 10))


def test_images_to_float_is_the_adapters_scaling_and_refuses_float_images():
    img = torch.randint(0, 256, (2, 5, 6, 3), dtype=torch.uint8)
    out = ImagesToFloat()({"images": {"base": img}})["images"]["base"]
    assert torch.equal(out, img.permute(0, 3, 1, 2).float() / 255.0)
    with pytest.raises(ValueError, match="needs uint8"):
        ImagesToFloat()({"images": {"base": img.float()}})


def test_flip_and_sign_flip_are_their_own_inverse():
    b = _batch()
    flipped = FlipImages(cameras=["wrist"])(b)
    assert torch.equal(flipped["images"]["wrist"], b["images"]["wrist"].flip(1, 2))
    assert flipped["images"]["base"] is b["images"]["base"]
    s = SignFlip("action", [1])
    out = s(b)["action"]
    assert torch.equal(out[..., 0], b["action"][..., 0]) and torch.equal(out[..., 1], -b["action"][..., 1])
    assert torch.equal(s.inverse({"action": out})["action"], b["action"])


# -- cameras ----------------------------------------------------------------------------------------------
def test_camera_map_by_name_then_in_order_with_masked_blanks():
    by_name = CameraMap.fit(["observation.images.wrist", "observation.images.top"], ["base", "wrist"])
    assert by_name.sources == ["wrist", ""]
    out = by_name(_batch())
    assert list(out["images"]) == ["wrist", "top"]  # fed cameras first, then the blank ones (LeRobot's order)
    assert torch.equal(out["images"]["wrist"], _batch()["images"]["wrist"])
    assert not out["images"]["top"].any() and not out["image_masks"]["top"].any() and out["image_masks"]["wrist"].all()
    in_order = CameraMap.fit(["cam_high", "cam_low", "cam_left"], ["base", "wrist"])
    assert in_order.sources == ["base", "wrist", ""] and in_order.fed == ["base", "wrist"] and in_order.blank == 1
    with pytest.raises(ProcessorMismatch, match="add cameras to env.cameras"):
        CameraMap.fit(["a", "b"], [], min_present=1)


def test_camera_map_refuses_an_env_without_its_camera():
    step = CameraMap(cameras=["front", "wrist"], sources=["base", "wrist"])
    step.check(_spec())
    with pytest.raises(ProcessorMismatch, match=r"expects camera\(s\) \['wrist'\] that the env does not render"):
        step.check(_spec(cameras=("base",)))


# -- vectors and sizes ------------------------------------------------------------------------------------
def test_pad_vector_pads_in_and_cuts_out():
    step = PadVector("action", 2, 4)
    a = torch.randn(3, 5, 2)
    padded = step({"action": a})["action"]
    assert padded.shape == (3, 5, 4) and torch.equal(padded[..., :2], a) and not padded[..., 2:].any()
    assert torch.equal(step.inverse({"action": padded})["action"], a)


def test_checks_refuse_dims_and_sizes_the_env_does_not_have():
    with pytest.raises(ProcessorMismatch, match=r"state dim 9 exceeds the network's padding max_state_dim=8"):
        PadVector("state", 3, 8).check(_spec(state=9))
    with pytest.raises(ProcessorMismatch, match="pads a state of 3 dims but the env's has 4"):
        PadVector("state", 3, 8).check(_spec(state=4))
    with pytest.raises(ProcessorMismatch, match="max_action_dim=4"):
        PadVector("action", 6, 4)
    with pytest.raises(ProcessorMismatch, match="fixed action statistics have 2 dims but the env's action has 7"):
        Normalize.from_bounds("action", [-1, -1], [1, 1]).check(_spec(action=7))
    with pytest.raises(ProcessorMismatch, match="needs 224x224 images but the env renders 8x8; set env.image_size=224"):
        ImageSize(224, 224).check(_spec())
    ImageSize(8, 8).check(_spec())
    with pytest.raises(ValueError, match=r"needs uint8 \[B, 8, 8, 3\]"):
        ImageSize(8, 8)({"images": {"base": torch.zeros(1, 8, 8, 3)}})
    with pytest.raises(ProcessorMismatch, match="flips action dims"):
        SignFlip("action", [5]).check(_spec())


def test_prompt_repeats_instructions_and_uses_the_default():
    out = Prompt("In: {instruction}?", lower=True)({"state": torch.zeros(3, 1), "instruction": ["Pick", "Place"]})
    assert out["prompt"] == ["In: pick?", "In: place?", "In: pick?"]
    assert Prompt(default="idle", newline=True)({"state": torch.zeros(2, 1)})["prompt"] == ["idle\n", "idle\n"]


# -- the whole processor, saved and loaded ---------------------------------------------------------------
def test_processor_round_trip_through_files_gives_the_same_outputs(tmp_path):
    proc = _full_processor()
    proc.check(_spec())
    b = _batch()
    out = proc(b)
    assert list(out["images"]) == ["wrist", "base", "left"] and out["images"]["wrist"].shape == (4, 3, 6, 6)
    assert out["state"].shape == (4, 8) and out["action"].shape == (4, 5, 4) and out["prompt"][0] == "In: pick the cube?"
    assert torch.allclose(proc.inverse({"action": out["action"]})["action"], b["action"], atol=1e-6)
    proc.save(tmp_path)
    saved = json.loads((tmp_path / "processor.json").read_text())
    assert [s["type"] for s in saved["steps"]] == ["flip_images", "camera_map", "images_to_float", "resize_with_pad",
                                                   "normalize", "pad_vector", "normalize", "sign_flip", "pad_vector",
                                                   "prompt"]
    loaded = Processor.load(tmp_path)
    again = loaded(b)
    for k in ("state", "action"):
        assert torch.equal(again[k], out[k])
    for cam in out["images"]:
        assert torch.equal(again["images"][cam], out["images"][cam])
    assert torch.equal(loaded.inverse({"action": out["action"]})["action"], proc.inverse({"action": out["action"]})["action"])
    assert loaded.find(Normalize, "action").mask.tolist() == [True, False]


def test_statistics_from_another_processor_are_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    Processor([Normalize.from_stats("state", "mean_std", {"mean": [0.0, 1.0], "std": [1.0, 1.0]})]).save(a)
    Processor([Normalize.from_stats("state", "quantiles", {"q01": [0.0, 1.0], "q99": [1.0, 2.0]})]).save(b)
    (a / "processor.safetensors").write_bytes((b / "processor.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="statistics belong to another processor"):
        Processor.load(a)
    (b / "processor.json").unlink()
    with pytest.raises(CheckpointError, match="has no processor.json"):
        Processor.load(b)


def test_unknown_steps_and_fields_are_refused(tmp_path):
    Processor([SignFlip("action", [0])]).save(tmp_path)
    for bad, msg in (({"type": "no_such_step"}, "'no_such_step' is not registered"),
                     ({"type": "sign_flip", "dimz": [0]}, r"has no fields \['dimz'\]")):
        cfg = json.dumps({"format": 1, "steps": [bad]})
        (tmp_path / "processor.json").write_text(cfg)
        from safetensors.torch import save_file

        save_file({}, str(tmp_path / "processor.safetensors"), metadata={"config": cfg})
        with pytest.raises(CheckpointError, match=msg):
            Processor.load(tmp_path)


def test_a_step_registered_from_outside_round_trips(tmp_path):
    @register_step("test_offset")
    @dataclass(eq=False)
    class Offset(ProcessorStep):
        key: str = "state"
        dim: int = 0

        def __post_init__(self) -> None:
            super().__post_init__()
            self.register_buffer("offset", torch.zeros(self.dim))

        def forward(self, batch):
            return {**batch, self.key: batch[self.key] + self.offset}

    step = Offset("state", 3)
    step.offset.copy_(torch.tensor([1.0, 2.0, 3.0]))
    Processor([step]).save(tmp_path)
    assert "test_offset" in available_steps()
    out = Processor.load(tmp_path)({"state": torch.zeros(1, 3)})["state"]
    assert out.tolist() == [[1.0, 2.0, 3.0]]
    with pytest.raises(TypeError, match="eq=False"):
        @register_step("test_hashless")
        @dataclass
        class Hashless(ProcessorStep):
            pass


def test_statistics_travel_in_the_owner_state_dict():
    owner = torch.nn.Module()
    owner.processor = Processor([RunningNormalize("state", 2)])
    assert sorted(owner.state_dict()) == ["processor.steps.0.count", "processor.steps.0.mean", "processor.steps.0.var"]
