"""The test tiers' own set-up (tests/conftest.py): what libgomp runs with when two pytest-xdist workers share the
machine, and when one test runs alone."""

import os
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))

# Imports conftest as a worker does, then starts a child as a test starts a pipeline stage; libgomp prints its
# settings to stderr when it loads (OMP_DISPLAY_ENV=VERBOSE), once in each process.
PROBE = f"""
import subprocess, sys
sys.path.insert(0, {TESTS!r})
import conftest
subprocess.run([sys.executable, "-c", "import torch"], check=True)
"""


def spin_counts(**env):
    """GOMP_SPINCOUNT as libgomp read it in the worker and in the worker's child: how long a waiting OpenMP thread
    spins before it sleeps (0: it sleeps at once)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "PYTEST_XDIST_WORKER_COUNT")}
    environ.update(env, OMP_DISPLAY_ENV="VERBOSE")
    result = subprocess.run([sys.executable, "-c", PROBE], env=environ, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    counts = [line.split("=")[1].strip().strip("'") for line in result.stderr.splitlines() if "GOMP_SPINCOUNT" in line]
    assert len(counts) == 2, result.stderr[-2000:]  # one display per process: the worker's and its child's
    return counts


@pytest.mark.parametrize("workers", ["2", "3"])
def test_workers_sharing_the_machine_sleep_while_they_wait_and_so_do_the_stages_they_start(workers):
    assert spin_counts(PYTEST_XDIST_WORKER_COUNT=workers) == ["0", "0"]


def test_a_lone_run_keeps_libgomps_default_spin_and_a_callers_policy_is_kept():
    default = spin_counts()
    assert default == spin_counts(PYTEST_XDIST_WORKER_COUNT="1")
    assert default[0] == default[1] and int(default[0]) > 0
    active = spin_counts(PYTEST_XDIST_WORKER_COUNT="2", OMP_WAIT_POLICY="ACTIVE")
    assert active[0] == active[1] and int(active[0]) > int(default[0])
