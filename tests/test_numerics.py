"""The numerics profile (src/vcarepro/core/numerics.py) reaches every process a stage starts, changes what they compute
with when it changes, and makes an emulated AMD EPYC compute the bits this machine computes (issue 25)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import ROOT
from vcarepro.core import numerics
from vcarepro.tools import lockcheck

RUN = str(ROOT / "stages" / "run.py")
HAS_AVX512 = "avx512f" in numerics.cpu_flags()

# What a process reports about itself: the kernels ATen dispatches to, its threads, the profile's variables.
PROBE = """
import json, os, sys
import torch
from vcarepro.core.errors import run_stage
from vcarepro.train.seeds import run_in_workers

def state(where):
    x = torch.arange(1, 20001, dtype=torch.float32) / 7.0
    return {"where": where, "aten": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            # oneMKL's vector math rounds sqrt its own way (under MKL_CBWR=COMPATIBLE about 1 in 6 values off by an
            # ulp); the profile's replacement is IEEE-exact, as numpy's
            "sqrt_exact": bool(torch.equal(torch.sqrt(x), torch.from_numpy(__import__("numpy").sqrt(x.numpy())))),
            "nnpack": torch._C._get_nnpack_enabled(),
            "env": {k: os.environ.get(k) for k in ("MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "OPENBLAS_CORETYPE",
                                                   "OMP_NUM_THREADS", "NPY_DISABLE_CPU_FEATURES")}}

def main():
    out = {"stage": state("stage")}
    if sys.argv[1:] == ["workers"]:
        out.update({f"worker_{k}": v for k, v in run_in_workers("probe", [0, 1], lambda s: state("worker"), 2).items()})
    rank = os.environ.get("RANK")
    name = f"probe_rank{rank}.json" if rank is not None else "probe.json"
    open(name, "w").write(json.dumps(out))

