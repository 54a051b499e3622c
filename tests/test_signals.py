"""Signals, through real processes: the one supervisor (vcarepro.core.supervise) with real children; Ctrl-C (SIGINT),
SIGTERM and SIGHUP to a long-running command; SIGTERM and SIGKILL to a training process, to one rank of a real
2-process gloo launch and to a real `dvc repro` of a micro pipeline; a second `dvc repro` while one runs (its stage
paused by SIGSTOP). What each guarantees: docs/faults.md, "The faults tried"."""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
import yaml
from safetensors.torch import load_file

from helpers import ROOT, TRAIN_DRIVER, TRAINED, micro_params, reproduced_repo, same_weights, sh, train_tiny
from vcarepro.core import supervise
from vcarepro.params.config import compose
from vcarepro.train.checkpoint import load_checkpoint

DVC = os.path.join(os.path.dirname(sys.executable), "dvc")


def _pgid(pid: int):
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def group(pgid: int) -> list:
    """Every process of the process group ``pgid``, zombies too."""
    return [p for p in psutil.process_iter() if _pgid(p.pid) == pgid]


def alive(pid: int) -> bool:
    """The process runs: a zombie has ended."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.is_file():
        assert process.poll() is None, f"it ended before {path} appeared"
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.02)


# -- the supervisor: SIGTERM, the grace, SIGKILL, reaped ---------------------------------------------------------


def child(on_sigterm: str, before: str = "") -> str:
    """A child's code: ``before``, its SIGTERM handler, then "ready" once set, and a wait for ever."""
    return (
        f"import signal, subprocess, sys, time\n{before}signal.signal(signal.SIGTERM, {on_sigterm})\n"
        "print('ready', flush=True)\nwhile True:\n    time.sleep(0.05)\n"
    )


# A child that ends on SIGTERM with 143; one that ignores SIGTERM; one that starts a grandchild ignoring SIGTERM in
# its process group and writes the grandchild's pid.
POLITE = child("lambda *a: sys.exit(143)")
STUBBORN = child("signal.SIG_IGN")
LEADER = child(
    "lambda *a: sys.exit(143)",
    before="grandchild = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdout=subprocess.PIPE)\n"
    "grandchild.stdout.readline()\nopen(sys.argv[2], 'w').write(str(grandchild.pid))\n",
)


def ready(code: str, *args, **popen) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, **popen)
    assert proc.stdout.readline().strip() == "ready"  # its handler is set: a signal now means what the test says
    return proc


def test_a_child_that_ends_on_sigterm_is_reaped_within_the_grace():
    proc = ready(POLITE)
    begun = time.monotonic()
    stopped = supervise.stop(proc, 30, poll_s=0.05)
    assert stopped == supervise.Stopped([143], False)
    assert time.monotonic() - begun < 10  # not the grace: it ended as soon as it was asked
    assert proc.returncode == 143 and not alive(proc.pid)
    assert supervise.exit_status(stopped.codes[0]) == 143


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace():
    proc = ready(STUBBORN)
    begun = time.monotonic()
    stopped = supervise.stop(proc, 0.5, poll_s=0.05)
    waited = time.monotonic() - begun
    assert stopped.codes == [-signal.SIGKILL] and stopped.killed
    assert 0.5 <= waited < 10
    assert supervise.exit_status(stopped.codes[0]) == 137 and not alive(proc.pid)


def test_several_children_each_get_their_end_and_one_sigkill():
    procs = [ready(POLITE), ready(STUBBORN), ready(POLITE)]
    stopped = supervise.stop(procs, 0.5, poll_s=0.05)
    assert stopped.codes == [143, -signal.SIGKILL, 143] and stopped.killed
    assert not any(alive(p.pid) for p in procs)


