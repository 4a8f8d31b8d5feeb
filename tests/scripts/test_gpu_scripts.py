"""The GPU scripts on a CPU machine: the wheel list, the device-side install logic (dry run), the VLA
memory bench on tiny configs (meta-device counts against a hand count) and the ManiSkill bench at one scene."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[2]
torch.set_num_threads(1)


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


# ---- scripts/gpu/prepare_wheels.sh ---------------------------------------------------------------------
def test_wheel_list_is_what_the_gpu_image_lacks():
    out = subprocess.run(["bash", str(ROOT / "scripts/gpu/prepare_wheels.sh"), "--dry-run"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, env={**os.environ, "VLARL_PYTHON": sys.executable})
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("[wheels] requirements:"))
    names = {r.split(">")[0].split("=")[0].split("[")[0] for r in line.split(":", 1)[1].split()}
    assert {"ray", "mani-skill", "hydra-core", "omegaconf", "diffusers", "gymnasium"} <= names
    assert not names & {"torch", "transformers", "peft", "numpy", "safetensors", "pytest", "ruff"}


# ---- scripts/gpu/run_gpu_tests.sh --dry-run --------------------------------------------------------------
def _batches(tmp_path: Path) -> tuple[Path, bytes, bytes]:
    """gpu_wheels/ as prepare_wheels.sh writes it: a.whl cut in two parts across b1/b2, b.whl whole in b2."""
    a, b = os.urandom(3000), os.urandom(500)
    wheels = tmp_path / "gpu_wheels"
    manifest = "".join(f"{n} {p} {hashlib.sha256(d).hexdigest()}\n" for n, p, d in [("a.whl", 2, a), ("b.whl", 1, b)])
    for batch, files in {"b1": {"a.whl.part00": a[:2000]}, "b2": {"a.whl.part01": a[2000:], "b.whl": b}}.items():
        (wheels / batch).mkdir(parents=True)
        (wheels / batch / "MANIFEST").write_text(manifest)
        for n, d in files.items():
            (wheels / batch / n).write_bytes(d)
    return wheels, a, b


def _run_dry(wheels: Path, stash: Path, tmp_path: Path, step: str = "all"):
    env = {**os.environ, "VLARL_WHEEL_DIR": str(wheels), "VLARL_STASH": str(stash),
           "VLARL_SITE": str(tmp_path / "site"), "OUT": str(tmp_path / "out")}
    return subprocess.run(["bash", str(ROOT / "scripts/gpu/run_gpu_tests.sh"), "--dry-run", step], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env=env)


def test_run_gpu_tests_dry_run_joins_batches_then_lists_the_runs(tmp_path):
    wheels, a, b = _batches(tmp_path)
    stash = tmp_path / "stash"
    # first call: only b1 carried -> a.whl is not whole yet, nothing is tested
    (wheels / "b2").rename(tmp_path / "b2_later")
    first = _run_dry(wheels, stash, tmp_path)
    assert first.returncode == 3, first.stdout + first.stderr
    assert "a.whl (1 of 2 parts)" in first.stdout and "b.whl" in first.stdout and "[dry-run]" not in first.stdout
    # next call: b2 carried (b1 is gone from the tree; the stash kept its part)
    (wheels / "b1").rename(tmp_path / "b1_done")
    (tmp_path / "b2_later").rename(wheels / "b2")
    second = _run_dry(wheels, stash, tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert (stash / "a.whl").read_bytes() == a and (stash / "b.whl").read_bytes() == b
    assert not list(stash.glob("*.part*"))
    pip = next(x for x in second.stdout.splitlines() if x.startswith("[dry-run]") and "--no-deps" in x and ".whl" in x)
    assert str(stash / "a.whl") in pip and str(stash / "b.whl") in pip and "--target" in pip
    runs = [x for x in second.stdout.splitlines() if x.startswith("[dry-run]") and "pytest" in x]
    for want in ("-m gpu", "tests/simulators/test_maniskill_gpu.py", "tests/simulators/test_contract.py -k maniskill",
                 "tests/scheduler/test_placement.py tests/workers/test_weight_sync.py"):
        assert any(want in r for r in runs), (want, runs)


def test_run_gpu_tests_refuses_a_broken_copy_and_a_bad_step(tmp_path):
    wheels, _, _ = _batches(tmp_path)
    (wheels / "b2" / "b.whl").write_bytes(b"truncated")
    out = _run_dry(wheels, tmp_path / "stash", tmp_path)
    assert out.returncode == 3 and "b.whl: sha256 differs" in out.stderr
    bad = _run_dry(wheels, tmp_path / "stash", tmp_path, step="everything")
    assert bad.returncode == 2 and "unknown step 'everything'" in bad.stderr


# ---- scripts/bench_vla_memory.py -------------------------------------------------------------------------
def test_meta_device_count_matches_a_hand_count_of_tiny_smolvla():
    bench = _script("bench_vla_memory")
    row = next(r for r in bench.ROWS if r.name == "smolvla")
    build = bench.model_builder(row, tiny=True)
    meta, _ = bench.build_on_meta(build)
    assert all(p.is_meta for p in meta.parameters())
    total, trainable = bench.count_parameters(meta)
    # by hand, from tiny_config(): VLM width 64, expert width 0.75 x 64 = 48, state/action padded to 8,
    # vocabulary 300
    heads = {"state_proj": 8 * 64 + 64, "action_in_proj": 8 * 48 + 48, "action_out_proj": 48 * 8 + 8,
             "action_time_mlp_in": 2 * 48 * 48 + 48, "action_time_mlp_out": 48 * 48 + 48}
    for name, n in heads.items():
        assert bench.count_parameters(getattr(meta, name))[0] == n, name
    assert bench.count_parameters(meta.vlm_with_expert.vlm.model.text_model.embed_tokens)[0] == 300 * 64
    real = build()  # the same model with memory: the meta count misses nothing
    assert (total, trainable) == bench.count_parameters(real)
    assert total == sum(p.numel() for p in real.parameters())
    assert trainable == sum(p.numel() for p in real.parameters() if p.requires_grad) < total


def test_vla_memory_tiny_table_times_chunk_and_both_updates(capsys):
    bench = _script("bench_vla_memory")
    assert bench.main(["--tiny", "--time", "--update", "--batch", "2", "--models", "smolvla", "pi0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("device: CPU") and "sizes: tiny" in out
    rows = [x.split() for x in out.splitlines() if x.startswith("smolvla ")]
    assert [r[7] for r in rows] == ["lora", "full"], out
    assert "error" not in out, out
    lora, full = rows
    assert 0 < int(lora[8].replace(",", "")) < int(full[8].replace(",", "")) == int(full[2].replace(",", ""))
    assert float(lora[6]) > 0 and float(lora[9]) > 0 and float(full[9]) > 0
    pi0 = next(x for x in out.splitlines() if x.startswith("pi0 "))
    if importlib.util.find_spec("policies.flow_vla.pi0") is None:  # a row whose module has not landed
        assert "skipped: module policies.flow_vla.pi0 does not exist yet" in pi0
    else:
        assert "error" not in pi0 and "skipped" not in pi0, pi0


def test_vla_memory_grad_ckpt_goes_through_the_model_config(capsys):
    bench = _script("bench_vla_memory")
    assert bench.main(["--tiny", "--update", "--grad-ckpt", "--batch", "2", "--models", "smolvla"]) == 0
    rows = [x for x in capsys.readouterr().out.splitlines() if x.startswith("smolvla ")]
    assert len(rows) == 2 and all(r.endswith("grad-ckpt: by its config") for r in rows), rows
    built = bench.model_builder(next(r for r in bench.ROWS if r.name == "smolvla"), tiny=True, grad_ckpt=True)()
    assert built.vlm_with_expert.gradient_checkpointing


HOOKED = '''
from dataclasses import dataclass
import torch
from torch import nn

@dataclass
class TinyARConfig:
    vocab: int = 11
    width: int = 6

def tiny_config():
    return TinyARConfig()

class TinyAR(nn.Module):
    def __init__(self, cfg: TinyARConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.width)
        self.q_proj = nn.Linear(cfg.width, cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab)

def bench_chunk(model, batch, device, dtype):
    return model.head(model.q_proj(model.embed(torch.zeros(batch, 3, dtype=torch.long, device=device)))).argmax(-1)

def bench_logprob(model, batch, device, dtype):
    logits = model.head(model.q_proj(model.embed(torch.ones(batch, 3, dtype=torch.long, device=device))))
    return logits.log_softmax(-1)[..., 2].sum(-1)
'''


def test_vla_memory_drives_a_module_through_its_bench_hooks(tmp_path, monkeypatch):
    """An autoregressive VLA brings its own prompt and decoding: bench_chunk / bench_logprob in its module."""
    (tmp_path / "tiny_ar_vla.py").write_text(HOOKED)
    monkeypatch.syspath_prepend(str(tmp_path))
    bench = _script("bench_vla_memory")
    args = bench.argparse.Namespace(tiny=True, time=True, update=True, dtype="float32", device="cpu", batch=3,
                                    lora_rank=2, grad_ckpt=False, max_gib=1.0, skip_chunk=False)
    lora, full = bench.measure(bench.Row("tiny_ar", "tiny_ar_vla", "tiny_ar", "ar"), args)
    assert lora["params"] == 11 * 6 + (6 * 6 + 6) + (6 * 11 + 11) == full["update_trainable"]
    assert lora["mode"] == "lora" and lora["update_trainable"] == 2 * 6 + 6 * 2  # A and B of q_proj's adapter
    assert lora["chunk_s"] > 0 and lora["update_s"] > 0 and full["update_s"] > 0 and "note" not in full


def test_vla_memory_bad_model_name_is_one_line_exit_2(capsys):
    bench = _script("bench_vla_memory")
    assert bench.main(["--models", "gpt5"]) == 2
    err = capsys.readouterr().err
    assert "unknown --models ['gpt5']" in err and len(err.strip().splitlines()) == 1


# ---- scripts/bench_maniskill_gpu.py ----------------------------------------------------------------------
@pytest.mark.skipif(importlib.util.find_spec("mani_skill") is None, reason="pip install -e .[maniskill]")
def test_maniskill_bench_cpu_smoke_says_it_ran_one_scene(capsys):
    bench = _script("bench_maniskill_gpu")
    assert bench.main(["--device", "cpu", "--num-envs", "4", "--steps", "8", "--warmup", "0", "--rounds", "1",
                       "--chunk", "4", "--configs", "pushcube_state_1024"]) == 0
    out = capsys.readouterr().out
    assert "one scene per process" in out and "not a throughput result" in out
    row = next(x for x in out.splitlines() if x.startswith("pushcube_state_1024")).split()
    assert row[3:5] == ["4", "1"]  # asked for 4, ran at 1
    ms, vl, ratio = float(row[5].replace(",", "")), float(row[6].replace(",", "")), float(row[7])
    # the table rounds steps/s to whole numbers: the printed ratio lies within what that rounding allows
    assert ms > 0 and vl > 0 and (vl - 0.5) / (ms + 0.5) - 5e-4 <= ratio <= (vl + 0.5) / (ms - 0.5) + 5e-4


# ---- scripts/gpu_vla_table.py (call 1 of the plan) and its memory estimate ---------------------------
def test_memory_estimate_adds_weights_grads_adamw_and_activations():
    est = _script("gpu_memory_estimate")
    shapes = [(10, 4)]  # one attention layer seeing 10 tokens of width 4 at batch 1
    full = est.predict_update_peak(params=1000, trainable=1000, lora=100, mode="full", batch=2, grad_ckpt=False,
                                   layer_shapes=shapes)
    assert full["weights_gib"] * 2**30 == 2000 and full["grads_gib"] * 2**30 == 2000
    assert full["adamw_gib"] * 2**30 == 4000 and full["activations_gib"] * 2**30 == 34 * 10 * 4 * 2
    lora = est.predict_update_peak(params=1000, trainable=1000, lora=100, mode="lora", batch=2, grad_ckpt=True,
                                   layer_shapes=shapes)
    assert lora["predicted_gib"] * 2**30 == pytest.approx(1100 * 2 + 100 * 2 + 400 + 2 * 10 * 4 * 2 + 34 * 10 * 4 * 2)
    blind = est.predict_update_peak(params=1000, trainable=1000, lora=100, mode="full", batch=2, grad_ckpt=False,
                                    layer_shapes=None)
    assert not blind["complete"] and blind["activations_gib"] is None and blind["predicted_gib"] * 2**30 == 8000
    lin = torch.nn.Sequential()
    lin.add_module("q_proj", torch.nn.Linear(6, 4))
    lin.add_module("head", torch.nn.Linear(4, 3))
    assert est.lora_parameters(lin, rank=2) == 2 * (6 + 4)  # only the named projection gets an adapter


@pytest.mark.heavy
def test_vla_table_dry_run_measures_and_predicts_every_row(tmp_path, capsys):
    """The device command's dry run: each model in a child process with the packages the GPU image lacks made
    unimportable, chunk times at two batch sizes, four updates (LoRA/full x grad-ckpt off/on) with a prediction
    beside each; JSON and markdown written."""
    import json

    table = _script("gpu_vla_table")
    assert table.main(["--dry-run", "--models", "pi0", "openvla_oft", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[dry-run] on the device: PYTHONPATH=$PWD python3 scripts/gpu_vla_table.py --out $OUT" in out
    data = json.loads((tmp_path / "vla_table.json").read_text())
    assert data["head"]["sizes"] == "tiny" and data["head"]["batch"] == 2
    lines = data["lines"]
    for name in ("pi0", "openvla_oft"):
        mine = [x for x in lines if x["model"] == name]
        assert next(x for x in mine if x["what"] == "status")["status"] == "ok", mine
        assert sorted(x["batch"] for x in mine if x["what"] == "chunk") == [1, 2]
        ups = [x for x in mine if x["what"] == "update"]
        assert [(u["mode"], u["grad_ckpt"]) for u in ups] == [("lora", False), ("full", False), ("lora", True),
                                                               ("full", True)]
        assert all(u["update_s"] > 0 and u["predicted_gib"] > 0 and "note" not in u for u in ups), ups
        size = next(x for x in mine if x["what"] == "size")
        assert ups[0]["trainable"] == size["lora_params"] < ups[1]["trainable"] == size["params"]
    flow = [x for x in lines if x["model"] == "pi0" and x["what"] == "update"]
    assert all(u["prediction_complete"] for u in flow)  # the flow update traces on the meta device
    md = (tmp_path / "vla_table.md").read_text()
    assert md.startswith("device: CPU (dry run)") and "| pi0 |" in md and "| openvla_oft |" in md
    assert len([x for x in md.splitlines() if "| lora |" in x or "| full |" in x]) == 8


def test_vla_table_stops_a_model_at_its_limit_and_goes_on(tmp_path, capsys):
    table = _script("gpu_vla_table")
    # the child stalls after its first measurement (an injected hang), so the limit is reached on any machine;
    # 10 s is the shortest limit the table accepts (it skips a model with less time left)
    assert table.main(["--dry-run", "--models", "pi05", "pi0", "--limit-s", "10", "--stall-after-first",
                       "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "pi05: stopped at its limit of 10 s" in out and "pi0: stopped at its limit of 10 s" in out  # and went on
    import json

    lines = json.loads((tmp_path / "vla_table.json").read_text())["lines"]
    status = [x for x in lines if x["what"] == "status"]
    assert [s["status"] for s in status] == ["stopped at its limit of 10 s"] * 2


def test_vla_table_refusals_are_one_line_exit_2(tmp_path, capsys):
    table = _script("gpu_vla_table")
    assert table.main(["--models", "gpt5", "--out", str(tmp_path)]) == 2
    assert table.main(["--dry-run", "--predictor", "nowhere:predict", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "unknown --models ['gpt5']" in err[0] and "--predictor nowhere:predict" in err[1]
    assert not (tmp_path / "vla_table.json").exists()
    with pytest.raises(ModuleNotFoundError, match="the GPU image lacks it"):
        table._Lacking(["ray"]).find_spec("ray.util")


# ---- scripts/gpu_ppo_race.py ------------------------------------------------------------------------------
def test_ppo_race_dry_run_stops_each_trainer_at_the_target(tmp_path, capsys):
    """Stand-in trainers (ppo.py's evaluation lines on stdout; vlarl's metrics.jsonl) evaluate 0.0, 0.4, 0.95,
    1.0 and would then run on: each is stopped at its first evaluation >= 0.9, and the table names the real
    device commands."""
    import json

    race = _script("gpu_ppo_race")
    assert race.main(["--dry-run", "--out", str(tmp_path), "--limit-s", "60"]) == 0
    out = capsys.readouterr().out
    assert "[dry-run] on the device, maniskill:" in out and "--env_id=PushCube-v1 --num_envs=1024" in out
    assert "[dry-run] on the device, vlarl: " in out and "env=maniskill_gpu_pushcube device=cuda" in out
    rows = json.loads((tmp_path / "ppo_race.json").read_text())["rows"]
    assert [r["trainer"] for r in rows] == ["maniskill", "vlarl"]
    for r in rows:
        assert r["status"] == "reached" and r["stand_in"], r
        assert [v for _, v in r["evals"]] == [0.0, 0.4, 0.95] and r["seconds_to_target"] == r["evals"][-1][0]
    assert (tmp_path / "race_maniskill.log").read_text().count("eval_success_once_mean=") == 3
    assert "| maniskill |" in (tmp_path / "ppo_race.md").read_text()


def test_ppo_race_limit_and_refusals(tmp_path, capsys):
    import json

    race = _script("gpu_ppo_race")
    assert race.main(["--dry-run", "--trainers", "maniskill", "--limit-s", "0.2", "--out", str(tmp_path)]) == 0
    row = json.loads((tmp_path / "ppo_race.json").read_text())["rows"][0]
    assert row["status"].startswith("not reached in") and row["seconds_to_target"] is None
    assert race.main(["--maniskill-ppo", str(tmp_path / "nope.py"), "--out", str(tmp_path / "x")]) == 2
    assert race.main(["--dry-run", "--target", "1.5", "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "no ManiSkill ppo.py at" in err[0] and "--target must be in (0, 1]" in err[1]
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    assert race.MANISKILL_EVAL.search("eval_success_once_mean=0.5").group(1) == "0.5"


# ---- scripts/gpu_maniskill_carry.py -----------------------------------------------------------------------
def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("mani_skill-3.0.1.dist-info/RECORD", "stale\n")
    return path


def test_maniskill_carry_cuts_the_data_and_pip_installs_the_rest(tmp_path, capsys):
    """A wheel named like mani-skill's: the Panda stays (not its camera add-on), other robots, environment maps
    and ReplicaCAD's data go (its Python module stays); the new RECORD lists what is left with hashes; pip
    installs the cut wheel offline; the batches carry the MANIFEST run_gpu_tests.sh reads."""
    import hashlib
    import zipfile

    carry = _script("gpu_maniskill_carry")
    files = {"mani_skill/__init__.py": b"x = 1\n", "mani_skill-3.0.1.dist-info/METADATA":
             b"Metadata-Version: 2.1\nName: mani-skill\nVersion: 3.0.1\n",
             "mani_skill-3.0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             "mani_skill/assets/robots/panda/panda_v2.urdf": b"<robot/>",
             "mani_skill/assets/robots/panda/franka_description/meshes/link0.glb": b"mesh",
             "mani_skill/assets/robots/panda/realsense2_description/cam.stl": b"cam" * 100,
             "mani_skill/assets/robots/fetch/fetch.urdf": b"fetch" * 100,
             "mani_skill/assets/environment_maps/sky.ktx": b"sky" * 100,
             "mani_skill/utils/scene_builder/replicacad/__init__.py": b"",
             "mani_skill/utils/scene_builder/replicacad/metadata/scene.json": b"{}" * 100,
             "mani_skill/utils/scene_builder/table/assets/table.glb": b"table"}
    src = tmp_path / "src"
    src.mkdir()
    _wheel(src / "mani_skill-3.0.1-py3-none-any.whl", files)
    assert carry.main(["--wheels", str(src), "--out", str(tmp_path / "ms")]) == 0
    assert "(4 files dropped)" in capsys.readouterr().out
    cut = tmp_path / "ms" / "b1" / "mani_skill-3.0.1-py3-none-any.whl"
    names = set(zipfile.ZipFile(cut).namelist())
    kept = {"mani_skill/__init__.py", "mani_skill/assets/robots/panda/panda_v2.urdf",
            "mani_skill/assets/robots/panda/franka_description/meshes/link0.glb",
            "mani_skill/utils/scene_builder/replicacad/__init__.py", "mani_skill/utils/scene_builder/table/assets/table.glb"}
    assert kept <= names and not any(("fetch" in n or "environment_maps" in n or "realsense" in n
                                      or "scene.json" in n) for n in names)
    record = zipfile.ZipFile(cut).read("mani_skill-3.0.1.dist-info/RECORD").decode().splitlines()
    assert len(record) == len(names) and "stale" not in record
    manifest = (tmp_path / "ms" / "b1" / "MANIFEST").read_text().split()
    assert manifest == [cut.name, "1", hashlib.sha256(cut.read_bytes()).hexdigest()]
    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target",
                          str(site), str(cut)], capture_output=True, text=True, timeout=120)
    assert pip.returncode == 0, pip.stderr
    assert (site / "mani_skill/assets/robots/panda/panda_v2.urdf").read_bytes() == b"<robot/>"
    assert not (site / "mani_skill/assets/robots/fetch").exists()


def test_maniskill_carry_refuses_a_wheel_larger_than_a_batch(tmp_path, capsys):
    carry = _script("gpu_maniskill_carry")
    src = tmp_path / "src"
    src.mkdir()
    (src / "big-1.0-py3-none-any.whl").write_bytes(os.urandom(3 * 2**20))
    assert carry.main(["--wheels", str(src), "--out", str(tmp_path / "ms"), "--batch-mib", "1"]) == 2
    assert carry.main(["--out", str(tmp_path / "ms")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "larger than a batch" in err[0] and "exactly one of --wheels DIR and --download" in err[1]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mani_skill") is None, reason="pip install -e .[maniskill]")
def test_maniskill_carry_dry_run_runs_the_tasks_from_the_cut_packages(tmp_path):
    """The cut applied to this machine's installed ManiSkill/SAPIEN/MuJoCo: state and RGB PushCube and PickCube
    are made and stepped from the copy (CPU backend), so nothing these runs open was dropped."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts/gpu_maniskill_carry.py"), "--dry-run",
                          str(tmp_path / "site")], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    for want in ("ok PushCube-v1 state", "ok PushCube-v1 rgb", "ok PickCube-v1 state", "ok PickCube-v1 rgb",
                 "ok pytorch_kinematics + mujoco"):
        assert want in out.stdout, out.stdout
    assert not (tmp_path / "site/mani_skill/assets/robots/fetch").exists()


