"""The numerics profile: which CPU code paths and GPU algorithms every stage's process computes with.

``numerics.cpu: portable`` fixes each library's kernel choice to the AVX2 path and the thread count to
``numerics.threads``, so a lock recorded on one x86-64 CPU reproduces on another; ``native`` sets nothing.
``numerics.gpu: deterministic`` sets what PyTorch's reproducibility notes list for CUDA. ``stages/run.py``
sets the variables before any library loads and :func:`enter` checks them; docs/reproducibility.md says
what each setting does and why. This module loads only the standard library at import, for that reason.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Dict, Mapping, MutableMapping, Optional

CPU_PROFILES = ("portable", "native")
GPU_PROFILES = ("deterministic", "fast")
ENV_KEY = "VCAREPRO_NUMERICS"  # the profile the client applied, for the stage's own checks (JSON)

# The portable profile, each value from the library's own documentation:
PORTABLE_CPU_ENV = {
    # PyTorch (torch/backends/cpu, "ATEN_CPU_CAPABILITY"): the dispatcher's kernel set; avx2 on every CPU
    # that has it, instead of avx512 where the CPU has that. Sleef's AVX2 exp/tanh/erf included.
    "ATEN_CPU_CAPABILITY": "avx2",
    # oneMKL, "Getting Started with Conditional Numerical Reproducibility": MKL_CBWR=AVX2 gives the same
    # results only on Intel CPUs ("on non-Intel CPUs ... the AUTO branch is used instead"); COMPATIBLE
    # (SSE2 without rcpps/rsqrtps) is the branch documented to give the same results on Intel and
    # Intel-compatible CPUs. Its "Reproducibility Conditions": a fixed thread count, and MKL_DYNAMIC /
    # OMP_DYNAMIC FALSE so that the runtime does not change it.
    "MKL_CBWR": "COMPATIBLE",
    "MKL_DYNAMIC": "FALSE",
    "OMP_DYNAMIC": "FALSE",
    # oneDNN, "CPU Dispatcher Control": ONEDNN_MAX_CPU_ISA caps the ISA its JIT emits code for.
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    # OpenBLAS (numpy's and scipy's BLAS/LAPACK, built DYNAMIC_ARCH): OPENBLAS_CORETYPE forces one kernel
    # set; Haswell is the AVX2 one it picks for Zen too.
    "OPENBLAS_CORETYPE": "Haswell",
    # numpy, "CPU build options / runtime dispatch": NPY_DISABLE_CPU_FEATURES turns dispatched targets off
    # (numpy >= 2.4 names them X86_V4, AVX512_ICL, AVX512_SPR; earlier releases AVX512F, AVX512_SKX, ...;
    # names a numpy does not dispatch are ignored).
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR AVX512F AVX512CD AVX512_SKX AVX512_CLX "
    "AVX512_CNL AVX512_KNL AVX512_KNM",
    # timm (timm/layers/config.py): TIMM_FUSED_ATTN picks its attention kernel; 1 is its default, fixed here so
    # that a shell's setting cannot change it.
    "TIMM_FUSED_ATTN": "1",
}
# Variables that would override the profile's choices: removed from the environment under `portable`
# (MKL_ENABLE_INSTRUCTIONS caps oneMKL's ISA, MKL_DEBUG_CPU_TYPE forced its dispatch in older releases).
PORTABLE_CPU_UNSET = ("MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# PyTorch, "Reproducibility" notes (CUDA >= 10.2): cuBLAS needs a fixed workspace to be deterministic.
DETERMINISTIC_GPU_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}

CPU_GUARANTEE = (
    "bit-identical on any x86-64 CPU with AVX2 and FMA (Intel or AMD) under numerics.cpu=portable, "
    "for the same software: the Python packages pyproject.toml resolves to and the C library (glibc), "
    "whose log / atan / asin / acos numpy calls on AVX2 machines"
)
GPU_GUARANTEE = (
    "under numerics.gpu=deterministic, bit-identical only on the same GPU model, driver, CUDA / cuDNN "
    "versions and world size, except where an op has no deterministic CUDA kernel (PyTorch warns "
    "naming it); across GPU models, or with numerics.gpu=fast, runs agree only statistically"
)


class NumericsError(Exception):
    """The profile could not be applied; the message names the cause and the fix."""


def settings_of(params: Optional[Mapping]) -> Dict[str, object]:
    """The ``numerics`` section of params (``native`` / ``fast`` where it is absent) with its values checked."""
    section = dict((params or {}).get("numerics") or {})
    cpu = section.get("cpu", "native")
    gpu = section.get("gpu", "fast")
    threads = section.get("threads", 0)
    if cpu not in CPU_PROFILES:
        raise NumericsError(f"numerics.cpu={cpu!r} is unknown; use one of {', '.join(CPU_PROFILES)}.")
    if gpu not in GPU_PROFILES:
        raise NumericsError(f"numerics.gpu={gpu!r} is unknown; use one of {', '.join(GPU_PROFILES)}.")
    if cpu == "portable" and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise NumericsError(
            f"numerics.threads={threads!r} must be a whole number >= 1 under numerics.cpu=portable "
            "(the thread count sets the order of every threaded sum, so it is fixed)."
        )
    return {"cpu": cpu, "gpu": gpu, "threads": int(threads) if cpu == "portable" else None}


def profile_env(settings: Mapping[str, object]) -> Dict[str, str]:
    """The environment variables a profile sets (before any library is imported)."""
    env: Dict[str, str] = {}
    if settings["cpu"] == "portable":
        env.update(PORTABLE_CPU_ENV)
        env.update({name: str(settings["threads"]) for name in THREAD_VARIABLES})
    if settings["gpu"] == "deterministic":
        env.update(DETERMINISTIC_GPU_ENV)
    env[ENV_KEY] = json.dumps(dict(settings), sort_keys=True)
    return env


def read_params(path: str = "params.yaml") -> Optional[Mapping]:
    """params.yaml as a mapping (None when there is none): PyYAML, which DVC depends on, is there."""
    if not os.path.isfile(path):
        return None
    import yaml

    with open(path) as f:
        return yaml.safe_load(f) or {}


def apply_env(environ: MutableMapping[str, str] = os.environ, params_path: str = "params.yaml") -> Dict[str, object]:
    """Set the profile of ``params_path``'s ``numerics`` section in ``environ``; returns the settings.

    The profile's values replace the caller's own: under ``portable`` an ``OMP_NUM_THREADS`` from the shell or
    the cluster would change the bits. ``native`` leaves the caller's variables as they are."""
    settings = settings_of(read_params(params_path))
    environ.update(profile_env(settings))
    if settings["cpu"] == "portable":
        for name in PORTABLE_CPU_UNSET:
            environ.pop(name, None)
    return settings


