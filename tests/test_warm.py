"""The warm runner: a stage's command behaves as in a fresh interpreter, only its start-up is shared."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import ROOT
from stages import warm  # the launcher beside stages/run.py (pytest puts the repository root on sys.path)

RUN = ROOT / "stages" / "run.py"
ENV = {**os.environ, "VCAREPRO_WARM_IDLE": "20"}

SCRIPT = """
import os, sys, time
print("out", os.getcwd(), os.environ.get("PROBE"), "torch" in sys.modules, sys.argv[1:], flush=True)
print("err", file=sys.stderr, flush=True)
if sys.argv[1] == "exit":
    sys.exit(int(sys.argv[2]))
if sys.argv[1] == "message":
    raise SystemExit("a stage's one-sentence error")
if sys.argv[1] == "raise":
    raise KeyError("boom")
if sys.argv[1] == "importing":  # a stage still importing torch: no handler of its own yet
    open(sys.argv[2], "w").write("importing")
    time.sleep(60)
if sys.argv[1] == "sleep":
    import signal
    signal.signal(signal.SIGTERM, lambda *a: (open(sys.argv[2], "w").write("stopped"), sys.exit(143)))
    while True:
        open(sys.argv[2] + ".beat", "w").write(str(time.time()))
        time.sleep(0.05)
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(SCRIPT)
    return path


def run(args, cwd, **env):
    return subprocess.run(
        [sys.executable, str(RUN), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**ENV, **env},
        timeout=300,
    )


def test_output_directory_environment_arguments_and_exit_status_are_the_callers(script, tmp_path):
    result = run([script, "exit", 3], tmp_path, PROBE="42")
    assert result.returncode == 3
    assert result.stdout.split()[:4] == ["out", str(tmp_path), "42", "True"]  # warm: torch was already imported
    assert "['exit', '3']" in result.stdout and result.stderr.strip() == "err"


def test_errors_end_as_a_fresh_interpreter_ends_them(script, tmp_path):
    message = run([script, "message"], tmp_path)
    assert message.returncode == 1 and message.stderr.strip().endswith("a stage's one-sentence error")
    crash = run([script, "raise"], tmp_path)
    assert crash.returncode == 1
    lines = crash.stderr.splitlines()
    assert lines[lines.index("Traceback (most recent call last):") + 1].startswith(f'  File "{script}"')  # not ours
    assert crash.stderr.strip().endswith("KeyError: 'boom'")


def test_a_fresh_interpreter_is_one_switch_away(script, tmp_path):
    result = run([script, "exit", 0], tmp_path, VCAREPRO_WARM="0")
    assert result.returncode == 0 and result.stdout.split()[3] == "False"