run_stage(main)
"""


def write_params(folder: Path, **numerics_section) -> None:
    (folder / "params.yaml").write_text(yaml.safe_dump({"numerics": numerics_section}))


def probe(folder: Path, *args: str, env=None, warm: bool = True, launch: bool = False):
    (folder / "probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    env["VCAREPRO_WARM"] = "1" if warm else "0"
    command = [sys.executable, RUN]
    if launch:
        command += ["-m", "vcarepro.train.launch", "--nproc-per-node", "2", "--rdzv-endpoint", "file"]
    done = subprocess.run(
        [*command, "probe.py", *args], cwd=folder, env=env, capture_output=True, text=True, timeout=600
    )
    return done


@pytest.mark.parametrize("warm", [True, False], ids=["warm child", "fresh interpreter"])
def test_the_portable_profile_reaches_the_stage_and_its_seed_workers(tmp_path, warm):
    write_params(tmp_path, cpu="portable", threads=2, gpu="fast")
    done = probe(tmp_path, "workers", env={"OMP_NUM_THREADS": "1", "MKL_CBWR": "AUTO"}, warm=warm)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads((tmp_path / "probe.json").read_text())
    assert out["stage"]["aten"] == "AVX2"
    assert out["stage"]["threads"] == 2  # the profile's count, not the caller's OMP_NUM_THREADS=1
    assert out["stage"]["env"]["MKL_CBWR"] == "COMPATIBLE" and out["stage"]["env"]["OPENBLAS_CORETYPE"] == "Haswell"
    assert out["stage"]["sqrt_exact"] and not out["stage"]["nnpack"]
    for k in ("worker_0", "worker_1"):  # forked: the same kernels, each its share of the threads
        assert out[k]["aten"] == "AVX2" and out[k]["threads"] == 1
        assert out[k]["sqrt_exact"] and not out[k]["nnpack"]
        assert out[k]["env"] == out["stage"]["env"]


def test_the_portable_profile_reaches_every_rank(tmp_path):
    write_params(tmp_path, cpu="portable", threads=2, gpu="fast")
    done = probe(tmp_path, launch=True, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    for rank in (0, 1):
        out = json.loads((tmp_path / f"probe_rank{rank}.json").read_text())["stage"]
        assert out["aten"] == "AVX2" and out["threads"] == 2 and out["env"]["ONEDNN_MAX_CPU_ISA"] == "AVX2"
        assert out["sqrt_exact"] and not out["nnpack"]


def test_changing_the_profile_changes_what_the_child_runs_with(tmp_path):
    """Each setting reaches the warm child that runs the stage: a server started under other values is not reused."""
    write_params(tmp_path, cpu="portable", threads=2, gpu="fast")
    assert probe(tmp_path).returncode == 0
    first = json.loads((tmp_path / "probe.json").read_text())["stage"]
    write_params(tmp_path, cpu="portable", threads=1, gpu="fast")
    assert probe(tmp_path).returncode == 0
    second = json.loads((tmp_path / "probe.json").read_text())["stage"]
    assert (first["threads"], second["threads"]) == (2, 1)
    write_params(tmp_path, cpu="native", gpu="fast")
    done = probe(tmp_path, env={"OMP_NUM_THREADS": "1", "MKL_CBWR": "AUTO"})
    assert done.returncode == 0, done.stderr[-2000:]
    native = json.loads((tmp_path / "probe.json").read_text())["stage"]
    assert native["threads"] == 1 and native["env"]["MKL_CBWR"] == "AUTO"  # native: the caller's own settings
    assert native["nnpack"] and not native["sqrt_exact"]  # and the libraries' own kernels
    # the caller's own OpenBLAS kernel choice, whatever it is (some machines set one for their OpenBLAS): not the
    # profile's
    assert native["env"]["OPENBLAS_CORETYPE"] == os.environ.get("OPENBLAS_CORETYPE")
    if HAS_AVX512:
        assert native["aten"] == "AVX512"


@pytest.mark.skipif(not HAS_AVX512, reason="needs a CPU whose own ATen kernels are not the profile's AVX2 ones")
def test_a_stage_whose_torch_was_loaded_without_the_profile_refuses_to_run(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        numerics.ENV_KEY: json.dumps({"cpu": "portable", "gpu": "fast", "threads": 2}),
    }
    env.pop("ATEN_CPU_CAPABILITY", None)
    done = subprocess.run(
        [sys.executable, "probe.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: ATen runs its AVX512 kernels although numerics.cpu=portable asked for AVX2: torch was imported before "
        "stages/run.py set ATEN_CPU_CAPABILITY; start the stage through `python stages/run.py` (stop a stale warm "
        "server with VCAREPRO_WARM=0)"
    ]
    assert not (tmp_path / "probe.json").exists()


@pytest.mark.parametrize(
    "section, message",
    [
        ({"cpu": "fast"}, "numerics.cpu='fast' is unknown; use one of portable, native."),
        ({"cpu": "portable", "threads": 0}, "numerics.threads=0 must be a whole number >= 1"),
        ({"gpu": "exact"}, "numerics.gpu='exact' is unknown; use one of deterministic, fast."),
    ],
)
def test_a_bad_profile_is_one_sentence_and_exit_2_before_anything_runs(tmp_path, section, message):
    write_params(tmp_path, **section)
    done = probe(tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: {message}") and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "probe.json").exists()


def test_the_profiles_set_what_their_documentation_names():
    portable = numerics.profile_env(numerics.settings_of({"numerics": {"cpu": "portable", "threads": 3}}))
    assert portable["ATEN_CPU_CAPABILITY"] == "avx2" and portable["MKL_CBWR"] == "COMPATIBLE"
    assert portable["ONEDNN_MAX_CPU_ISA"] == "AVX2" and portable["MKL_DYNAMIC"] == portable["OMP_DYNAMIC"] == "FALSE"
    assert portable["OMP_NUM_THREADS"] == portable["MKL_NUM_THREADS"] == portable["OPENBLAS_NUM_THREADS"] == "3"
    assert "CUBLAS_WORKSPACE_CONFIG" not in portable  # gpu defaults to fast where the section does not say
    deterministic = numerics.profile_env(numerics.settings_of({"numerics": {"cpu": "native", "gpu": "deterministic"}}))
    assert deterministic["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and "ATEN_CPU_CAPABILITY" not in deterministic
    # every variable a profile sets is part of the warm server's key (stages/warm.py)
    from stages import warm

    for name in {**portable, **deterministic}:
        if name != numerics.ENV_KEY:
            assert name.startswith(warm.IMPORT_ENV_PREFIXES), name


def test_every_scale_has_its_profile():
    from vcarepro.params.config import compose

    assert compose([])["numerics"] == {"cpu": "portable", "threads": 2, "gpu": "deterministic"}
    assert compose(["scale=smoke"])["numerics"]["cpu"] == "native"  # the paper path's numerics, no lock to reproduce
    assert compose(["scale=paper"])["numerics"] == {"cpu": "native", "threads": 2, "gpu": "deterministic"}


QEMU = shutil.which("qemu-x86_64")
REQUIRE_QEMU = os.environ.get("VCAREPRO_REQUIRE_QEMU") == "1"


@pytest.mark.slow
@pytest.mark.skipif(not QEMU and not REQUIRE_QEMU, reason="qemu-user (Debian's qemu-user) emulates the other vendor")
def test_the_portable_profile_computes_the_same_bits_on_an_emulated_amd_epyc(tmp_path):
    """Every op, every layer's output and gradient of the embedded DeiT-T / DiT-S/2 (MHSA and VCA), the digit
    extractor's training, FID's sqrtm and the logistic regression, on this CPU and on qemu's AMD EPYC-Rome (vendor
    AuthenticAMD, AVX2, no AVX-512: the other dispatch of every library), both under the portable profile."""
    assert QEMU, "qemu-x86_64 is missing: apt-get install qemu-user (.ci/run does)"
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    # the profile's variables from the start, as stages/run.py sets them (run.py itself is not used: its exec of
    # the stage would leave the emulator, which emulates one process, not its execve)
    profile = numerics.profile_env(numerics.settings_of(yaml.safe_load((ROOT / "params.yaml").read_text())))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **profile}
    # the CPU the emulated process sees, read by numpy and OpenBLAS from the CPUID that ATen's dispatch reads too
    # (torch itself takes 40 s to import under emulation)
    where = (
        "import json, numpy, threadpoolctl; print(json.dumps([numpy._core._multiarray_umath.__cpu_features__, "
        "sorted({i.get('architecture') for i in threadpoolctl.threadpool_info() if i.get('architecture')})]))"
    )

    def run(*command, emulate=False, environ=env):
        prefix = [QEMU, "-cpu", "EPYC-Rome"] if emulate else []
        done = subprocess.run(
            [*prefix, sys.executable, *command], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=1500
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    # the emulator really is another CPU: the libraries' own dispatch (no profile) picks other code there
    native_env = {k: v for k, v in os.environ.items() if k not in profile}
    native_env["PYTHONPATH"] = str(ROOT / "src")
    features, blas_emulated = json.loads(run("-c", where, emulate=True, environ=native_env))
    assert features["AVX2"] and features["FMA3"] and not features["AVX512F"] and blas_emulated in (["Haswell"], ["Zen"])
    if HAS_AVX512:
        capability = "import torch; print(torch.backends.cpu.get_cpu_capability())"
        assert run("-c", capability, environ=native_env).strip() == "AVX512"
    fingerprint = ["-m", "vcarepro.tools.lockcheck", "fingerprint", "--params", "params.yaml", "--out"]
    run(*fingerprint, "here.json")
    run(*fingerprint, "epyc.json", emulate=True)
    here, epyc = (json.loads((tmp_path / name).read_text()) for name in ("here.json", "epyc.json"))
    assert len(here) > 500
    assert lockcheck.compare_fingerprints(here, epyc) == []


def test_the_vector_math_replacement_is_exact_differentiable_and_covers_every_form():

    code = """
