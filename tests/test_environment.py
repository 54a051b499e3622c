"""The environment is part of the result (issue 50): the installed packages are requirements/lock.txt, the lock holds
pyproject.toml's ranges, dvc.lock.machine.json records the same packages, and a version that differs is named in
one line, by a stage and by the lock check, before any hash."""

import hashlib
import json
import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from helpers import ROOT
from vcarepro.core import environment
from vcarepro.tools import drift, lockcheck

LOCK = environment.pins((ROOT / environment.LOCK_FILE).read_text())
GPU = environment.pins((ROOT / environment.GPU_LOCK_FILE).read_text())
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_pip_freeze_here_is_the_lock():
    """README commands 1 and 2 install the lock and nothing else: pip's own list of this interpreter's packages
    (all of them, pip's seeds included) equals requirements/lock.txt's pins, but for the installers and the project."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--all", "--exclude-editable"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    frozen = {
        name: version
        for name, version in environment.pins(done.stdout).items()
        if name not in environment.INSTALLERS and name != environment.OWN
    }
    assert environment.differences(LOCK, frozen) == [], (
        "this venv is not requirements/lock.txt; rebuild it with README command 2's set-up"
    )


def test_the_fast_reading_of_the_installed_packages_is_importlib_metadatas():
    """environment.installed() reads folder names (a stage does it at every start); importlib.metadata parses every
    METADATA file. They must agree on every package and version."""
    slow = {}
    # not a package's vendored folder, which setuptools appends to sys.path once some test has imported it
    roots = environment._site_roots()
    for dist in metadata.distributions(path=[entry for entry in sys.path if not environment._vendored(entry, roots)]):
        key = environment.canonical(dist.metadata["Name"])
        if key not in slow and key != environment.OWN and key not in environment.INSTALLERS:
            slow[key] = dist.version
    assert environment.installed() == dict(sorted(slow.items()))


def test_the_record_of_the_committed_lock_is_the_environment_lock():
    """dvc.lock was recorded under requirements/lock.txt, package for package."""
    recorded = environment.recorded_packages(ROOT)
    assert recorded is not None, "dvc.lock.machine.json has no packages: run python -m vcarepro.tools.lockcheck record"
    assert environment.differences(LOCK, recorded) == []


def test_the_lock_pins_every_declared_dependency_within_its_range_with_hashes():
    declared = [Requirement(r) for r in PROJECT["dependencies"]]
    test_only = [Requirement(r) for r in PROJECT["optional-dependencies"]["test"]]
    for requirement in declared + test_only:
        name = environment.canonical(requirement.name)
        assert name in LOCK, f"{name} is declared in pyproject.toml but not pinned in requirements/lock.txt"
        assert requirement.specifier.contains(LOCK[name], prereleases=True), (name, LOCK[name], requirement)
    for requirement in declared:
        assert environment.canonical(requirement.name) in GPU, requirement.name
    # the GPU lock is the runtime: none of the test extra's own packages, and the same version of every package
    assert not {"pytest", "selenium", "moto", "mkdocs", "ruff", "deptry"} & set(GPU)
    assert {name: LOCK.get(name) for name in GPU} == GPU
    for path in (environment.LOCK_FILE, environment.GPU_LOCK_FILE):
        text = (ROOT / path).read_text()
        entries = text.split("\n")
        for i, line in enumerate(entries):
            if environment.pins(line):
                assert "--hash=sha256:" in entries[i + 1], f"{path}: {line.strip()} has no hash"
    assert LOCK["torch"] == "2.14.1"  # PyPI's build with CUDA 13.0 (docs/reproducibility.md: why not the CPU wheel)


def test_differences_name_each_package_once_in_name_order():
    recorded = {"numpy": "2.4.6", "timm": "1.0.31", "moto": "5.1.0", "scipy": "1.17.1"}
    here = {"numpy": "2.3.5", "timm": "1.0.31", "scipy": "1.17.1", "jupyter": "1.1.1"}
    assert environment.differences(recorded, here) == [
        "jupyter 1.1.1 (not recorded)",
        "moto not installed (recorded 5.1.0)",
        "numpy 2.3.5 (recorded 2.4.6)",
    ]
    assert environment.differences(recorded, here, versions_only=True) == ["numpy 2.3.5 (recorded 2.4.6)"]
    assert environment.pins("Ruamel.YAML.clib==0.2.15 \\\n    --hash=sha256:ab\nfoo>=1\n") == {
        "ruamel-yaml-clib": "0.2.15"
    }


def _record(folder: Path, **moved) -> dict:
    packages = {**environment.installed(), **moved}
    (folder / environment.MACHINE_RECORD).write_text(json.dumps({"cpu": "X", "packages": packages}))
    return packages


STAGE = "from vcarepro.core.errors import run_stage; run_stage(lambda: print('ran'))"


def test_a_stage_under_another_version_says_which_in_one_line_and_runs(tmp_path):
    _record(tmp_path, numpy="0.0.1", **{"not-here-at-all": "1.0"})
    done = subprocess.run([sys.executable, "-c", STAGE], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ran"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    here = environment.installed()["numpy"]
    assert lines[0].startswith("warning: 1 package(s) differ from those dvc.lock was recorded under")
    assert f"numpy {here} (recorded 0.0.1)" in lines[0] and "not-here-at-all" not in lines[0]


def test_a_stage_under_the_recorded_versions_or_without_a_record_says_nothing(tmp_path):
    for record in (True, False):
        folder = tmp_path / str(record)
        folder.mkdir()
        if record:
            _record(folder)
        done = subprocess.run([sys.executable, "-c", STAGE], cwd=folder, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.strip() == "ran" and done.stderr == "", done.stderr


@pytest.fixture
def committed(tmp_path, monkeypatch):
    """A git repository whose committed dvc.lock has one output, on disk as the lock names it, and this machine
    described without a subprocess."""
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "results.json").write_text("{}\n")
    lock = "schema: '2.0'\nstages:\n  report:\n    outs:\n    - path: reports/results.json\n      md5: {}\n"
    (tmp_path / "dvc.lock").write_text(lock.format(hashlib.md5(b"{}\n").hexdigest()))
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "dvc.lock")
    _git(tmp_path, "commit", "-qm", "l")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(lockcheck, "this_machine", lambda root: {"cpu": "here"})
    return tmp_path


def _git(root: Path, *argv: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv], cwd=root, check=True, timeout=60)


def test_lockcheck_verify_names_the_package_before_any_hash(committed, capsys):
    _record(committed, **{"scikit-learn": "1.8.0"})
    (committed / "reports" / "results.json").write_text("[]\n")
    assert lockcheck.main(["verify"]) == 1
    err = capsys.readouterr().err.splitlines()
    here = environment.installed()["scikit-learn"]
    assert err[0].startswith("lockcheck: 1 package(s) differ") and f"scikit-learn {here} (recorded 1.8.0)" in err[0]
    assert "outputs on disk differ from the committed dvc.lock" in err[1] and "reports/results.json" in err[2]


def test_lockcheck_verify_under_the_recorded_versions_names_no_package(committed, capsys):
    _record(committed)
    assert lockcheck.main(["verify"]) == 0
    out = capsys.readouterr()
    assert "package" not in out.err
    assert "all 1 outputs on disk hash as in the committed dvc.lock (1 files, 0.0 MB hashed" in out.out


def test_lockcheck_verify_hashes_the_bytes_a_pull_from_a_damaged_remote_left(tmp_path, monkeypatch, capsys):
    """After `dvc pull` the workspace's dvc.lock is the committed one whatever the remote held: only hashing the
    files finds the damage, and names the file inside the directory output."""
    repo, remote = tmp_path / "repo", tmp_path / "remote"
    repo.mkdir()
    _git(repo, "init", "-q")
    dvc = [sys.executable, "-m", "dvc"]

    def run(*argv: str) -> str:
        return subprocess.run([*dvc, *argv], cwd=repo, check=True, capture_output=True, text=True, timeout=120).stdout

    run("init", "-q")
    run("config", "core.analytics", "false")
    run("remote", "add", "-d", "store", str(remote))
    seed = "runs/cls/deit_tiny-mhsa/train/seed_0"
    run(
        "stage",
        "add",
        "-q",
        "-n",
        "train",
        "-o",
        "runs/cls/deit_tiny-mhsa/train",
        f"mkdir -p {seed} && echo '[1, 2]' > {seed}/history.json && echo w > {seed}/weights",
    )
    run("repro", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "ran")
    run("push", "-q")
    monkeypatch.chdir(repo)
    monkeypatch.setattr(lockcheck, "this_machine", lambda root: {"cpu": "here"})
    assert lockcheck.main(["verify"]) == 0
    damaged = (
        remote / "files" / "md5" / hashlib.md5(b"[1, 2]\n").hexdigest()[:2] / hashlib.md5(b"[1, 2]\n").hexdigest()[2:]
    )
    damaged.chmod(0o644)
    damaged.write_text("[9, 9]\n")
    subprocess.run(["git", "clean", "-fdXq"], cwd=repo, check=True, timeout=60)  # a fresh clone: no outputs, no cache
    run("pull", "-q")
    assert json.loads(run("status", "--json") or "{}") == {}  # DVC trusts what it pulled
    assert lockcheck.main(["compare-locks"]) == 0  # and the locks agree
    capsys.readouterr()
    assert lockcheck.main(["verify"]) == 1
    err = capsys.readouterr().err
    assert "runs/cls/deit_tiny-mhsa/train (train): " in err and "files: seed_0/history.json (differs)" in err
    assert "(2 files, 0.0 MB hashed)" in err and "weights" not in err


def test_lockcheck_verify_names_dvc_checkout_where_the_cache_holds_the_committed_bytes(tmp_path, monkeypatch, capsys):
    """A file replaced in the workspace (an editor, a stray script) while DVC's cache keeps the committed bytes:
    `dvc checkout --force` restores it in seconds, and verify says so for that output only."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")

    def run(*argv: str) -> str:
        command = [sys.executable, "-m", "dvc", *argv]
        done = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    run("init", "-q")
    run("config", "core.analytics", "false")
    run("config", "cache.type", "hardlink,symlink")  # the project's: a replaced file leaves the cache's copy intact
    run("stage", "add", "-q", "-n", "train", "-o", "runs/train", "mkdir -p runs/train && echo w > runs/train/weights")
    run("stage", "add", "-q", "-n", "report", "-o", "report.json", "echo '{}' > report.json")
    run("repro", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "ran")
    monkeypatch.chdir(repo)
    monkeypatch.setattr(lockcheck, "this_machine", lambda root: {"cpu": "here"})
    weights = repo / "runs" / "train" / "weights"
    weights.unlink()
    weights.write_text("edited\n")
    (repo / "report.json").unlink()
    capsys.readouterr()
    assert lockcheck.main(["verify"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert "where a line names `dvc checkout --force`, only the workspace's copy changed" in err[0]
    assert err[1].startswith("  report.json (report): in the committed lock, missing on disk; `dvc checkout --force")
    assert err[2].startswith("  runs/train (train): ") and err[2].endswith(
        "files: weights (differs); DVC's cache holds the committed bytes, so `dvc checkout --force runs/train` "
        "restores them"
    )
    run("checkout", "--force", "runs/train", "report.json")
    assert lockcheck.main(["verify"]) == 0
    # damage written through the hardlink reaches the cache's only copy: no checkout to offer
    weights.chmod(0o644)  # DVC leaves the linked file read-only; an editor run as its owner writes anyway
    with weights.open("w") as f:
        f.write("in place\n")
    capsys.readouterr()
    assert lockcheck.main(["verify"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[1].startswith("  runs/train (train): ") and "dvc checkout" not in err[1]


def test_drift_names_each_moved_package_and_refuses_a_move_that_is_no_release(capsys):
    assert drift.moved_packages(
        {"numpy": "2.4.6", "narwhals": "2.29.0", "timm": "1.0.31"}, {"numpy": "2.3.5", "timm": "1.0.31", "x": "1"}
    ) == ["- narwhals 2.29.0", "numpy 2.4.6 -> 2.3.5", "+ x 1"]
    assert lockcheck.main(["drift", "--move", "numpy>=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --move 'numpy>=2' is not name==version; give one exact release, e.g. --move numpy==2.3.5"]


def test_the_reports_environment_section_names_the_packages_that_differ():
    from vcarepro.report.render import package_row

    same = package_row({"numpy": "2.4.6", "timm": "1.0.31"}, {"numpy": "2.4.6", "timm": "1.0.31"})
    assert same["same"] and same["here"] == "the same 2, at the same versions"
    moved = package_row({"numpy": "2.4.6", "timm": "1.0.31", "moto": "5.1"}, {"numpy": "2.3.5", "timm": "1.0.31"})
    assert not moved["same"] and moved["here"] == "numpy 2.3.5 (recorded 2.4.6); 1 recorded, not installed"
    gpu_node = package_row({"numpy": "2.4.6", "moto": "5.1"}, {"numpy": "2.4.6"})  # the test extra absent: same bits
    assert gpu_node["same"] and gpu_node["here"] == "1 recorded, not installed"
    assert not package_row(None, {"numpy": "2.4.6"})["same"]


def test_installed_reads_wheel_and_egg_installs_and_shows_both_versions_of_a_broken_one(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in ("numpy-2.4.6.dist-info", "torch-2.14.1+cpu.dist-info", "Foo_Bar-1.0-py3.11.egg-info", "x.txt"):
        (first / folder).mkdir(parents=True)
    (first / "legacy.egg-info").mkdir()
    (first / "legacy.egg-info" / "PKG-INFO").write_text("Metadata-Version: 1.0\nName: legacy\nVersion: 0.3\n")
    for folder in ("qux-0.1.dist-info", "Qux-0.2.dist-info", "numpy-1.0.dist-info", "pip-25.0.dist-info"):
        (second / folder).mkdir(parents=True)
    assert environment.installed([str(first), str(second), str(tmp_path / "missing")]) == {
        "foo-bar": "1.0",
        "legacy": "0.3",
        "numpy": "2.4.6",  # the first folder on the path is the one imported
        "qux": "0.1 or 0.2",
        "torch": "2.14.1+cpu",
    }


def test_a_drift_step_past_its_bound_is_stopped_with_everything_it_started(tmp_path, monkeypatch):
    """dvc repro under the drift check starts stages of its own: a timeout ends the whole session, not only dvc."""
    import psutil

    monkeypatch.setitem(drift.STEP_S, "repro", 1)
    marker = tmp_path / "grandchild.pid"
    script = f"sleep 60 & echo $! > {marker}; wait"
    with pytest.raises(drift.StepFailed, match="the repro step ran past 1 s and was stopped"):
        drift._step("repro", ["bash", "-c", script], cwd=tmp_path, log=tmp_path / "log")
    grandchild = int(marker.read_text())
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE


DRIFT_DRIVER = """
import sys
from pathlib import Path
from vcarepro.tools import drift

def one_long_step(root, uv, locked, work, moves):  # the repro step: dvc repro and its stages, in a session of its own
    stubborn = "trap '' TERM; " if sys.argv[3] == "stubborn" else ""  # a stage that takes SIGTERM as a preemption
    drift._step("repro", ["bash", "-c", stubborn + "sleep 60 & echo $! > " + sys.argv[1] + "; wait"], cwd=work)
    return 0

drift._run = one_long_step
sys.exit(drift.run(Path(sys.argv[2])))
"""


@pytest.mark.parametrize(
    ("signum", "stubborn"),
    [(15, False), (1, False), pytest.param(15, True, marks=pytest.mark.slow)],
    ids=["SIGTERM", "SIGHUP", "SIGTERM-twice-to-a-step-that-ignores-it"],
)
def test_a_drift_check_ended_by_sigterm_stops_everything_it_started(tmp_path, signum, stubborn):
    """`timeout` or a scheduler's cancel sends SIGTERM to the drift check alone (a closed terminal, SIGHUP): its
    step's session (dvc repro and the stages under it) must go too, with one line, exit status 128 + N. A step that
    ignores SIGTERM gets SIGKILL after the grace, even when a second SIGTERM comes while the check waits for it."""
    import signal
    import time

    import psutil

    marker = tmp_path / "grandchild.pid"
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIFT_DRIVER, str(marker), str(ROOT), "stubborn" if stubborn else "plain"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    try:
        for _ in range(300):
            if marker.is_file() and marker.read_text().strip():
                break
            time.sleep(0.1)
        grandchild = int(marker.read_text())
        proc.send_signal(signum)
        if stubborn:
            time.sleep(2)  # inside the stop's grace (10 s): the first SIGTERM reached the step, which ignores it
            proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err
    lines = err.splitlines()
    assert (
        lines[0]
        == f"stopped: the drift check ended by {name}, with every process it started; run the same command again"
    )
    assert lines[1].startswith("drift: kept ") and len(lines) == 2, err
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE


def test_a_packages_own_vendored_copies_on_sys_path_are_not_installed_packages():
    """setuptools appends setuptools/_vendor to sys.path when it is imported (torch's extension builder does so):
    the packages in there were counted in one process (the machine record's) and not in the next (lockcheck's)."""
    import site

    site_packages = site.getsitepackages()[0]
    vendored = Path(site_packages) / "setuptools" / "_vendor"
    assert (vendored / "autocommand-2.2.2.dist-info").is_dir()  # in the lock's setuptools 84.2.1
    before = environment.installed()
    assert environment.installed([*sys.path, str(vendored)]) == before
    assert "autocommand" not in before