def test_without_the_server_a_sigterm_to_the_command_reaches_the_stage(script, tmp_path):
    """VCAREPRO_WARM=0 (a cluster job): the stage replaces stages/run.py, so the SIGTERM that a job, DVC or a
    terminal sends to the process it started stops the stage; a client waiting on a child died of it instead."""
    marker = tmp_path / "stopped.txt"
    proc = subprocess.Popen(
        [sys.executable, str(RUN), str(script), "sleep", str(marker)],
        cwd=tmp_path,
        env={**ENV, "VCAREPRO_WARM": "0"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    beat = Path(str(marker) + ".beat")
    deadline = time.monotonic() + 60
    while not beat.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 143 and marker.read_text() == "stopped"


@pytest.mark.parametrize("warm_start", ["1", "0"])
def test_ctrl_c_while_the_command_still_imports_is_one_line(script, tmp_path, warm_start):
    """Issue 49: a SIGINT before the stage's run_stage (its imports, seconds in a fresh interpreter) printed a
    KeyboardInterrupt traceback. Warm (the child) or fresh (stages/warm.py --fresh), it is the one line and 130."""
    marker = tmp_path / "importing.txt"
    proc = subprocess.Popen(
        [sys.executable, str(RUN), str(script), "importing", str(marker)],
        cwd=tmp_path,
        env={**ENV, "VCAREPRO_WARM": warm_start},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert err.splitlines()[-1] == "interrupted: the command stopped by Ctrl-C; resume with the same command", err
    assert "Traceback" not in err


def test_a_fresh_interpreter_ends_a_crash_as_a_plain_one_does(script, tmp_path):
    crash = run([script, "raise"], tmp_path, VCAREPRO_WARM="0")
    assert crash.returncode == 1
    lines = crash.stderr.splitlines()
    assert lines[lines.index("Traceback (most recent call last):") + 1].startswith(f'  File "{script}"')
    assert crash.stderr.strip().endswith("KeyError: 'boom'")


def test_modules_run_with_dash_m(tmp_path):
    result = run(["-m", "json.tool", "--help"], tmp_path)
    assert result.returncode == 0 and "json.tool" in result.stdout


def wait_for(path: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_sigterm_reaches_the_command_which_ends_as_it_chooses(script, tmp_path):
    marker = tmp_path / "marker"
    client = subprocess.Popen(
        [sys.executable, str(RUN), str(script), "sleep", str(marker)],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    wait_for(Path(str(marker) + ".beat"))
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=60) == 143 and marker.read_text() == "stopped"


def test_a_killed_client_takes_its_command_with_it(script, tmp_path):
    marker = tmp_path / "marker"
    beat = Path(str(marker) + ".beat")
    client = subprocess.Popen(
        [sys.executable, str(RUN), str(script), "sleep", str(marker)],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    wait_for(beat)
    client.kill()
    client.wait(timeout=60)
    time.sleep(1.0)
    last = beat.stat().st_mtime
    time.sleep(0.5)
    assert beat.stat().st_mtime == last  # no heartbeat any more: the command is gone
    assert not marker.exists()


def test_edited_code_gets_a_new_server(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(warm, "PACKAGE", package)
    before = warm.server_key()
    assert warm.server_key() == before
    (package / "a.py").write_text("x = 2\n")
    assert warm.server_key() != before


def test_an_edited_launcher_gets_a_new_server(tmp_path, monkeypatch):
    launcher = tmp_path / "warm.py"
    launcher.write_text("x = 1\n")
    monkeypatch.setattr(warm, "HERE", launcher)
    before = warm.server_key()
    launcher.write_text("x = 2\n")
    assert warm.server_key() != before


def test_the_client_imports_neither_the_library_nor_torch():
    """stages/run.py and its client load neither torch nor the package beyond the numerics profile, the stage clock
    and the supervisor (all torch-free, standard library only): the rest only the server and a fresh stage do."""
    probe = (
        "import sys; "
        f"sys.path.insert(0, {str(ROOT / 'stages')!r}); import run; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vcarepro', 'numpy')))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == str(
        ["vcarepro", "vcarepro.core", "vcarepro.core.numerics", "vcarepro.core.stage_clock", "vcarepro.core.supervise"]
    )


def test_the_socket_lives_in_a_folder_only_this_user_can_enter(monkeypatch, tmp_path):
    monkeypatch.setattr(warm.tempfile, "gettempdir", lambda: str(tmp_path))
    path = warm.socket_path("k")
    assert path.parent.stat().st_mode & 0o777 == 0o700 and path.name == "k.sock"
    path.parent.chmod(0o755)
    with pytest.raises(PermissionError, match="not private to this user; remove it or set VCAREPRO_WARM=0"):
        warm.socket_path("k")


def test_the_key_covers_what_torch_reads_at_import_and_not_what_varies_from_stage_to_stage():
    base = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "2", "DVC_STAGE": "train_cls@a", "PWD": "/repo"}
    key = warm.server_key(base)
    for name, value in [
        ("OMP_NUM_THREADS", "1"),
        ("MKL_NUM_THREADS", "1"),
        ("OPENBLAS_NUM_THREADS", "1"),
        ("MKL_CBWR", "COMPATIBLE"),
        ("MKL_ENABLE_INSTRUCTIONS", "AVX2"),
        ("MKL_DEBUG_CPU_TYPE", "5"),
        ("ONEDNN_MAX_CPU_ISA", "AVX2"),
        ("DNNL_MAX_CPU_ISA", "AVX2"),
        ("ONEDNN_DEFAULT_FPMATH_MODE", "BF16"),
        ("KMP_AFFINITY", "compact"),
        ("GOMP_SPINCOUNT", "0"),
        ("OMP_PROC_BIND", "true"),
        ("TORCH_LOGS", "+dynamo"),
        ("TORCHINDUCTOR_CACHE_DIR", "/c"),
        ("PYTORCH_JIT", "0"),
        ("CUDA_VISIBLE_DEVICES", ""),
        ("ATEN_CPU_CAPABILITY", "default"),
        ("TIMM_FUSED_ATTN", "0"),
        ("HF_HUB_OFFLINE", "1"),
        ("PYTHONHASHSEED", "0"),
        ("LD_PRELOAD", "/lib/x.so"),
        ("LD_LIBRARY_PATH", "/opt/lib"),
    ]:
        assert warm.server_key({**base, name: value}) != key, name
    varies = {"DVC_STAGE": "train_gen@b", "PWD": "/elsewhere", "PROBE": "1", "VCAREPRO_STAGE_STARTED": "1.5"}
    assert warm.server_key({**base, **varies}) == key  # the stage clock's start, too: one server per `dvc repro`


THREADS = """
import os, sys
warm = "torch" in sys.modules  # a warm child finds torch imported already
import torch
print(torch.get_num_threads(), warm, os.getppid(), flush=True)
"""


@pytest.mark.slow
def test_clients_with_different_thread_settings_each_get_a_server_of_their_own(tmp_path):
    probe = tmp_path / "threads.py"
    probe.write_text(THREADS)
    folder = Path(tempfile.mkdtemp(prefix="vw-", dir="/tmp"))  # a short TMPDIR: a socket's path is at most 107 bytes
    env = {k: v for k, v in ENV.items() if not k.startswith(("OMP_", "MKL_", "OPENBLAS_"))}
    servers = set()
    try:
        seen = []
        for threads in ("1", "2", "1", "2"):  # the second of each runs in the server the first one started
            result = subprocess.run(
                [sys.executable, str(RUN), str(probe)],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=300,
                env={**env, "TMPDIR": str(folder), "OMP_NUM_THREADS": threads},
            )
            assert result.returncode == 0, result.stderr[-2000:]
            count, warmed, server = result.stdout.split()
            servers.add(int(server))
            seen.append((count, warmed, server))
        assert [count for count, _, _ in seen] == ["1", "2", "1", "2"]  # each its own setting
        assert all(warmed == "True" for _, warmed, _ in seen)  # and each warm
        assert seen[0][2] == seen[2][2] != seen[1][2] == seen[3][2]  # one server for each setting, reused
        assert len(list((folder / f"vcarepro-warm-{os.getuid()}").glob("*.sock"))) == 2
    finally:
        for pid in servers:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        shutil.rmtree(folder, ignore_errors=True)