def test_maniskill_call_dry_run_installs_across_two_calls_then_lists_the_runs(tmp_path):
    """Calls 2 and 3: the first carried batch is stashed and the script stops (exit 3); with the second, every
    wheel is whole and the two runs are listed, each under its time limit."""
    wheels, _, _ = _batches(tmp_path)
    env = {**os.environ, "VLARL_WHEEL_DIR": str(wheels), "VLARL_STASH": str(tmp_path / "stash"),
           "VLARL_SITE": str(tmp_path / "site"), "OUT": str(tmp_path / "out")}
    (wheels / "b2").rename(tmp_path / "b2_later")
    call = lambda: subprocess.run(["bash", str(ROOT / "scripts/gpu/maniskill_call.sh"), "--dry-run"],  # noqa: E731
                                  cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    first = call()
    assert first.returncode == 3 and "carry the other gpu_wheels/ms batch" in first.stdout, first.stdout
    (wheels / "b1").rename(tmp_path / "b1_done")
    (tmp_path / "b2_later").rename(wheels / "b2")
    second = call()
    assert second.returncode == 0, second.stdout + second.stderr
    runs = [x for x in second.stdout.splitlines() if x.startswith("[dry-run] timeout")]
    assert len(runs) == 2, second.stdout
    assert "timeout 120 python3 scripts/bench_maniskill_gpu.py --steps 100" in runs[0] and "pushcube_state_4096" in runs[0]
    assert runs[1].startswith("[dry-run] timeout 140 ") and "--limit-s 110" in runs[1]
    assert "scripts/gpu_ppo_race.py" in runs[1] and "--maniskill-ppo gpu_wheels/ppo/ppo.py" in runs[1]
    assert "vlarl itself not installed (VLARL_SKIP_SELF=1" in second.stdout  # the checkout is on PYTHONPATH


def test_prepare_e2e_joins_the_full_closure_swaps_in_the_maniskill_set_and_cuts_ray(tmp_path):
    """The end-to-end carry: wheels cut in parts across prepare_wheels.sh's batches are joined (sha256 checked),
    SAPIEN comes from the ManiSkill set (with MuJoCo), the linters stay behind, Ray loses its Java jar and web UI
    (its Python stays), and the batches carry run_gpu_tests.sh's MANIFEST."""
    import zipfile

    ray_name, sapien_name = "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl", "sapien-3.0.3-cp312-none-any.whl"
    src = tmp_path / "made"
    src.mkdir()
    ray = _wheel(src / ray_name, {"ray/__init__.py": b"x = 1\n", "ray/jars/ray_dist.jar": os.urandom(4000),
                                  "ray/dashboard/client/build/index.html": b"<html/>" * 50,
                                  "ray/dashboard/modules/job.py": b"y = 2\n"}).read_bytes()
    wheels = {ray_name: ray, sapien_name: b"sapien of the full closure",
              "import_linter-2.17-py3-none-any.whl": b"lint", "hydra_core-1.3.8-py3-none-any.whl": b"hydra"}
    full = tmp_path / "full"
    manifest = "".join(f"{n} {2 if n == ray_name else 1} {hashlib.sha256(d).hexdigest()}\n" for n, d in wheels.items())
    for batch, files in {"b1": {f"{ray_name}.part00": ray[:1000], sapien_name: wheels[sapien_name]},
                         "b2": {f"{ray_name}.part01": ray[1000:], "import_linter-2.17-py3-none-any.whl": b"lint",
                                "hydra_core-1.3.8-py3-none-any.whl": b"hydra"}}.items():
        (full / batch).mkdir(parents=True)
        (full / batch / "MANIFEST").write_text(manifest)
        for n, d in files.items():
            (full / batch / n).write_bytes(d)
    ms = tmp_path / "ms_full"
    ms.mkdir()
    _wheel(ms / "sapien-3.0.3-cp312-cp312-manylinux_2_28_x86_64.whl", {"sapien/__init__.py": b"maniskill set"})
    _wheel(ms / "mujoco-3.17.0-cp312-cp312-manylinux_2_28_x86_64.whl", {"mujoco/__init__.py": b""})
    env = {**os.environ, "VLARL_PYTHON": sys.executable, "VLARL_FULL_DIR": str(full), "VLARL_MS_DIR": str(ms),
           "VLARL_E2E_DIR": str(tmp_path / "e2e"), "VLARL_BATCH_MIB": "1"}
    run = lambda: subprocess.run(["bash", str(ROOT / "scripts/gpu/prepare_e2e.sh")], cwd=ROOT,  # noqa: E731
                                 capture_output=True, text=True, timeout=120, env=env)
    out = run()
    assert out.returncode == 0, out.stdout + out.stderr
    got = {p.name: p for p in (tmp_path / "e2e").glob("b*/*.whl")}
    assert sorted(got) == sorted([ray_name, "hydra_core-1.3.8-py3-none-any.whl", "mujoco-3.17.0-cp312-cp312-manylinux_2_28_x86_64.whl",
                                  "sapien-3.0.3-cp312-cp312-manylinux_2_28_x86_64.whl"])
    assert zipfile.ZipFile(got["sapien-3.0.3-cp312-cp312-manylinux_2_28_x86_64.whl"]).read("sapien/__init__.py") \
        == b"maniskill set"
    names = set(zipfile.ZipFile(got[ray_name]).namelist())
    assert {"ray/__init__.py", "ray/dashboard/modules/job.py"} <= names
    assert not any(n.startswith(("ray/jars/", "ray/dashboard/client/build/")) for n in names)
    listed = (tmp_path / "e2e" / "b1" / "MANIFEST").read_text().split()[0::3]
    assert sorted(listed) == sorted(got)
    (full / "b2" / "hydra_core-1.3.8-py3-none-any.whl").write_bytes(b"a broken copy")
    broken = run()
    assert broken.returncode != 0 and "hydra_core-1.3.8-py3-none-any.whl does not match its MANIFEST" in broken.stderr
    shutil.rmtree(ms)
    missing = run()
    assert missing.returncode == 2 and "ms_full is missing" in missing.stderr


def test_e2e_call_dry_run_installs_across_calls_then_lists_tests_and_the_cuda_run(tmp_path):
    """The end-to-end call: a batch short is stashed (exit 3); with every wheel whole and the demonstrations
    carried, the tests over Ray and ManiSkill and the embedded default with device=cuda are listed, each under
    its time limit; without the demonstrations, one line naming the carry."""
    wheels, _, _ = _batches(tmp_path)
    demos = tmp_path / "demos"
    env = {**os.environ, "VLARL_WHEEL_DIR": str(wheels), "VLARL_STASH": str(tmp_path / "stash"),
           "VLARL_SITE": str(tmp_path / "site"), "OUT": str(tmp_path / "out"), "VLARL_E2E_DEMOS": str(demos)}
    call = lambda: subprocess.run(["bash", str(ROOT / "scripts/gpu/e2e_call.sh"), "--dry-run"],  # noqa: E731
                                  cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    (wheels / "b2").rename(tmp_path / "b2_later")
    first = call()
    assert first.returncode == 3 and "carry the next gpu_wheels/e2e batch" in first.stdout, first.stdout
    (tmp_path / "b2_later").rename(wheels / "b2")
    no_demos = call()
    assert no_demos.returncode == 2 and f"{demos} is missing: carry it" in no_demos.stderr
    demos.mkdir()
    second = call()
    assert second.returncode == 0, second.stdout + second.stderr
    runs = [x for x in second.stdout.splitlines() if x.startswith("[dry-run] timeout")]
    assert len(runs) == 3, second.stdout
    assert runs[0].startswith("[dry-run] timeout 150 env VLARL_REQUIRE_ALL=1") and "tests/workers/test_weight_sync.py" in runs[0]
    assert "tests/simulators/test_contract.py -k maniskill" in runs[1]
    assert runs[2].startswith("[dry-run] timeout 330 ") and "device=cuda" in runs[2] and "time_limit_minutes=3.5" in runs[2]


def test_vla_call_dry_run_puts_the_carried_transformers_first_then_runs_the_table(tmp_path):
    """Call 1's wrapper: the carried transformers wheel goes into its own folder ahead of the image's (printed
    in the dry run), then the table's dry run writes its files."""
    (tmp_path / "tf").mkdir()
    (tmp_path / "tf" / "transformers-5.24.0-py3-none-any.whl").write_bytes(b"wheel")
    env = {**os.environ, "VLARL_PYTHON": sys.executable, "VLARL_TF_WHEELS": str(tmp_path / "tf"),
           "OUT": str(tmp_path / "out"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(["bash", str(ROOT / "scripts/gpu/vla_call.sh"), "--dry-run", "--models", "smolvla"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    pip = next(x for x in out.stdout.splitlines() if x.startswith("[dry-run]") and "pip install" in x)
    assert "--target /tmp/vlarl_tf" in pip and "transformers-5.24.0-py3-none-any.whl" in pip
    assert "| smolvla |" in (tmp_path / "out" / "vla_table.md").read_text()


def test_the_15_minute_plan_adds_up():
    """docs/gpu.md's plan: the calls' timeout_s plus ~2 minutes of start fit 15 minutes with room for a rerun of
    the shortest call, and each call's timeout covers the limits of the runs inside it."""
    import re

    plan = (ROOT / "docs/gpu.md").read_text().split("## The 15 minutes")[1].split("Total at")[0]
    rows = [r for r in plan.splitlines() if re.match(r"\| \d", r)]
    timeouts = [int(r.split("|")[4]) for r in rows]
    assert len(timeouts) == 3 and 120 + sum(timeouts) + min(timeouts) <= 900, timeouts
    table = _script("gpu_vla_table")
    assert sum(table.LIMITS_S.values()) + 20 <= timeouts[0]  # call 1: the children's limits + install/probe
    call = (ROOT / "scripts/gpu/maniskill_call.sh").read_text()
    bench = int(re.search(r'BENCH_S="\$\{VLARL_BENCH_S:-(\d+)\}"', call).group(1))
    race = int(re.search(r'RACE_S="\$\{VLARL_RACE_S:-(\d+)\}"', call).group(1))
    assert bench + race + 30 + 15 <= timeouts[2]  # call 3: bench + race (+ its 30 s margin) + install


# ---- scripts/gpu/planner_call.sh --dry-run ---------------------------------------------------------------
def _planner_call(root: Path, *args: str) -> subprocess.CompletedProcess:
    """The script from a copy of its folder under ``root`` (it reads its carry relative to the repo root)."""
    (root / "scripts/gpu").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "scripts/gpu/planner_call.sh", root / "scripts/gpu/planner_call.sh")
    return subprocess.run(["bash", str(root / "scripts/gpu/planner_call.sh"), *args], capture_output=True,
                          text=True, timeout=60)


def test_planner_call_names_a_missing_carry_and_dry_runs_its_three_steps(tmp_path):
    missing = _planner_call(tmp_path, "--dry-run")
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        "planner_call.sh: gpu_wheels/planner/pred.json is missing: see the header of this script for how to make it"]
    for d in ("gpu_wheels/planner/site/omegaconf", "gpu_wheels/planner/site/hydra", "gpu_wheels/tf"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "gpu_wheels/planner/pred.json").write_text("{}")
    (tmp_path / "gpu_wheels/planner/diffusers-0.42.1-py3-none-any.whl").write_bytes(b"")
    (tmp_path / "gpu_wheels/tf/transformers-5.24.0-py3-none-any.whl").write_bytes(b"")
    dry = _planner_call(tmp_path, "--dry-run", "--models", "pi0")
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.strip().splitlines()
    assert len(lines) == 3 and all(x.startswith("[dry-run] ") for x in lines)
    assert "diffusers-0.42.1" in lines[0] and "transformers-5.24.0" in lines[0]
    assert "-m pytest -m gpu" in lines[1] and "tests/planning/test_gpu_measure.py" in lines[1]
    assert "bench_planner.py gpu --predicted gpu_wheels/planner/pred.json" in lines[2] and lines[2].endswith("--models pi0")
