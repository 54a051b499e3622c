"""The software and machine a report was rendered with, and the commit it describes."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Dict, List

PACKAGES = [
    "torch",
    "torchvision",
    "timm",
    "diffusers",
    "torch-fidelity",
    "dvc",
    "dvclive",
    "numpy",
    "pandas",
    "scikit-learn",
    "vca-repro",
]


def _git(root: Path, *args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, or what platform knows."""
    fallback = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), fallback)
    except OSError:
        return fallback


def describe_environment(root: Path) -> Dict[str, object]:
    """Package versions, device, git revision (with a dirty flag) and the date, as display strings."""
    import torch

    versions: List[Dict[str, str]] = []
    for name in PACKAGES:
        if name == "torch":  # the build label (+cu130, +cpu) matters; the distribution metadata drops it
            versions.append({"package": name, "version": f"{torch.__version__} (CUDA {torch.version.cuda})"})
            continue
        try:
            versions.append({"package": name, "version": metadata.version(name)})
        except metadata.PackageNotFoundError:
            versions.append({"package": name, "version": "not installed"})
    revision = _git(root, "rev-parse", "HEAD") or "not a git checkout"
    dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    device = (
        torch.cuda.get_device_name(0) + f" (x{torch.cuda.device_count()})"
        if torch.cuda.is_available()
        else f"CPU: {cpu_name()}, {os.cpu_count()} cores"
    )
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "revision": revision + (" with uncommitted changes" if dirty and revision != "not a git checkout" else ""),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "packages": versions,
    }
