"""Run a stage's Python command in a warm interpreter: torch and timm imported once per server, not once per stage.

``python stages/run.py SCRIPT ARGS...`` (or ``-m MODULE ARGS...``) hands its command line, directory,
environment and stdio descriptors over a Unix socket to a local server, which forks a child to run it
(:mod:`runpy`, as ``__main__``); the exit status or signal comes back, and SIGINT / SIGTERM / SIGHUP are
forwarded to the child's process group. If the client dies (SIGKILL) the server kills that group at once.
The client imports only the standard library and ``vcarepro.core.supervise``, so torch loads only in the server.
docs/glossary.md says what the warm interpreter is for; docs/lab.md why each checkout gets its own.

Nothing listens on the network: the socket is a file in a directory only this user can enter. The server
imports from this file's checkout (``../src``); a child whose ``vcarepro`` comes from elsewhere refuses to
run (:func:`foreign_code`, exit 2). The server's key hashes the interpreter, the checkout's path, every ``.py``
of the package and the import-time environment (``IMPORT_ENV_PREFIXES``): a child cannot change what the
server read before it forked, so edited code or different values get a server of their own (the old one idles
out after ``VCAREPRO_WARM_IDLE`` seconds). ``VCAREPRO_WARM=0``, or no reachable server, runs a fresh interpreter.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import List, Mapping, Optional

from vcarepro.core import supervise  # standard library only, as this client must stay

HERE = Path(__file__).resolve()
PACKAGE = HERE.parents[1] / "src" / "vcarepro"  # the code the server preloads (src/vcarepro)
# Modules the server imports once for every child. A speed list: the key hashes all of src/vcarepro, and a
# module left out costs the child only its import. DVC's stage loader is for vcarepro.params.stage_facts.
PRELOAD = (
    "torch",
    "timm",
    "vcarepro",
    "vcarepro.train.launch",
    "vcarepro.train.classification",
    "vcarepro.train.generation",
    "vcarepro.metrics.complexity",
    "vcarepro.metrics.evaluator",
    "vcarepro.metrics.fid_reference",
    "vcarepro.metrics.inception",
    "vcarepro.data.samples",
    "vcarepro.tools.bench",
    "vcarepro.report.render",
    "dvclive",
    "vcarepro.params.stage_facts",
    "dvc.repo",
    "dvc.dvcfile",
    "dvc.stage.loader",
    "dvc.dependency.param",
)
# What torch, its kernels' libraries, numpy, timm, huggingface_hub, the interpreter and the loader read when
# they load: a forked child runs with the server's values, so they are part of the key. Prefixes, not names,
# since these libraries add variables each release: one read later costs at most an extra server, one left
# out would silently run a command under another client's settings. What varies per stage (DVC_STAGE, PWD,
# OLDPWD, SHLVL) stays out, or every stage starts cold.
IMPORT_ENV_PREFIXES = (
    "OMP_",
    "KMP_",
    "GOMP_",
    "MKL_",
    "OPENBLAS_",
    "ONEDNN_",
    "DNNL_",
    "ATEN_",
    "NPY_",
    "TORCH",
    "PYTORCH_",
    "CUDA_",
    "CUBLAS_",
    "TIMM_",
    "HF_",
    "HUGGINGFACE_",
    "PYTHON",
    "LD_",
    "XDG_",
    "HOME",
    "MALLOC_",
    "GLIBC_TUNABLES",
)
START_TIMEOUT = 120.0  # seconds for a new server to import everything and listen


def enabled() -> bool:
    return os.environ.get("VCAREPRO_WARM", "1") != "0"


def server_key(env: Optional[Mapping[str, str]] = None) -> str:
    """What a server's preloaded state depends on: the interpreter, the package's code, this file (the
    server's own) and the environment variables read at import (:data:`IMPORT_ENV_PREFIXES`)."""
    env = os.environ if env is None else env
    digest = hashlib.sha256(f"{sys.executable}\0{sys.version}\0{sys.prefix}\0{PACKAGE}".encode())
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(str(path.relative_to(PACKAGE)).encode())
        digest.update(path.read_bytes())
    digest.update(HERE.name.encode())
    digest.update(HERE.read_bytes())
    for name in sorted(import_env(env)):
        digest.update(f"\0{name}={env[name]}".encode())
    return digest.hexdigest()[:20]


def foreign_code(checkout: Path) -> Optional[str]:
    """One sentence if the ``vcarepro`` this process imported is not ``checkout``'s ``src/vcarepro``, else None."""
    import vcarepro

    found = Path(vcarepro.__file__).resolve().parent
    own = (checkout / "src" / "vcarepro").resolve()
    if found == own:
        return None
    return (
        f"this stage imported vcarepro from {found}, not from its own checkout's {own}, so its outputs would not "
        "be its code's; remove what imports that copy first (a sitecustomize or .pth file, python -m from "
        "another folder) or run the stage in the checkout that holds that code."
    )


def import_env(env: Mapping[str, str]) -> List[str]:
    """The names in ``env`` that the preloaded modules read when they load."""
    return [name for name in env if name.startswith(IMPORT_ENV_PREFIXES)]


def socket_path(key: str) -> Path:
    folder = Path(tempfile.gettempdir()) / f"vcarepro-warm-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.stat().st_uid != os.getuid() or folder.stat().st_mode & 0o077:
        raise PermissionError(f"{folder} is not private to this user; remove it or set VCAREPRO_WARM=0.")
    return folder / f"{key}.sock"


# -- the wire: one JSON object a line ---------------------------------------------------------


def _send(sock: socket.socket, message: dict, fds: Optional[List[int]] = None) -> None:
    data = (json.dumps(message) + "\n").encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.sendall(data)


class _Lines:
    def __init__(self, sock: socket.socket):
        self.sock, self.buffer = sock, b""

    def read(self, max_fds: int = 0):
        """The next message (and the descriptors sent with it), or (None, []) at the end of the stream."""
        fds: List[int] = []
        while b"\n" not in self.buffer:
            if max_fds:
                data, new_fds, _, _ = socket.recv_fds(self.sock, 65536, max_fds)
                fds += new_fds
            else:
                data = self.sock.recv(65536)
            if not data:
                return None, fds
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line), fds


