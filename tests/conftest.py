"""Shared test set-up: DVC never phones home; fixtures for tests of tiny models and for tests that must not reach a
network."""

import os
import shutil
import socket
import sys

import pytest

# Two pytest-xdist workers on a 2-core machine each run torch (and each pipeline stage a test starts, under the
# profile's 2 threads) with 2 OpenMP threads: 4 threads on 2 cores, and libgomp's threads spin at every barrier
# while the other process holds the core. OMP_WAIT_POLICY=PASSIVE makes a waiting thread sleep instead. It changes
# how a thread waits, never how work is split, so no bit moves. Measured on a 2-core AMD EPYC: two tiny-ViT training
# loops side by side took 9.9 s each spinning, 3.2 s passive (1.8 s alone, 3.4 s alone passive: it costs a lone
# process, so it is set only when workers share the machine); the slow tier fell from 19m17s to 11m47s, the smoke
# DAG beside another worker from 918 s to 410 s, the fast tier from 226 s to 192 s. Set before torch is imported
# (libgomp reads it when it loads); every subprocess a test starts inherits it. A caller's own value is kept.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

os.environ.setdefault("DVC_NO_ANALYTICS", "1")


# The longest files of each slow tier, longest first (worker-seconds, two workers on a 2-core Intel Xeon: of the
# alone tier the SLURM cluster 330 and the micro pipeline 250; of the other the smoke scale's DAG 488, the emulated
# AMD EPYC 277, the lab's queues, remotes and servers 209, the family's pipeline 134, ...). Under pytest-xdist they
# are handed out first (pyproject.toml turns off xdist's own order, by number of tests), so the longest does not
# start last and leave one worker idle while the other finishes it.
LONGEST_FIRST = (
    "test_cluster.py",
    "test_pipeline.py",
    "test_smoke.py",
    "test_numerics.py",
    "test_lab.py",
    "test_family_pipeline.py",
    "test_signals.py",
    "test_training.py",
    "test_fid_reference.py",
    "test_paper_road.py",
)


def pytest_collection_modifyitems(config, items):
    """A test marked `solo` is `alone` too, and one marked `alone` belongs to the slow tier as well: `-m "not slow"`
    (README command 2, on two workers) never runs it beside a test of another tier. On xdist workers, the longest
    files come first (a file's tests keep their order)."""
    for item in items:
        if item.get_closest_marker("solo"):
            item.add_marker(pytest.mark.alone)
        if item.get_closest_marker("alone") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(autouse=True)
def _progress_unconfigured():
    """A stage's main run in this process configures progress reporting for the process; the next test starts
    silent again, as a fresh process would (a test that ran fid_reference in-process once made the stand-ins
    command print its reference features' progress lines)."""
    yield
    progress = sys.modules.get("vcarepro.core.progress")
    if progress is not None:
        progress.reset()