import numpy as np, torch
from vcarepro.core import numerics
x = torch.arange(1, 20001, dtype=torch.float64) / 7.0
before = torch.equal(torch.sqrt(x.float()), torch.from_numpy(np.sqrt(x.float().numpy())))
numerics.exact_vector_math()
numerics.exact_vector_math()  # once per process, however often a stage enters
f = x.float().clone().requires_grad_()
y = f.sqrt(); y.sum().backward()
assert torch.equal(y.detach(), torch.from_numpy(np.sqrt(f.detach().numpy())))
assert torch.allclose(f.grad, 0.5 / y.detach())
z = f.detach().clone(); z.sqrt_(); assert torch.equal(z, y.detach())
o = torch.empty(0); torch.sqrt(f.detach(), out=o); assert torch.equal(o, y.detach())
assert torch.equal(torch.log(x), torch.from_numpy(np.log(x.numpy()))) and torch.log(x).dtype == torch.float64
assert torch.isnan(torch.sqrt(torch.tensor([-1.0])))[0] and torch.log(torch.tensor([0.0]))[0] == -float("inf")
assert torch.sqrt(torch.tensor([4])).dtype == torch.get_default_dtype()
c = torch.tensor([-4.0 + 0j, 3 + 4j], dtype=torch.complex64)
assert torch.equal(torch.sqrt(c), torch.from_numpy(np.sqrt(c.numpy())))  # complex keeps its imaginary part
try:
    torch.tensor([4]).sqrt_()
    raise SystemExit("an integer tensor took a float result in place")
except RuntimeError as err:
    assert "can't be cast" in str(err)