def test_a_process_group_is_stopped_whole(tmp_path):
    """The leader ends on SIGTERM, its grandchild ignores it: the group counts as running until the SIGKILL."""
    pidfile = tmp_path / "grandchild"
    proc = ready(LEADER, STUBBORN, str(pidfile), start_new_session=True)
    grandchild = int(pidfile.read_text())
    assert os.getpgid(grandchild) == proc.pid
    stopped = supervise.stop(proc, 0.5, group=True, poll_s=0.05)
    assert stopped.codes == [143] and stopped.killed  # the leader's own end; the grandchild outlived the grace
    assert not alive(grandchild)  # a zombie at most: here no init reaps the orphan
    assert not [p for p in group(proc.pid) if alive(p.pid)]


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
    proc = ready(POLITE)
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
    code = child(
        "lambda s, f: got.append('TERM')",
        before="got = []\nsignal.signal(signal.SIGHUP, lambda s, f: sys.exit(10 + len(got)))\n",
    )
    proc = ready(code)
    queue = [[], [signal.SIGHUP]]
    stopped = supervise.stop(proc, 30, pending=lambda: queue.pop(0) if queue else [], poll_s=0.05)
    assert stopped == supervise.Stopped([11], False)  # SIGTERM first, then the SIGHUP that came meanwhile


def test_kill_takes_the_tree_and_reap_bounds_the_wait():
    """The SLURM job's way: the awaited process is not the one signalled; after the grace the tree goes."""
    waited = ready(STUBBORN)
    tree = [ready(STUBBORN), ready(STUBBORN)]
    stopped = supervise.stop(waited, 0.3, signals=(), kill=tree, reap_s=0.5, poll_s=0.05)
    assert stopped.killed
    for proc in tree:
        assert proc.wait(10) == -signal.SIGKILL
    assert waited.poll() is None  # not in the tree: past reap_s it is left as it is
    supervise.stop(waited, 0, signals=(signal.SIGKILL,))
    assert waited.returncode == -signal.SIGKILL


def test_a_tree_goes_also_when_the_awaited_process_ends_in_time():
    waited, left = ready(POLITE), ready(STUBBORN)
    stopped = supervise.stop(waited, 30, kill=[left], poll_s=0.05)
    assert stopped == supervise.Stopped([143], False)
    assert left.wait(10) == -signal.SIGKILL


def test_sending_to_what_has_ended_is_no_error():
    proc = ready(POLITE)
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


# -- Ctrl-C and SIGTERM to a command ------------------------------------------------------------------------------
# A long-running command stops within 2 s of SIGINT, prints exactly one `interrupted: ...; resume with ...` line and
# no traceback, exits 130 and leaves no process of its group behind. Each command starts in its own session with
# SIGINT ignored, as a background job of a non-interactive shell inherits it (the worst case: Python then installs
# no handler of its own), and the signal goes to the whole process group, as a terminal's Ctrl-C does.

STOP_WITHIN_S = 2.0


def _cmdline(process):
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _catches_sigint(pid: int, timeout: float) -> bool:
    """Whether the process has its own SIGINT handler within ``timeout`` s (SigCgt in /proc: the command started
    ignoring it, as a background job does, until its run_stage installs one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            caught = next(
                line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigCgt")
            )
        except (OSError, StopIteration):
            return False
        if int(caught.split()[1], 16) & (1 << (signal.SIGINT - 1)):
            return True
        time.sleep(0.05)
    return False


def _interrupt(argv, started, cwd=None, delay=8.0, sigint=signal.SIG_IGN, env=None, kin=None, signum=signal.SIGINT):
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
        if started is None:  # nothing on stderr while it runs: past its imports (2 to 15 s), then into its work
            assert _catches_sigint(proc.pid, 120), "never caught SIGINT:\n" + "".join(lines)
            time.sleep(delay)
        else:
            assert seen.wait(120), "never started:\n" + "".join(lines)
            time.sleep(0.5)
        family = psutil.Process(proc.pid).children(recursive=True)  # its own sessions' processes too
        if kin is not None:
            kin.extend(" ".join(_cmdline(p)) for p in family)  # read while they run
        sent = time.monotonic()
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signum)
        status = proc.wait(timeout=30)
        took = time.monotonic() - sent
        reader.join(5)
        time.sleep(0.2)
        left = group(proc.pid) + [p for p in family if p.is_running() and alive(p.pid)]
        assert not left, f"left behind: {[(p, _cmdline(p)) for p in left]}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = "".join(lines)
    print(f"stopped {took:.2f} s after {signal.Signals(signum).name}")
    assert took < STOP_WITHIN_S, f"took {took:.2f} s\n{err}"
    assert "Traceback" not in err, err
    return status, err


def said(err: str, *starts: str) -> list:
    """The lines of ``err`` that start with one of ``starts``."""
    return [line for line in err.splitlines() if line.startswith(starts)]


def _check(status, err, resume: str):
    assert status == 130, err
    ours = said(err, "interrupted:")
    assert len(ours) == 1, err
    assert f"resume with {resume}" in ours[0]


@pytest.mark.alone
def test_preflight_stops_on_ctrl_c():
    argv = [sys.executable, "-m", "vcarepro.tools.preflight", "--scale", "paper", "--runs", "deit_tiny-vca"]
    status, err = _interrupt(argv, started=None, delay=1.0)  # while it steps (the run takes ~10 s)
    _check(status, err, "the same command")
    assert "the preflight" in err


@pytest.mark.alone
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
    status, err = _interrupt(argv, started=None, delay=2.0)
    _check(status, err, "the same command")
    assert "the benchmark" in err


SLOW_STAGE = """import sys, time
from vcarepro.core.errors import run_stage
def main():
    print("stage running", file=sys.stderr, flush=True)
    time.sleep(60)
