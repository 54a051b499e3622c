"""Ctrl-C (issue 49): a long-running command stops within 2 s of SIGINT, prints exactly one `interrupted: ...; resume
with ...` line and no traceback, exits 130 and leaves no process of its group behind. Each command starts in its own
session with SIGINT ignored, as a background job of a non-interactive shell inherits it (the worst case: Python then
installs no handler of its own), and the signal goes to the whole process group, as a terminal's Ctrl-C does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.alone]

STOP_WITHIN_S = 2.0


def _interrupt(
    argv,
    started,
    cwd=None,
    timeout: float = 120.0,
    delay: float = 8.0,
    sigint=signal.SIG_IGN,
    env=None,
    kin=None,
    signum=signal.SIGINT,
):
    """Start argv, wait until stderr shows `started`, SIGINT its process group; return (status, stderr, seconds).
    Another ``signum`` (SIGTERM: `timeout`, a scheduler) goes to the command's own process alone."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
    )
    seen = threading.Event()
    lines: list[str] = []

    def read():
        for line in proc.stderr:
            lines.append(line)
            if started is not None and started in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if started is None:  # nothing on stderr while it runs: give it time to get past its imports
            time.sleep(delay)
        else:
            assert seen.wait(timeout), "never started:\n" + "".join(lines)
            time.sleep(0.5)
        pgid = proc.pid
        family = psutil.Process(proc.pid).children(recursive=True)  # its own sessions' processes too
        if kin is not None:
            kin.extend(" ".join(_cmdline(p)) for p in family)  # read while they run
        sent = time.monotonic()
        if signum == signal.SIGINT:
            os.killpg(pgid, signal.SIGINT)
        else:
            os.kill(proc.pid, signum)
        status = proc.wait(timeout=30)
        took = time.monotonic() - sent
        reader.join(5)
        time.sleep(0.2)
        left = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == pgid]
        left += [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not left, f"left behind: {[(p, _cmdline(p)) for p in left]}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return status, "".join(lines), took


def _pgid(pid: int):
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _check(status, err, took, resume: str):
    print(f"stopped {took:.2f} s after SIGINT")
    assert status == 130, err
    assert took < STOP_WITHIN_S, f"took {took:.2f} s\n{err}"
    assert "Traceback" not in err, err
    ours = [line for line in err.splitlines() if line.startswith("interrupted:")]
    assert len(ours) == 1, err
    assert f"resume with {resume}" in ours[0]


def test_preflight_stops_on_ctrl_c():
    argv = [sys.executable, "-m", "vcarepro.tools.preflight", "--scale", "paper", "--runs", "deit_tiny-vca"]
    status, err, took = _interrupt(argv, started=None, delay=5.0)  # while it steps (the run takes ~10 s)
    _check(status, err, took, "the same command")
    assert "the preflight" in err


def test_bench_stops_on_ctrl_c(tmp_path):
    argv = [
        sys.executable,
        "-m",
        "vcarepro.tools.bench",
        "attention",
        "--no-compile",
        "--json",
        str(tmp_path / "b.json"),
    ]
    status, err, took = _interrupt(argv, started=None)
    _check(status, err, took, "the same command")
    assert "the benchmark" in err


STAGE = """import sys, time
from vcarepro.core.errors import run_stage
def main():
    print("stage running", file=sys.stderr, flush=True)
    time.sleep(60)
run_stage(main)
"""


# DVC runs a stage as `$SHELL -c cmd` ($SHELL unset: /bin/sh). bash execs the one command, so DVC sees the stage's
# own 130; dash (Debian's /bin/sh) forks it and dies of the same SIGINT itself, so DVC reports -2 (CI's case).
DVC_SEES = {"/bin/bash": "exited with 130", "/bin/sh": "exited with -2"}


@pytest.mark.parametrize("shell", sorted(DVC_SEES))
def test_dvc_repro_stops_on_ctrl_c(tmp_path, shell):
    """A terminal's Ctrl-C on `dvc repro` (SIGINT to the whole group): the stage prints our one line and exits 130,
    DVC adds its own `ERROR: failed to reproduce ...` line and exits 255 (measured, DVC 3)."""
    if not os.path.exists(shell):
        pytest.skip(f"no {shell} here")
    dvc = os.path.join(os.path.dirname(sys.executable), "dvc")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([dvc, "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "s.py").write_text(STAGE)
    (tmp_path / "dvc.yaml").write_text(f"stages:\n  slow:\n    cmd: {sys.executable} s.py\n    deps: [s.py]\n")
    env = {**os.environ, "SHELL": shell}
    status, err, took = _interrupt(
        [dvc, "repro"], started="stage running", cwd=tmp_path, sigint=signal.SIG_DFL, env=env
    )
    print(f"dvc stopped {took:.2f} s after SIGINT")
    assert status == 255, err
    assert took < STOP_WITHIN_S, err
    assert "Traceback" not in err, err
    ours = [line for line in err.splitlines() if line.startswith("interrupted:")]
    assert ours == ["interrupted: stage slow stopped by Ctrl-C; resume with `dvc repro`"], err
    theirs = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert len(theirs) == 1 and theirs[0].endswith(DVC_SEES[shell]), err


def test_gpu_check_stops_on_ctrl_c_with_its_torchrun_rank(tmp_path):
    """The GPU check (tiny, on this CPU) starts its DDP part through torchrun beside the steps part: Ctrl-C while
    it steps stops both, says one line and leaves neither torchrun nor its rank behind."""
    argv = [sys.executable, "-m", "vcarepro.tools.gpu_check", "--tiny", "--no-compile", "--out", str(tmp_path / "gc")]
    kin = []
    status, err, took = _interrupt(argv, started="gpu-check: steps: deit_tiny-vca", kin=kin)
    _check(status, err, took, "the same command")
    assert "the GPU check" in err
    assert any("torchrun" in line or "ddp_worker" in line for line in kin), kin  # they did run, and were stopped


@pytest.mark.parametrize(
    ("signum", "status", "line"),
    [
        (
            signal.SIGTERM,
            143,
            "stopped: the GPU check ended by SIGTERM, with every process it started; run the same command again",
        ),
        (
            signal.SIGHUP,
            129,
            "stopped: the GPU check ended by SIGHUP, with every process it started; run the same command again",
        ),
        (signal.SIGINT, 130, "interrupted: the GPU check stopped by Ctrl-C; resume with the same command"),
    ],
    ids=["sigterm", "sighup", "ctrl-c"],
)
def test_gpu_check_stopped_while_its_ddp_part_waits_leaves_no_torchrun(tmp_path, signum, status, line):
    """SIGTERM (`timeout`, scancel: to the command alone) or Ctrl-C while the DDP part waits in its thread for
    torchrun. torchrun and its rank run in sessions of their own and the thread's ``finally`` never runs, so only
    the command's own exit can stop them. One line, 143 or 130, nothing left."""
    argv = [sys.executable, "-m", "vcarepro.tools.gpu_check", "--tiny", "--no-compile", "--parts", "ddp"]
    kin = []
    got, err, took = _interrupt(
        argv + ["--out", str(tmp_path / "gc")], started="gpu-check: ddp: one DDP step", kin=kin, signum=signum
    )
    print(f"stopped {took:.2f} s after {signal.Signals(signum).name}")
    assert got == status, err
    assert took < STOP_WITHIN_S, f"took {took:.2f} s\n{err}"
    assert "Traceback" not in err, err
    assert [x for x in err.splitlines() if x.startswith(("stopped:", "interrupted:"))] == [line], err
    assert any("torchrun" in x or "ddp_worker" in x for x in kin), kin  # they did run, and were stopped


def _cmdline(process):
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def test_dvc_exp_run_stops_on_ctrl_c(tmp_path):
    """`dvc exp run` (in the workspace) as `dvc repro`: our line, DVC's own failure line, no traceback."""
    dvc = os.path.join(os.path.dirname(sys.executable), "dvc")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([dvc, "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "s.py").write_text(STAGE)
    (tmp_path / "params.yaml").write_text("seconds: 60\n")
    (tmp_path / "dvc.yaml").write_text(
        f"stages:\n  slow:\n    cmd: {sys.executable} s.py\n    deps: [s.py]\n    params: [seconds]\n"
    )
    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "s"], cwd=tmp_path, check=True)
    env = {**os.environ, "SHELL": "/bin/bash"}
    status, err, took = _interrupt(
        [dvc, "exp", "run"], started="stage running", cwd=tmp_path, sigint=signal.SIG_DFL, env=env
    )
    print(f"dvc exp run stopped {took:.2f} s after SIGINT, status {status}")
    assert took < STOP_WITHIN_S, err
    assert "Traceback" not in err, err
    ours = [line for line in err.splitlines() if line.startswith("interrupted:")]
    assert ours == ["interrupted: stage slow stopped by Ctrl-C; resume with the same `dvc exp run`"], err
    assert status != 0
