"""The one supervisor (vcarepro.core.supervise) with real child processes: SIGTERM, the grace, SIGKILL, reaped."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vcarepro.core import supervise

# A child that ends on SIGTERM with 143 once it is ready; one that ignores SIGTERM; one that starts a grandchild
# ignoring SIGTERM in its process group and writes the grandchild's pid.
POLITE = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""
STUBBORN = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""
LEADER = """
import signal, subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE)
grandchild.stdout.readline()
open(sys.argv[2], "w").write(str(grandchild.pid))
signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def start(code: str, *args, **popen) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, **popen)
    assert proc.stdout.readline().strip() == "ready"  # its handler is set: a signal now means what the test says
    return proc


def exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie still answers kill(0): it has ended
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def group_of(pid: int):
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
    except FileNotFoundError:
        return None


def test_a_child_that_ends_on_sigterm_is_reaped_within_the_grace():
    proc = start(POLITE)
    begun = time.monotonic()
    stopped = supervise.stop(proc, 30, poll_s=0.05)
    assert stopped == supervise.Stopped([143], False)
    assert time.monotonic() - begun < 10  # not the grace: it ended as soon as it was asked
    assert proc.returncode == 143 and not exists(proc.pid)
    assert supervise.exit_status(stopped.codes[0]) == 143


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace():
    proc = start(STUBBORN)
    begun = time.monotonic()
    stopped = supervise.stop(proc, 0.5, poll_s=0.05)
    waited = time.monotonic() - begun
    assert stopped.codes == [-signal.SIGKILL] and stopped.killed
    assert 0.5 <= waited < 10
    assert supervise.exit_status(stopped.codes[0]) == 137 and not exists(proc.pid)


def test_several_children_each_get_their_end_and_one_sigkill():
    procs = [start(POLITE), start(STUBBORN), start(POLITE)]
    stopped = supervise.stop(procs, 0.5, poll_s=0.05)
    assert stopped.codes == [143, -signal.SIGKILL, 143] and stopped.killed
    assert not any(exists(p.pid) for p in procs)


def test_a_process_group_is_stopped_whole(tmp_path):
    """The leader ends on SIGTERM, its grandchild ignores it: the group counts as running until the SIGKILL."""
    pidfile = tmp_path / "grandchild"
    proc = start(LEADER, STUBBORN, str(pidfile), start_new_session=True)
    grandchild = int(pidfile.read_text())
    assert os.getpgid(grandchild) == proc.pid
    stopped = supervise.stop(proc, 0.5, group=True, poll_s=0.05)
    assert stopped.codes == [143] and stopped.killed  # the leader's own end; the grandchild outlived the grace
    assert not exists(grandchild)  # a zombie at most: here no init reaps the orphan
    assert not [
        pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if exists(pid) and group_of(pid) == proc.pid
    ]


def test_a_forked_pid_in_its_own_group_is_killed_and_reaped():
    """The warm server's way: a forked child (a pid, its own group) killed at once, its status read by waitpid."""
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(0.05)
    deadline = time.monotonic() + 10
    while os.getpgid(pid) != pid and time.monotonic() < deadline:
        time.sleep(0.01)
    stopped = supervise.stop(pid, 0, signals=(signal.SIGKILL,), group=True, poll_s=0.05)
    assert stopped.codes == [-signal.SIGKILL]
    with pytest.raises(ChildProcessError):  # reaped
        os.waitpid(pid, os.WNOHANG)


def test_infinite_grace_only_waits():
    proc = start(POLITE)
    assert supervise.stop(proc, float("inf"), poll_s=0.05) == supervise.Stopped([143], False)


def _ignore_sigterm_and_wait():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(0.05)


def test_a_multiprocessing_worker_is_killed_after_the_grace():
    worker = multiprocessing.get_context("fork").Process(target=_ignore_sigterm_and_wait)
    worker.start()
    time.sleep(0.3)  # its handler is set
    stopped = supervise.stop([worker], 0.3, poll_s=0.05)
    assert stopped.codes == [-signal.SIGKILL] and stopped.killed and not worker.is_alive()


def test_signals_received_meanwhile_are_passed_on_to_those_still_running():
    """Signals that reach the parent during the stop (``pending``) go to the children that run, in order."""
    code = """
import signal, sys, time
got = []
signal.signal(signal.SIGTERM, lambda s, f: got.append("TERM"))
signal.signal(signal.SIGHUP, lambda s, f: sys.exit(10 + len(got)))
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""
    proc = start(code)
    queue = [[], [signal.SIGHUP]]
    stopped = supervise.stop(proc, 30, pending=lambda: queue.pop(0) if queue else [], poll_s=0.05)
    assert stopped == supervise.Stopped([11], False)  # SIGTERM first, then the SIGHUP that came meanwhile


def test_kill_takes_the_tree_and_reap_bounds_the_wait():
    """The SLURM job's way: the awaited process is not the one signalled; after the grace the tree goes."""
    waited = start(STUBBORN)
    tree = [start(STUBBORN), start(STUBBORN)]
    stopped = supervise.stop(waited, 0.3, signals=(), kill=tree, reap_s=0.5, poll_s=0.05)
    assert stopped.killed
    for proc in tree:
        assert proc.wait(10) == -signal.SIGKILL
    assert waited.poll() is None  # not in the tree: past reap_s it is left as it is
    supervise.stop(waited, 0, signals=(signal.SIGKILL,))
    assert waited.returncode == -signal.SIGKILL


def test_a_tree_goes_also_when_the_awaited_process_ends_in_time():
    waited, left = start(POLITE), start(STUBBORN)
    stopped = supervise.stop(waited, 30, kill=[left], poll_s=0.05)
    assert stopped == supervise.Stopped([143], False)
    assert left.wait(10) == -signal.SIGKILL


def test_sending_to_what_has_ended_is_no_error():
    proc = start(POLITE)
    supervise.stop(proc, 30, poll_s=0.05)
    supervise.send(proc, signal.SIGTERM)
    supervise.send([proc], signal.SIGTERM, group=True)


def test_forwarding_calls_the_function_and_restores_the_handlers():
    before = signal.getsignal(signal.SIGHUP)
    got = []
    with supervise.forwarding(got.append):
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert got == [signal.SIGHUP, signal.SIGTERM]
    assert signal.getsignal(signal.SIGHUP) is before


def test_exit_status_and_names():
    assert [supervise.exit_status(c) for c in (0, 2, -15, -9)] == [0, 2, 143, 137]
    assert supervise.signal_name(15) == "SIGTERM" and supervise.signal_name(99) == "signal 99"
