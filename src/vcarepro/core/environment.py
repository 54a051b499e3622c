"""The software a result was computed with: every installed package and its version.

``lockcheck record`` keeps the packages installed when dvc.lock was recorded (dvc.lock.machine.json). A new
release can move an output and a hash difference would not say why, so a stage under other versions says
which in one warning line (without refusing: an upgrade may be meant). docs/reproducibility.md#the-environment-lock.
"""

from __future__ import annotations

import json
import os
import re
import site
import sys
from pathlib import Path
from typing import Dict, List, Optional

MACHINE_RECORD = "dvc.lock.machine.json"  # written by python -m vcarepro.tools.lockcheck record
LOCK_FILE = "requirements/lock.txt"  # what README commands 1 and 2 install (requirements/compile writes it)
GPU_LOCK_FILE = "requirements/gpu.txt"  # the runtime's pins alone, for GPU nodes (docs/paper-scale.md)
OWN = "vca-repro"  # this project, installed editable beside the lock
INSTALLERS = ("pip", "uv")  # what installs the environment; the venv's pip and README's uv are not part of it

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def canonical(name: str) -> str:
    """A distribution's name as pip compares it (PEP 503): ``ruamel.yaml`` and ``Ruamel_YAML`` are ``ruamel-yaml``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(path: Optional[List[str]] = None) -> Dict[str, str]:
    """{name: version} of every distribution this interpreter imports from (``sys.path``), but this project and its
    installers. Read from the folders' names, ``<name>-<version>.dist-info`` as the wheel spec writes them and
    ``<name>-<version>[-py3.11].egg-info`` as setuptools does (a Debian package, a conda base): 0.6 ms for 220
    packages, where importlib.metadata parses every METADATA file (0.18 s, at every stage's start). Two versions of
    one package in one folder (a broken install) read as both, ``2.3.5 or 2.4.6``, never as one of them."""
    found: Dict[str, str] = {}
    roots = _site_roots()
    for entry in sys.path if path is None else path:
        if _vendored(entry, roots):
            continue
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip, a missing folder
            continue
        here: Dict[str, List[str]] = {}
        for folder in names:
            stem, dot, kind = folder.rpartition(".")
            if kind not in ("dist-info", "egg-info") or not dot:
                continue
            parts = stem.split("-")
            if len(parts) >= 2:
                name, version = parts[0], parts[1]
            else:  # an egg-info without a version in its name (setup.py develop): its PKG-INFO says
                name, version = stem, _egg_version(Path(entry or ".") / folder)
            here.setdefault(canonical(name), []).append(version)
        for key, versions in here.items():
            if key not in found and key != OWN and key not in INSTALLERS:  # the first on sys.path is the one imported
                found[key] = " or ".join(sorted(set(versions)))
    return dict(sorted(found.items()))


def _site_roots() -> List[str]:
    """The site-packages folders (absolute), read once per :func:`installed`."""
    roots = [*site.getsitepackages(), site.getusersitepackages()] if hasattr(site, "getsitepackages") else []
    return [os.path.abspath(root) for root in roots]


def _vendored(entry: str, roots: List[str]) -> bool:
    """A folder inside an installed package that the package put on ``sys.path`` for its own copies of others
    (setuptools appends ``setuptools/_vendor`` when it is imported, under torch's extension builder among others):
    not what the environment installed, and present in one process but not the next."""
    here = os.path.abspath(entry or ".")
    return any(here != root and here.startswith(os.path.join(root, "")) for root in roots)


def _egg_version(folder: Path) -> str:
    try:
        text = (folder / "PKG-INFO").read_text(errors="replace") if folder.is_dir() else folder.read_text()
    except OSError:
        return "unknown"
    return next((line[9:].strip() for line in text.splitlines() if line.startswith("Version: ")), "unknown")


def pins(text: str) -> Dict[str, str]:
    """{name: version} of a requirements file's ``name==version`` lines (a lock written by requirements/compile)."""
    found = {}
    for line in text.splitlines():
        match = _PIN.match(line)
        if match:
            found[canonical(match.group(1))] = match.group(2)
    return found


def differences(recorded: Dict[str, str], here: Dict[str, str], *, versions_only: bool = False) -> List[str]:
    """Each package whose version differs, as ``numpy 2.3.0 (recorded 2.4.6)``; without ``versions_only``, also
    those installed on one side only."""
    lines = []
    for name in sorted(set(recorded) | set(here)):
        was, now = recorded.get(name), here.get(name)
        if was == now:
            continue
        if was is not None and now is not None:
            lines.append(f"{name} {now} (recorded {was})")
        elif not versions_only:
            lines.append(f"{name} {now} (not recorded)" if was is None else f"{name} not installed (recorded {was})")
    return lines


def recorded_packages(root: Path) -> Optional[Dict[str, str]]:
    """The packages dvc.lock was recorded under (dvc.lock.machine.json's ``packages``); None without a record."""
    try:
        packages = json.loads((Path(root) / MACHINE_RECORD).read_text()).get("packages")
    except (OSError, ValueError, AttributeError):
        return None
    return {canonical(k): str(v) for k, v in packages.items()} if isinstance(packages, dict) else None


def moved_line(root: Path, *, versions_only: bool = False) -> Optional[str]:
    """One line naming the packages installed here at other versions than dvc.lock was recorded under; None when
    they match or nothing was recorded."""
    recorded = recorded_packages(root)
    if recorded is None:
        return None
    lines = differences(recorded, installed(), versions_only=versions_only)
    if not lines:
        return None
    return (
        f"{len(lines)} package(s) differ from those dvc.lock was recorded under ({MACHINE_RECORD}): "
        f"{', '.join(lines)}; outputs may differ from the lock's because of them (install {LOCK_FILE}, "
        "README command 1, to match it, or re-record the lock if you mean to upgrade)"
    )


def warn_if_moved(root: Path = Path(".")) -> None:
    """A stage's warning line when it runs under other package versions than the recorded ones. Only versions of
    packages installed on both sides count: a GPU node without the test extra is the same software."""
    line = moved_line(root, versions_only=True)
    if line:
        print(f"warning: {line}", file=sys.stderr, flush=True)
