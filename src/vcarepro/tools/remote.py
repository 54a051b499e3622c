"""DVC's command line as the cluster driver calls it (its environment, a failure's last line), and the workspace's
default DVC remote, which the driver backs its results up to (docs/cluster.md, docs/lab.md).

Everything goes through DVC's own command line (``dvc push STAGE``, ``dvc status --cloud``), so what a push
sends, retries and verifies stays DVC's, and a push this code starts is one a researcher could type.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

DVC_TIMEOUT = 3600  # seconds a push or a look at the remote may take (DVC's own timeouts end a dead connection first)


def dvc_env() -> Dict[str, str]:
    """The environment every DVC command this package starts runs in: DVC never phones home."""
    return {**os.environ, "DVC_NO_ANALYTICS": "1"}


def last_line(text: str) -> str:
    """A failed command's last line, which says why; DVC's "Having any troubles?" footer is not that line."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and "Having any troubles" not in line]
    return lines[-1] if lines else "no message"


def _dvc(root: Path, *args: str, timeout: float = DVC_TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=root, capture_output=True, text=True, env=dvc_env(), timeout=timeout
    )


def default_remote(root: Path) -> str:
    """The name of the workspace's default remote, or "" when it has none."""
    done = _dvc(root, "remote", "default", timeout=120)
    return done.stdout.strip() if done.returncode == 0 else ""


def push_stage(root: Path, stage: str) -> Optional[str]:
    """Push ``stage``'s outputs to the default remote (``dvc push STAGE``, waiting for DVC's lock while a job
    records its own stage); None when they are all there, else DVC's last line."""
    try:
        done = _dvc(root, "--wait-for-lock", "push", stage)
    except subprocess.TimeoutExpired:
        return f"`dvc push {stage}` took over {DVC_TIMEOUT} s"
    return None if done.returncode == 0 else last_line(done.stderr + done.stdout)


def not_pushed(root: Path) -> Tuple[List[str], Optional[str]]:
    """The outputs in the workspace's cache that the default remote lacks (``dvc status --cloud``), and None; or
    [] and DVC's last line when it could not tell."""
    try:
        done = _dvc(root, "--wait-for-lock", "status", "--cloud", "--json")
    except subprocess.TimeoutExpired:
        return [], f"`dvc status --cloud` took over {DVC_TIMEOUT} s"
    if done.returncode != 0:
        return [], last_line(done.stderr + done.stdout)
    try:
        status = json.loads(done.stdout or "{}")
    except json.JSONDecodeError:
        return [], last_line(done.stdout)
    return sorted(path for path, state in status.items() if state == "new"), None