run_stage(main)
"""


def slow_stage_repo(repo: Path, params: str = "") -> Path:
    """A git and DVC repository whose one stage, `slow`, runs a minute under vcarepro's run_stage."""
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([DVC, "init", "-q"], cwd=repo, check=True)
    (repo / "s.py").write_text(SLOW_STAGE)
    (repo / "dvc.yaml").write_text(f"stages:\n  slow:\n    cmd: {sys.executable} s.py\n    deps: [s.py]\n{params}")
    return repo


# DVC runs a stage as `$SHELL -c cmd` ($SHELL unset: /bin/sh). bash execs the one command, so DVC sees the stage's
# own 130; dash (Debian's /bin/sh) forks it and dies of the same SIGINT itself, so DVC reports -2 (CI's case).
DVC_SEES = {"/bin/bash": "exited with 130", "/bin/sh": "exited with -2"}


@pytest.mark.alone
@pytest.mark.parametrize("shell", sorted(DVC_SEES))
def test_dvc_repro_stops_on_ctrl_c(tmp_path, shell):
    """A terminal's Ctrl-C on `dvc repro` (SIGINT to the whole group): the stage prints our one line and exits 130,
    DVC adds its own `ERROR: failed to reproduce ...` line and exits 255 (measured, DVC 3)."""
    if not os.path.exists(shell):
        pytest.skip(f"no {shell} here")
    env = {**os.environ, "SHELL": shell}
    status, err = _interrupt([DVC, "repro"], "stage running", slow_stage_repo(tmp_path), sigint=signal.SIG_DFL, env=env)
    assert status == 255, err
    assert said(err, "interrupted:") == ["interrupted: stage slow stopped by Ctrl-C; resume with `dvc repro`"], err
    theirs = said(err, "ERROR:")
    assert len(theirs) == 1 and theirs[0].endswith(DVC_SEES[shell]), err


@pytest.mark.alone
def test_dvc_exp_run_stops_on_ctrl_c(tmp_path):
    """`dvc exp run` (in the workspace) as `dvc repro`: our line, DVC's own failure line, no traceback."""
    repo = slow_stage_repo(tmp_path, "    params: [seconds]\n")
    (repo / "params.yaml").write_text("seconds: 60\n")
    sh("git add -A && git -c user.name=t -c user.email=t@t commit -qm s", repo)
    env = {**os.environ, "SHELL": "/bin/bash"}
    status, err = _interrupt([DVC, "exp", "run"], "stage running", repo, sigint=signal.SIG_DFL, env=env)
    assert said(err, "interrupted:") == [
        "interrupted: stage slow stopped by Ctrl-C; resume with the same `dvc exp run`"
    ], err
    assert status != 0


GPU_CHECK = [sys.executable, "-m", "vcarepro.tools.gpu_check", "--tiny", "--no-compile"]