# -- client -------------------------------------------------------------------------------------


def run(command: List[str]) -> int:
    """Run ``command`` (``[script, args...]`` or ``["-m", module, args...]``) warm; returns its exit status."""
    if not command:
        raise SystemExit("usage: python stages/run.py SCRIPT [ARGS...] | -m MODULE [ARGS...]")
    if enabled():
        try:
            sock = _connect()
        except OSError as err:
            print(f"warm start unavailable ({err}); running in a fresh interpreter.", file=sys.stderr)
        else:
            return _run_on(sock, command)
    # The command replaces this client, so that what started it (DVC, a cluster job) signals the stage itself:
    # a client waiting on a child would die of a SIGTERM and leave the stage running, orphaned.
    # Through this file's `--fresh` (:func:`fresh`): a Ctrl-C during the command's imports is one line too.
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, str(HERE), FRESH, *command])


def _connect() -> socket.socket:
    key = server_key()
    path = socket_path(key)
    try:
        return _open(path)
    except OSError:
        pass
    subprocess.Popen(
        [sys.executable, str(HERE), "serve", str(path), key],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            return _open(path)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _open(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        raise
    return sock


def _run_on(sock: socket.socket, command: List[str]) -> int:
    request = {"argv": command, "cwd": os.getcwd(), "env": dict(os.environ)}
    _send(sock, request, fds=[0, 1, 2])
    lines = _Lines(sock)
    started, _ = lines.read()
    if started is None or "pid" not in started:
        raise SystemExit(
            "the warm server closed the connection before starting the command; run it with VCAREPRO_WARM=0 to see why."
        )
    child = started["pid"]
    with supervise.forwarding(lambda signum: supervise.send(child, signum, group=True)):
        finished, _ = lines.read()
        if finished is None:
            raise SystemExit("the warm server stopped while the command ran; re-run it (or set VCAREPRO_WARM=0).")
        if finished.get("signal"):
            signal.signal(finished["signal"], signal.SIG_DFL)
            os.kill(os.getpid(), finished["signal"])  # end the way the command ended, as a fresh process would
        return int(finished["exit"])


# -- server -------------------------------------------------------------------------------------


def serve(path: str, key: str, idle: Optional[float] = None) -> None:
    """Import the stages' modules, then fork one child per request until ``idle`` seconds pass without one."""
    idle = float(os.environ.get("VCAREPRO_WARM_IDLE", "60")) if idle is None else idle
    if sys.path and Path(sys.path[0] or ".").resolve() == HERE.parent:
        sys.path.pop(0)  # this file's folder must not shadow what the server imports (stages/report.py, ...)
    sys.path.insert(0, str(PACKAGE.parent))  # this checkout's src/, before an editable install (docs/lab.md)
    for name in PRELOAD:
        try:
            __import__(name)
        except Exception:  # a module that cannot load here is imported by the child itself, or fails there
            pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}"
    listener.bind(tmp)
    listener.listen(16)
    os.replace(tmp, path)  # clients find the socket only once the server listens on it
    inode = os.stat(path).st_ino
    listener.settimeout(idle)
    waiters: List[threading.Thread] = []
    try:
        while True:
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                waiters = [t for t in waiters if t.is_alive()]
                if not waiters:
                    break
                continue
            started = _start(conn)  # the fork happens here, in the main thread
            if started is not None:
                waiter = threading.Thread(target=_finish, args=(conn, started), daemon=True)
                waiter.start()
                waiters.append(waiter)
    finally:
        listener.close()
        try:
            if os.stat(path).st_ino == inode:  # not a newer server's socket
                os.unlink(path)
        except OSError:
            pass


def _start(conn: socket.socket) -> Optional[int]:
    """Read one request and fork its child; the child's pid, or None for a request that never came whole."""
    conn.settimeout(10)
    try:
        request, fds = _Lines(conn).read(max_fds=3)
    except (OSError, ValueError):
        request, fds = None, []
    if request is None or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    pid = os.fork()
    if pid == 0:
        _child(request, fds)  # never returns
    for fd in fds:
        os.close(fd)
    try:
        _send(conn, {"pid": pid})
    except OSError:
        pass
    return pid


def _finish(conn: socket.socket, pid: int) -> None:
    status = _wait(pid, conn)
    try:
        _send(conn, status)
    except OSError:
        pass
    conn.close()


def _wait(pid: int, conn: socket.socket) -> dict:
    """The child's end; if the client goes away first (killed), the child's process group goes too."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if os.WIFSIGNALED(status):
                return {"exit": 128 + os.WTERMSIG(status), "signal": os.WTERMSIG(status)}
            return {"exit": os.WEXITSTATUS(status)}
        conn.settimeout(0.05)
        try:
            if conn.recv(1, socket.MSG_PEEK) == b"":
                raise ConnectionResetError
        except socket.timeout:
            continue
        except OSError:
            supervise.stop(pid, 0, signals=(signal.SIGKILL,), group=True, poll_s=0.05)
            return {"exit": 137, "signal": signal.SIGKILL}


def _child(request: dict, fds: List[int]) -> None:
    code = 1
    try:
        os.setpgid(0, 0)  # its own group: forwarded signals reach its workers too
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        for signum in supervise.FORWARDED:
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        foreign = foreign_code(HERE.parents[1])
        if foreign:
            print(f"error: {foreign}", file=sys.stderr)
            code = 2
        else:
            code = _execute(request["argv"])
    except SystemExit as stop:
        code = _exit_code(stop)
    except KeyboardInterrupt:  # before the stage's run_stage took over (its imports): the same one line
        code = interrupted()
    except BaseException as err:
        _print_traceback(err)
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _execute(argv: List[str]) -> int:
    import runpy

    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            # the warm import already holds the module (vcarepro.train.launch): run it afresh as __main__, as
            # `python -m` does, instead of letting runpy warn that it found it in sys.modules
            if not hasattr(sys.modules.get(argv[1]), "__path__"):  # a package runs its __main__, no warning
                sys.modules.pop(argv[1], None)
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = str(Path(argv[0]).resolve().parent)
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        return _exit_code(stop)
    return 0


def _print_traceback(err: BaseException) -> None:
    """The traceback a fresh interpreter would print: from the script's frames on, not this runner's."""
    tb = err.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>"):
        tb = tb.tb_next
    traceback.print_exception(type(err), err, tb)


def _exit_code(stop: SystemExit) -> int:
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)  # SystemExit("message"): printed, status 1, as the interpreter does
    return 1


FRESH = "--fresh"


def fresh(command: List[str]) -> int:
    """``command`` in this interpreter, as ``python SCRIPT ARGS`` runs it (``VCAREPRO_WARM=0``, or no server), except
    that a Ctrl-C before the stage's own handler (``run_stage``), while it imports torch, is one line, not a
    traceback. Any other error ends it as in a plain interpreter (its traceback, status 1)."""
    from vcarepro.core.errors import interruptible  # torch-free; PYTHONPATH holds the checkout's src/ (run.py)

    try:
        interruptible()  # a background job's SIGINT comes in ignored: Ctrl-C must still stop it
        return _execute(command)
    except KeyboardInterrupt:
        return interrupted()
    except BaseException as err:  # the traceback a plain interpreter prints: from the command's frames on
        _print_traceback(err)
        return 1


def interrupted() -> int:
    """The one line and exit status of Ctrl-C (:func:`vcarepro.core.errors.interrupted_line`, torch-free)."""
    from vcarepro.core.errors import INTERRUPTED_STATUS, interrupted_line

    print(interrupted_line(), file=sys.stderr, flush=True)
    return INTERRUPTED_STATUS


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == [FRESH]:
        raise SystemExit(fresh(sys.argv[2:]))
    else:
        raise SystemExit(run(sys.argv[1:]))