# -- inside the stage's process (torch imported) --------------------------------------------------------------


def active() -> Optional[Dict[str, object]]:
    """The settings the client applied to this process's environment, or None (not started by stages/run.py)."""
    raw = os.environ.get(ENV_KEY)
    return json.loads(raw) if raw else None


def enter() -> Optional[Dict[str, object]]:
    """Check that the profile reached this process and set its in-process parts (thread count, deterministic
    algorithms and cuDNN flags where there is a GPU).
    Raises :class:`NumericsError` when a variable did not take effect."""
    settings = active()
    if settings is None:
        return None
    import torch

    if settings["cpu"] == "portable":
        capability = torch.backends.cpu.get_cpu_capability()
        if capability != "AVX2":
            flags = cpu_flags()
            if not {"avx2", "fma"} <= flags:
                raise NumericsError(
                    "this CPU has no AVX2 and FMA, which numerics.cpu=portable needs; run with "
                    "`-S numerics.cpu=native` (its results will not match dvc.lock's)"
                )
            raise NumericsError(
                f"ATen runs its {capability} kernels although numerics.cpu=portable asked for AVX2: "
                "torch was imported before stages/run.py set ATEN_CPU_CAPABILITY; start the stage "
                "through `python stages/run.py` (stop a stale warm server with VCAREPRO_WARM=0)"
            )
        torch.set_num_threads(int(settings["threads"]))
        # NNPACK picks its kernels by its own CPU detection; oneDNN stays on, capped at AVX2 (off cost 1.4x a
        # step). docs/reproducibility.md has the measurement.
        torch.backends.nnpack.set_flags(False)
        exact_vector_math()
    if settings["gpu"] == "deterministic" and torch.cuda.is_available():
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)
    return settings


# ATen computes these through oneMKL's vector math, which ignores MKL_CBWR on a non-Intel CPU and gave other
# bits there (docs/reproducibility.md); numpy's sqrt is IEEE-exact, the others its AVX2 loops or the C library.
VML_OPS = ("sqrt", "log", "log10", "atan", "acos", "asin")
_REGISTERED: list = []