m = torch.rand(2, 3, 4, 5).to(memory_format=torch.channels_last)
assert torch.sqrt(m).stride() == m.stride()  # the input's layout, as ATen keeps it
v = torch.rand(6, 4); w = v.clone(); v[:, 1].sqrt_()  # in place on a strided view: that column only
assert torch.equal(v[:, 1], torch.from_numpy(np.sqrt(w[:, 1].numpy())))
assert torch.equal(v[:, [0, 2, 3]], w[:, [0, 2, 3]])
print(before)
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MKL_CBWR": "COMPATIBLE"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"  # oneMKL's own sqrt is not the exact one: the replacement changes something


def test_lockcheck_names_each_output_whose_hash_differs():
    recorded = {
        "stages": {
            "prepare_gen": {"outs": [{"path": "data/gen", "md5": "a" * 32 + ".dir"}]},
            "report": {"outs": [{"path": "reports/results.json", "md5": "b" * 32}]},
        }
    }
    here = {
        "stages": {
            "prepare_gen": {"outs": [{"path": "data/gen", "md5": "c" * 32 + ".dir"}]},
            "report": {"outs": [{"path": "reports/results.json", "md5": "b" * 32}]},
        }
    }
    assert lockcheck.compare_locks(recorded, recorded) == []
    assert lockcheck.compare_locks(recorded, here) == [
        "data/gen (prepare_gen): cccccccccccc here, aaaaaaaaaaaa in the committed lock"
    ]


def test_lockcheck_names_the_files_of_a_directory_output_that_differ(tmp_path):
    """The record keeps each directory output's file listing, so a verify elsewhere says which file differs."""
    import json

    listing = [
        {"md5": "1" * 32, "relpath": "SHA256SUMS"},
        {"md5": "2" * 32, "relpath": "meta.json"},
        {"md5": "3" * 32, "relpath": "net.safetensors"},
    ]
    obj = tmp_path / ".dvc" / "cache" / "files" / "md5" / "ab" / ("c" * 30 + ".dir")
    obj.parent.mkdir(parents=True)
    obj.write_text(json.dumps(listing))
    lock = {
        "stages": {
            "prepare_gen": {"outs": [{"path": "data/gen", "md5": "ab" + "c" * 30 + ".dir"}]},
            "report": {"outs": [{"path": "reports/results.json", "md5": "b" * 32}]},
        }
    }
    here = lockcheck.output_files(tmp_path, lock)
    assert here == {"data/gen": {"SHA256SUMS": "1" * 32, "meta.json": "2" * 32, "net.safetensors": "3" * 32}}
    recorded = {**here["data/gen"], "net.safetensors": "4" * 32, "old.npy": "5" * 32}
    del recorded["SHA256SUMS"]
    assert lockcheck.file_differences(recorded, here["data/gen"]) == (
        "; files: SHA256SUMS (only here), net.safetensors (differs), old.npy (only recorded)"
    )
    assert "every file hashes as" in lockcheck.file_differences(here["data/gen"], here["data/gen"])
    assert lockcheck.file_differences(None, here["data/gen"]) == ""
    machine = {
        "cpu": "X",
        "vendor": "GenuineIntel",
        "family_model": "6/143/8",
        "caches": {"L1d": "48K", "L2": "2048K"},
        "isa": ["avx2", "fma"],
        "libc": "glibc 2.36",
        "aten_capability": "AVX2",
        "threads": 2,
        "profile": {"cpu": "portable"},
        "libraries": {"torch": "2.14.1"},
    }
    text = lockcheck.describe(machine)
    assert "6/143/8" in text and "L2 2048K" in text and "ISA avx2 fma" in text


def test_the_machine_description_names_the_cpu_model_and_caches():
    described = numerics.describe_machine()
    assert described["family_model"].count("/") == 2
    assert all(key[0] == "L" for key in described["caches"]) and "pillow" in described["libraries"]


def test_lockcheck_stale_ignores_missing_outputs_and_names_changed_code():
    status = {
        "prepare_gen": [
            {"changed deps": {"data/cls": "deleted", "src/vcarepro/core/io.py": "modified"}},
            {"changed outs": {"data/gen": "deleted"}},
        ],
        "train_cls@deit_tiny-vca": [{"changed deps": {"data/cls": "deleted"}}, {"changed outs": {"x": "deleted"}}],
        "report": [{"changed deps": {"params.yaml": {"numerics": "modified"}, "runs": "modified"}}],
    }
    lines = lockcheck.stale_entries(status, ["data/gen", "data/cls", "x", "runs/cls/a/train"])
    assert "prepare_gen: dep src/vcarepro/core/io.py modified" in lines
    assert not any("train_cls" in line for line in lines)
    assert len(lines) == 2