@pytest.mark.alone
def test_gpu_check_stops_on_ctrl_c_with_its_torchrun_rank(tmp_path):
    """The GPU check (tiny, on this CPU) starts its DDP part through torchrun beside the steps part: Ctrl-C while
    it steps stops both, says one line and leaves neither torchrun nor its rank behind."""
    kin = []
    status, err = _interrupt(GPU_CHECK + ["--out", str(tmp_path / "gc")], "gpu-check: steps: deit_tiny-vca", kin=kin)
    _check(status, err, "the same command")
    assert "the GPU check" in err
    assert any("torchrun" in line or "ddp_worker" in line for line in kin), kin  # they did run, and were stopped


@pytest.mark.alone
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
    argv = GPU_CHECK + ["--parts", "ddp", "--out", str(tmp_path / "gc")]
    kin = []
    got, err = _interrupt(argv, "gpu-check: ddp: one DDP step", kin=kin, signum=signum)
    assert got == status, err
    assert said(err, "stopped:", "interrupted:") == [line], err
    assert any("torchrun" in x or "ddp_worker" in x for x in kin), kin  # they did run, and were stopped


# -- SIGTERM or SIGKILL to a training process: the re-run finishes with the uninterrupted result -------------------


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    results = {}
    for branch in ("cls", "gen"):
        workdir = tmp_path_factory.mktemp(f"straight_{branch}")
        out = train_tiny(branch, workdir)
        results[branch] = (load_file(str(workdir / "out" / TRAINED[branch])), out.split("finished", 1)[1])
    return results