def exact_vector_math() -> None:
    """Replace ATen's CPU kernels of :data:`VML_OPS` (functional, in-place and out=) by numpy's, in this process."""
    if _REGISTERED:
        return
    import warnings

    import numpy as np
    import torch

    library = torch.library.Library("aten", "IMPL")

    def make(fn):
        def compute(x):
            exact = x.dtype in (torch.float32, torch.float64, torch.complex64, torch.complex128)
            array = (x if exact else x.to(torch.float64)).detach().resolve_conj().contiguous().numpy()
            with np.errstate(all="ignore"):  # sqrt(-1) is nan, log(0) -inf, as torch gives them
                result = torch.from_numpy(np.asarray(fn(array)))
            dtype = x.dtype if (x.is_floating_point() or x.is_complex()) else torch.get_default_dtype()
            return result.to(dtype)

        def functional(x):
            result = compute(x)
            return torch.empty_like(x, dtype=result.dtype).copy_(result)  # the input's strides, as ATen keeps them

        def inplace(x):
            if not (x.is_floating_point() or x.is_complex()):
                raise RuntimeError(f"result type Float can't be cast to the desired output type {x.dtype}")
            return x.copy_(compute(x))

        def out(x, *, out):
            result = compute(x)
            if result.is_floating_point() and not (out.is_floating_point() or out.is_complex()):
                raise RuntimeError(f"result type Float can't be cast to the desired output type {out.dtype}")
            if out.shape != result.shape:
                out.resize_(result.shape)
            return out.copy_(result)

        return functional, inplace, out

    with warnings.catch_warnings():  # "Overriding a previously registered kernel": that is the point
        warnings.simplefilter("ignore")
        for name in VML_OPS:
            functional, inplace, out = make(
                getattr(np, {"atan": "arctan", "acos": "arccos", "asin": "arcsin"}.get(name, name))
            )
            library.impl(name, functional, "CPU")
            library.impl(f"{name}_", inplace, "CPU")
            library.impl(f"{name}.out", out, "CPU")
    _REGISTERED.append(library)  # the registrations live as long as the library object


def cpu_flags() -> set:
    """The ISA flags /proc/cpuinfo lists (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cpuinfo(field: str) -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(field)), "")
    except OSError:
        return ""


ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
)
LIBRARIES = ("torch", "numpy", "scipy", "scikit-learn", "timm", "torch-fidelity", "safetensors", "pillow", "dvc")


def cpu_caches() -> Dict[str, str]:
    """cpu0's cache sizes as the kernel reports them (oneDNN sizes its blocks from them): {"L1d": "48K", ...}."""
    caches = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((index / name).read_text().strip() for name in ("level", "type", "size"))
        except OSError:
            continue
        if kind != "Instruction":
            caches[f"L{level}{'d' if kind == 'Data' else ''}"] = size
    return caches


def describe_machine() -> Dict[str, object]:
    """The CPU, its ISA flags, the libraries and the profile this process computes with (torch imported)."""
    from importlib import metadata

    import torch

    from vcarepro.core import environment

    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    versions["torch"] = torch.__version__
    flags = cpu_flags()
    settings = active()
    return {
        "cpu": _cpuinfo("model name") or platform.processor() or platform.machine(),
        "vendor": _cpuinfo("vendor_id"),
        "family_model": "/".join(_cpuinfo(f) or "?" for f in ("cpu family", "model", "stepping")),
        "caches": cpu_caches(),
        "isa": [flag for flag in ISA_FLAGS if flag in flags],
        "cores": os.cpu_count(),
        "gpu": (
            f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}" if torch.cuda.is_available() else "none"
        ),
        "python": platform.python_version(),
        "libc": " ".join(platform.libc_ver()),
        "libraries": versions,
        "packages": environment.installed(),  # every package, as lockcheck compares them
        "mkl": torch.backends.mkl.is_available() and "oneMKL " + _build_line("Math Kernel Library"),
        "onednn": _build_line("MKL-DNN"),
        "profile": settings or {"cpu": "not applied (stage not started by stages/run.py)"},
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
    }


def _build_line(marker: str) -> str:
    import torch

    line = next((line for line in torch.__config__.show().splitlines() if marker in line), "")
    return line.split("Version", 1)[-1].strip() if "Version" in line else line.strip(" -")


def main(argv=None) -> int:
    """``python -m vcarepro.core.numerics``: this process's profile and machine, as JSON (through stages/run.py:
    a stage's)."""
    enter()  # what run_stage does in every stage
    json.dump(describe_machine(), sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