@pytest.fixture
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine the
    threads' contention made such tests about 100x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def network_attempts(monkeypatch):
    """Every connection attempted during the test (each one refused)."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access attempted in a test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts


# -- the suite leaves the checkout as it found it ------------------------------------------------------------------
# CI runs README command 1 in the same clone right after the tests, and compares its outputs with the committed
# dvc.lock: a test that wrote into the checkout (a checkpoint a stage resumes from, a dataset, a timing) would
# change what that run computes or records. Every file below the repository root is listed (size, mtime) when the
# session starts and again when it ends; anything new, changed or gone outside the paths below fails the session.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_UNWATCHED = (".git", ".venv", ".pytest_cache", "test-artifacts", "build", "dist")  # VCS, set-up, the tests' own
_checkout_before = None


def _checkout_files():
    files = {}
    for top, dirs, names in os.walk(_ROOT):
        rel_top = os.path.relpath(top, _ROOT)
        if rel_top == ".":
            dirs[:] = [d for d in dirs if d not in _UNWATCHED]
        elif rel_top == ".dvc":
            dirs[:] = [d for d in dirs if d != "tmp"]  # DVC's own locks and state of `dvc status` runs
        dirs[:] = [d for d in dirs if d != "__pycache__" and not d.endswith(".egg-info")]
        for name in names:
            path = os.path.join(top, name)
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue
            files[os.path.normpath(os.path.join(rel_top, name))] = (info.st_size, info.st_mtime_ns)
    return files


def pytest_sessionstart(session):
    global _checkout_before
    if not hasattr(session.config, "workerinput"):
        _checkout_before = _checkout_files()


def pytest_sessionfinish(session, exitstatus):
    if _checkout_before is None or os.environ.get("VCAREPRO_ALLOW_CHECKOUT_WRITES") == "1":
        return
    after = _checkout_files()
    changed = sorted(p for p in set(_checkout_before) | set(after) if _checkout_before.get(p) != after.get(p))
    if changed:
        shown = "\n  ".join(changed[:40]) + ("\n  ..." if len(changed) > 40 else "")
        print(
            f"\nerror: the test session changed {len(changed)} file(s) in the checkout {_ROOT} (tests must write "
            f"under tmp_path; the checkout holds README command 1's outputs):\n  {shown}",
            flush=True,
        )
        session.exitstatus = 1


@pytest.fixture(scope="module")
def driver():
    """Debian's Chromium under Selenium, offline (every host name resolves to nothing; vcarepro.report.browser);
    skipped without chromium / chromedriver unless VCAREPRO_REQUIRE_BROWSER is set, as .ci/run sets it."""
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        if os.environ.get("VCAREPRO_REQUIRE_BROWSER"):
            pytest.fail("chromium or chromedriver is missing; .ci/run installs Debian's chromium and chromium-driver")
        pytest.skip("chromium / chromedriver not installed (.ci/run installs them; VCAREPRO_REQUIRE_BROWSER=1 insists)")
    from vcarepro.report.browser import open_browser

    browser = open_browser()
    yield browser
    browser.quit()


class SmallDisk:
    """A small filesystem at ``path`` that :meth:`fill` makes full. As root: a real tmpfs (``mount -t tmpfs``), where
    a write past the last free block fails with ENOSPC as on a full disk. Otherwise (no mount allowed): an ordinary
    folder where, after :meth:`fill`, ``os.fsync`` and ``open`` for writing a file under ``path`` fail with
    ENOSPC."""

    def __init__(self, path, monkeypatch):
        import subprocess

        self.path, self.monkeypatch, self.real = path, monkeypatch, False
        path.mkdir()
        if os.geteuid() == 0:
            mounted = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(path)], capture_output=True
            )
            self.real = mounted.returncode == 0

    def fill(self) -> None:
        import errno

        if self.real:  # the filler takes every free block
            fd = os.open(self.path / "filler", os.O_WRONLY | os.O_CREAT)
            try:
                while True:
                    os.write(fd, b"\0" * 4096)
            except OSError as err:
                assert err.errno == errno.ENOSPC
            finally:
                os.close(fd)
            return
        import builtins

        inside = str(self.path)

        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        real_open = builtins.open

        def open_full(file, mode="r", *args, **kwargs):
            if str(file).startswith(inside) and set(str(mode)) & set("wax+"):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
            return real_open(file, mode, *args, **kwargs)

        self.monkeypatch.setattr(os, "fsync", full)  # io's temporary file: the disk is found full at fsync
        self.monkeypatch.setattr(builtins, "open", open_full)

    def files(self) -> dict:
        """Every file but the filler, by path relative to the disk: its bytes."""
        return {
            p.relative_to(self.path).as_posix(): p.read_bytes()
            for p in sorted(self.path.rglob("*"))
            if p.is_file() and p.name != "filler"
        }

    def close(self) -> None:
        if self.real:
            import subprocess

            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """:class:`SmallDisk` at ``tmp_path/disk`` (a 4 MB tmpfs as root), unmounted after the test."""
    disk = SmallDisk(tmp_path / "disk", monkeypatch)
    try:
        yield disk
    finally:
        monkeypatch.undo()
        disk.close()