@pytest.mark.slow
@pytest.mark.parametrize("branch", ["cls", "gen"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_killed_run_resumes_to_the_uninterrupted_result(tmp_path, uninterrupted, branch, signum):
    process = subprocess.Popen(
        [sys.executable, str(TRAIN_DRIVER), branch, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    checkpoint = tmp_path / "ckpt" / "last.pt"
    wait_for(checkpoint, process)  # kill it once it has something to resume from
    process.send_signal(signum)
    _, err = process.communicate(timeout=300)
    if signum == signal.SIGTERM:
        assert process.returncode == 143, err[-2000:]  # stopped, not finished: DVC keeps no outputs
        assert "stopped by SIGTERM" in err and "re-run `dvc repro` to resume" in err
        if branch == "gen":  # SIGTERM writes a checkpoint at the very step it stopped, between ckpt_every ones
            stopped_at = int(err.split("stopped by SIGTERM at step ")[1].split()[0])
            assert load_checkpoint(tmp_path / "ckpt" / "last.pt")["step"] == stopped_at
    else:
        assert process.returncode == -signal.SIGKILL
    assert not (tmp_path / "out" / TRAINED[branch]).exists()  # nothing finished-looking
    state = load_checkpoint(checkpoint)
    progress = state["epoch"] if branch == "cls" else state["step"]
    assert 0 < progress < (8 if branch == "cls" else 600)

    out = train_tiny(branch, tmp_path)
    weights, figures = uninterrupted[branch]
    assert same_weights(tmp_path / "out" / TRAINED[branch], weights)
    assert out.split("finished", 1)[1].split("'train_seconds'")[0] == figures.split("'train_seconds'")[0]


# -- SIGTERM to one rank of a 2-process launch, to a whole `dvc repro`; a second `dvc repro` while one runs -------
# Every process a test here starts (DVC, the shells, the warm server and the children it forks, the ranks) carries
# a marker in its environment and is killed by pid when the test ends, whatever happened.

MARK = "VCAREPRO_FAULTS_TEST"
RUN = "deit_tiny-vca"
TRAIN = f"train_cls@{RUN}"


def marked(token: str) -> list:
    """Pids of the live processes whose environment holds ``MARK=token``."""
    pids = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.environ().get(MARK) == token:
                pids.append(process.pid)
        except psutil.Error:  # gone, or not ours
            pass
    return pids


@pytest.fixture
def token(monkeypatch):
    """A marker for this test's processes, all killed at its end; its own warm server (a private TMPDIR,
    short enough for a Unix socket path) that idles out in 5 s."""
    value = uuid.uuid4().hex
    tmp = tempfile.mkdtemp(prefix="vcf")
    monkeypatch.setenv(MARK, value)
    monkeypatch.setenv("TMPDIR", tmp)
    monkeypatch.setenv("VCAREPRO_WARM_IDLE", "5")
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    try:
        yield value
    finally:
        for pid in marked(value):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)


def rank_pids(launcher: subprocess.Popen, timeout: float = 120) -> dict:
    """{rank: pid} of the launcher's two rank processes (their RANK variable)."""
    deadline = time.monotonic() + timeout
    while True:
        ranks = {}
        for child in psutil.Process(launcher.pid).children():
            try:  # before its exec a child still has the launcher's environment, without RANK
                env = child.environ()
            except psutil.Error:
                continue
            if "RANK" in env:
                ranks[int(env["RANK"])] = child.pid
        if len(ranks) == 2:
            return ranks
        assert launcher.poll() is None and time.monotonic() < deadline, "the launcher did not start two ranks"
        time.sleep(0.05)


@pytest.mark.alone
def test_sigterm_to_one_rank_stops_both_and_the_rerun_resumes_to_the_uninterrupted_bits(tmp_path, token):
    epochs = 4
    params = compose([])
    params["cls_runs"] = {RUN: {**params["cls_runs"][RUN], "seeds": [0]}}
    params["cls_shape"].update(depth=1, embed_dim=32)
    params["cls_recipe_overrides"].update(epochs=epochs, batch_size=128)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    # one thread a rank: two ranks of two threads each on two cores run some 10x slower
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    prepare = [sys.executable, str(ROOT / "stages" / "prepare_cls.py")]
    subprocess.run(prepare, cwd=tmp_path, env=env, check=True, capture_output=True)
    launcher = [sys.executable, "-m", "vcarepro.train.launch", "--nproc-per-node", "2", "--rdzv-endpoint", "file"]
    command = launcher + [str(ROOT / "stages" / "train_cls.py"), "--run", RUN]

    def launch():
        return subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    weights = tmp_path / "runs" / "cls" / RUN / "train" / "seed_0" / "model.safetensors"
    ckpt = tmp_path / "checkpoints" / "cls" / RUN / "seed_0" / "last.pt"
    straight = launch()
    out, err = straight.communicate(timeout=600)
    assert straight.returncode == 0, err[-3000:]
    uninterrupted = load_file(str(weights))
    shutil.rmtree(tmp_path / "runs")
    shutil.rmtree(tmp_path / "checkpoints")

    stopped = launch()
    ranks = rank_pids(stopped)
    wait_for(ckpt, stopped)  # epoch 1 is done on both ranks: each is inside its training loop
    os.kill(ranks[1], signal.SIGTERM)  # the one rank a node's preemption reached
    signalled = time.monotonic()
    out, err = stopped.communicate(timeout=300)
    took = time.monotonic() - signalled
    assert stopped.returncode == 143, err[-3000:]
    assert took < 60, took
    # both ranks stopped themselves at the same batch, the flag having been all-reduced
    stops = re.findall(rf"train_cls {RUN} seed 0: stopped by SIGTERM at epoch (\d+), batch (\d+);", err)
    assert len(stops) == 2 and stops[0] == stops[1], err[-3000:]
    assert re.search(r"launch: rank [01] exited with status 143;", err), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    kept = load_checkpoint(ckpt)
    assert 1 <= kept["epoch"] < epochs and kept["epoch"] == int(stops[0][0]) - 1
    assert not weights.exists()  # nothing finished-looking

    resumed = launch()
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    assert f"seed 0: resuming at epoch {kept['epoch'] + 1} of {epochs} from {ckpt.relative_to(tmp_path)}" in out, out
    assert same_weights(weights, uninterrupted)


def micro_repo(tmp_path: Path, epochs: int) -> Path:
    """The micro pipeline with one classification run of ``epochs`` epochs (some 1.5 s each on two busy cores),
    its data prepared and recorded in dvc.lock."""
    params = micro_params(cls_runs=[RUN], gen_runs=[])
    params["cls_recipe_overrides"]["epochs"] = epochs
    return reproduced_repo(tmp_path / "repo", params, targets="prepare_cls")


def start_repro(repo: Path) -> subprocess.Popen:
    """`dvc repro TRAIN` in its own session, as a terminal or a job scheduler starts it."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.Popen(
        ["dvc", "repro", TRAIN],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def checkpoint(repo: Path) -> Path:
    return repo / "checkpoints" / "cls" / RUN / "seed_0" / "last.pt"


def stage_recorded(repo: Path) -> bool:
    lock = repo / "dvc.lock"
    return lock.is_file() and TRAIN in yaml.safe_load(lock.read_text())["stages"]


def job_left(token: str) -> list:
    """This test's processes other than its idle warm server (which leads its own session)."""
    return [pid for pid in marked(token) if os.getsid(pid) != pid]


def clean(repo: Path) -> None:
    status = sh(f"dvc status {TRAIN}", repo)
    assert "Data and pipelines are up to date" in status.stdout, status.stdout


@pytest.mark.alone
def test_sigterm_to_the_dvc_repro_process_group_stops_within_seconds_and_the_next_repro_resumes(tmp_path, token):
    epochs = 6
    repo = micro_repo(tmp_path, epochs)
    lock = (repo / "dvc.lock").read_bytes()
    repro = start_repro(repo)
    try:
        wait_for(checkpoint(repo), repro)
        os.killpg(repro.pid, signal.SIGTERM)  # dvc, its shell, the warm client: the whole job
        signalled = time.monotonic()
        out, err = repro.communicate(timeout=120)  # the pipes close once the stage's own process has gone too
        took = time.monotonic() - signalled
    finally:
        if repro.poll() is None:
            os.killpg(repro.pid, signal.SIGKILL)
    assert repro.returncode != 0, out[-3000:]
    assert took < 10, took  # a stop at the next batch: about 0.5 s here
    assert not job_left(token)
    assert f"train_cls {RUN} seed 0: stopped by SIGTERM at epoch" in err, err[-3000:]
    assert (repo / "dvc.lock").read_bytes() == lock and not stage_recorded(repo)  # DVC recorded nothing
    kept = load_checkpoint(checkpoint(repo))
    assert 1 <= kept["epoch"] < epochs
    weights = repo / "runs" / "cls" / RUN / "train" / "seed_0" / "model.safetensors"
    assert not weights.exists()

    again = sh(f"dvc repro {TRAIN}", repo)
    assert f"seed 0: resuming at epoch {kept['epoch'] + 1} of {epochs} from" in again.stdout, again.stdout[-3000:]
    assert stage_recorded(repo) and weights.is_file()
    assert load_checkpoint(checkpoint(repo))["epoch"] == epochs
    clean(repo)


@pytest.mark.alone
def test_a_second_dvc_repro_is_refused_while_one_runs_and_the_first_finishes(tmp_path, token):
    epochs = 8
    repo = micro_repo(tmp_path, epochs)
    lock = (repo / "dvc.lock").read_bytes()
    first = start_repro(repo)
    try:
        wait_for(checkpoint(repo), first)  # inside the stage's command, training
        # Paused while the second tries (SIGSTOP, SIGCONT: nothing the training sees), so that it still runs
        # then however fast the machine is: an epoch takes 0.15 s on two idle cores, 1.5 s on busy ones.
        # The stage's own process is a child of the warm server, leading its own process group.
        stage = [pid for pid in job_left(token) if os.getpgid(pid) == pid]
        assert len(stage) == 1, stage
        os.killpg(stage[0], signal.SIGSTOP)
        try:
            second = sh(f"dvc repro {TRAIN}", repo, check=False)
            assert first.poll() is None, "the first run ended before the second was refused"
        finally:
            os.killpg(stage[0], signal.SIGCONT)
        out, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert second.returncode != 0, second.stdout[-3000:]
    # DVC lets go of its repository lock while a stage's command runs; the stage's read/write lock on its
    # dependencies and outputs (.dvc/tmp/rwlock) is what refuses the second, naming the first
    assert "is busy, it is being blocked by:" in second.stderr, second.stderr
    assert f"(PID {first.pid}): " in second.stderr and f"dvc repro {TRAIN}" in second.stderr, second.stderr
    assert "Running stage" not in second.stdout
    assert first.returncode == 0, err[-3000:]
    assert "stopped by SIGTERM" not in err and "resuming" not in out, out[-3000:]  # undisturbed: one straight run
    assert f"train_cls {RUN} seed 0: epoch={epochs}," in out, out[-3000:]
    assert (repo / "dvc.lock").read_bytes() != lock and stage_recorded(repo)
    assert (repo / "runs" / "cls" / RUN / "train" / "seed_0" / "model.safetensors").is_file()
    clean(repo)
