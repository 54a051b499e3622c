"""A lab's loop through DVC's own tools (docs/lab.md), on micro repositories that start their one stage as the
project does (stages/run.py, the warm interpreter, this checkout's vcarepro): every experiment runs the code it was
started with (treeverse/dvc#10419), sweeps through DVC's queue, and results that travel through remotes and a shared
cache. The remotes are real servers on 127.0.0.1 that the tests start: moto's S3 server and Debian's openssh-server."""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import yaml

from helpers import ROOT, sh

COMMITTED = 'MARKER = "committed"\n'


def lab_repo(repo: Path, **probe) -> Path:
    """A new git repository with this project's package and launcher and one stage, tests/lab_stage.py, whose deps
    are the module it reports and core/; params.yaml (and conf/, for Hydra's -S) hold ``probe`` and the embedded
    scale's numerics profile."""
    probe = {"lr": 0.01, "steps": 0, "files": 2, "file_kib": 4, **probe}
    tracked = sh("git ls-files src/vcarepro", ROOT).stdout.split()
    for rel in [*tracked, "stages/run.py", "stages/warm.py"]:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, repo / rel)
    shutil.copy2(ROOT / "tests" / "lab_stage.py", repo / "stages" / "lab.py")
    (repo / "src" / "vcarepro" / "lab_marker.py").write_text(COMMITTED)
    numerics = yaml.safe_load((ROOT / "params.yaml").read_text())["numerics"]
    params = {"numerics": numerics, "probe": probe}
    (repo / "conf").mkdir()
    for name in ("conf/config.yaml", "params.yaml"):
        (repo / name).write_text(yaml.safe_dump(params, sort_keys=False))
    stage = {
        "cmd": "python stages/run.py stages/lab.py",
        "deps": ["stages/lab.py", "src/vcarepro/lab_marker.py", "src/vcarepro/core"],
        "params": ["numerics", "probe"],
        "outs": ["data"],
        "metrics": [{"metrics.json": {"cache": False}}],
    }
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"lab": stage}}, sort_keys=False))
    (repo / ".gitignore").write_text("__pycache__/\n")
    sh("git init -q && dvc init -q && dvc config core.analytics false && dvc config core.check_update false", repo)
    sh("dvc config hydra.enabled true", repo)  # -S composes conf/ into params.yaml, as in the project
    sh("git add -A && git -c user.name=t -c user.email=t@t commit -qm lab", repo)
    return repo


def commit(repo: Path, message: str) -> None:
    sh(f"git add -A && git -c user.name=t -c user.email=t@t commit -qm {shlex.quote(message)}", repo)


def start_queue(repo: Path, env: dict, jobs: int = 1) -> None:
    """`dvc queue start -j JOBS`, its output not captured: the workers it leaves behind hold the pipes of whoever
    started them until the queue is empty."""
    done = popen(f"dvc queue start -j {jobs}", repo, env, capture=False)
    assert done.wait(timeout=60) == 0


def finish_queue(repo: Path, env: dict, timeout: float = 300) -> str:
    """Wait until no task is queued or running and the workers have stopped; `dvc queue status` then."""
    deadline = time.monotonic() + timeout
    while True:
        status = sh("dvc queue status", repo, env=env).stdout
        busy = any(word in status for word in (" Queued", " Running")) or "0 active, 0 idle" not in status
        if not busy:
            return status
        assert time.monotonic() < deadline, status
        time.sleep(2)


def experiments(repo: Path, failed: bool = False) -> dict:
    """Each finished experiment's name -> its `dvc exp show --json` data (params, metrics, deps); with ``failed``,
    the failed ones' instead (DVC lists those too, with an error and the baseline's metrics)."""
    shown = json.loads(sh("dvc exp show --json", repo).stdout)
    rows = [e for row in shown for e in row.get("experiments") or [] if e.get("name")]
    return {e["name"]: e["revs"][0]["data"] for e in rows if bool(e["revs"][0].get("error")) == failed}


def metrics_of(data: dict) -> dict:
    return data["metrics"]["metrics.json"]["data"]


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def editable(repo: Path, **more) -> dict:
    """What README command 1's `pip install -e .` does for the checkout it was run in: its src/ on every
    interpreter's import path (here as an absolute PYTHONPATH, the other form of dvc#10419's trap)."""
    return {"PYTHONPATH": str(repo / "src"), **{k: str(v) for k, v in more.items()}}


def wait_for(path: Path, proc: subprocess.Popen | None = None, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the command ended ({proc.returncode}) before {path} appeared:\n{proc.stdout.read()}")
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout} s"
        time.sleep(0.1)


def popen(cmd: str, cwd: Path, env: dict, capture: bool = True) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        shell=True,
        cwd=cwd,
        start_new_session=True,
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stderr=subprocess.STDOUT if capture else subprocess.DEVNULL,
        text=True,
        env={
            **os.environ,
            "DVC_NO_ANALYTICS": "1",
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            **env,
        },
    )


# -- every experiment runs its own code ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_queued_experiment_runs_the_code_it_was_queued_with(tmp_path):
    """treeverse/dvc#10419 replayed: change the code, queue, revert the workspace, start the queue. The
    experiment's output is the queued code's, and its lock records that code; the workspace's run is its own."""
    repo = lab_repo(tmp_path / "repo")
    env = editable(repo)
    marker = repo / "src" / "vcarepro" / "lab_marker.py"
    marker.write_text('MARKER = "queued"\n')
    sh("dvc exp run --queue -n queued", repo, env=env)
    marker.write_text(COMMITTED)  # the workspace holds the committed code again
    start_queue(repo, env)
    status = finish_queue(repo, env)
    assert "Success" in status and "Failed" not in status, status
    ran = experiments(repo)["queued"]
    assert metrics_of(ran)["marker"] == metrics_of(ran)["child_marker"] == "queued"
    assert ran["deps"]["src/vcarepro/lab_marker.py"]["hash"] == md5('MARKER = "queued"\n')
    sh("dvc repro", repo, env=env)
    assert json.loads((repo / "metrics.json").read_text())["marker"] == "committed"


@pytest.mark.slow
def test_a_temp_experiment_keeps_its_copy_while_the_workspace_changes(tmp_path):
    """`dvc exp run --temp` runs in a copy under .dvc/tmp/exps; an edit of the workspace's src/ while its stage
    runs does not reach it, though the workspace's src/ is on the import path (the editable install)."""
    repo = lab_repo(tmp_path / "repo")
    gate = tmp_path / "gate"
    gate.mkdir()
    proc = popen("dvc exp run --temp -n temp", repo, editable(repo, LAB_GATE=gate))
    wait_for(gate / "started", proc)
    assert Path(json.loads((gate / "started").read_text())["cwd"]).is_relative_to(repo / ".dvc" / "tmp" / "exps")
    (repo / "src" / "vcarepro" / "lab_marker.py").write_text('MARKER = "edited"\n')
    (gate / "go").touch()
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    ran = metrics_of(experiments(repo)["temp"])
    assert ran["marker"] == ran["child_marker"] == "committed"


@pytest.mark.slow
def test_a_stage_refuses_a_vcarepro_from_outside_its_checkout(tmp_path):
    """A vcarepro imported before stages/run.py could put its checkout first (here by a sitecustomize) is refused
    in one sentence, exit status 2, and DVC records nothing."""
    repo = lab_repo(tmp_path / "repo")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'src')!r})\nimport vcarepro\n")
    failed = sh("dvc repro", repo, check=False, env={"PYTHONPATH": str(site)})
    assert failed.returncode != 0
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: this stage imported vcarepro from {ROOT / 'src' / 'vcarepro'}, not from its own checkout's "
        f"{repo.resolve() / 'src' / 'vcarepro'}, so its outputs would not be its code's; remove what imports that "
        "copy first (a sitecustomize or .pth file, python -m from another folder) or run the stage in the checkout "
        "that holds that code."
    ], failed.stderr
    assert "exited with 2" in failed.stderr
    assert not (repo / "dvc.lock").exists() and not (repo / "metrics.json").exists()


# -- sweeps through DVC's queue --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_sweep_runs_two_at_a_time_with_the_bits_of_a_serial_run(tmp_path):
    """docs/lab.md's sweep: `dvc exp run --queue -S 'probe.lr=a,b,c'` (Hydra's sweep syntax), `dvc queue start -j 2`.
    Two experiments run at once in two copies, each through a warm interpreter of its own, and each gives the bits
    (a loss after 30 AdamW steps, under the profile's 2 threads) that a serial `dvc repro` gives. A bad point fails
    alone, its one sentence in `dvc queue logs`; the others finish."""
    repo = lab_repo(tmp_path / "repo", steps=30)
    trace, barrier = tmp_path / "trace", tmp_path / "barrier"
    barrier.mkdir()
    sh("dvc repro", repo, env={"LAB_TRACE": str(trace)})
    commit(repo, "results")
    env = {"LAB_TRACE": str(trace), "LAB_BARRIER": f"{barrier}:2"}  # the two good points wait for each other
    queued = sh("dvc exp run --queue -S 'probe.lr=0.02,-1,0.03'", repo, env=env).stdout
    assert queued.count("Queued experiment") == 3, queued
    start_queue(repo, env, jobs=2)
    status = finish_queue(repo, env)
    assert status.count("Success") == 2 and status.count("Failed") == 1, status
    bad = next(line.split()[1] for line in status.splitlines() if line.endswith("Failed"))
    logs = sh(f"dvc queue logs {bad}", repo).stdout
    assert (
        "error: probe.lr is -1, and a learning rate must be positive; pass -S probe.lr=<a positive number>." in logs
    ), logs
    by_lr = {d["params"]["params.yaml"]["data"]["probe"]["lr"]: metrics_of(d) for d in experiments(repo).values()}
    assert set(by_lr) == {0.02, 0.03}
    runs = [line.split() for line in trace.read_text().splitlines()[1:]]  # after the workspace's first run
    assert len(runs) == 2 and all(".dvc/tmp/exps" in run[0] for run in runs), runs
    (start_a, end_a), (start_b, end_b) = [(float(run[1]), float(run[2])) for run in runs]
    assert start_a < end_b and start_b < end_a, runs  # they ran at once
    # the same point alone, in the workspace: the same bits, and the profile's 2 threads in each
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["probe"]["lr"] = 0.02
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh("dvc repro", repo, env={"LAB_TRACE": str(trace)})
    serial = json.loads((repo / "metrics.json").read_text())
    assert by_lr[0.02] == serial and serial["threads"] == 2
    assert by_lr[0.03]["threads"] == 2 and by_lr[0.03]["loss"] != serial["loss"]


@pytest.mark.slow
def test_queue_kill_leaves_no_half_recorded_experiment(tmp_path):
    """`dvc queue kill` on a running experiment: no experiment is recorded for it, its stage's processes are gone,
    and the workspace is as committed."""
    repo = lab_repo(tmp_path / "repo")
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {"LAB_GATE": str(gate)}
    sh("dvc exp run --queue -n doomed -S probe.lr=0.02", repo, env=env)
    start_queue(repo, env)
    wait_for(gate / "started")
    stage = psutil.Process(json.loads((gate / "started").read_text())["pid"])
    killed = time.monotonic()
    sh("dvc queue kill doomed", repo, env=env)
    status = finish_queue(repo, env, timeout=60)
    assert time.monotonic() - killed < 60
    assert "doomed" not in experiments(repo)
    assert "doomed" not in sh("dvc exp list --name-only", repo).stdout
    assert not stage.is_running() or stage.status() == psutil.STATUS_ZOMBIE, status
    assert sh("git status --porcelain", repo).stdout == ""


# -- results that travel: remotes, a shared cache --------------------------------------------------------------------
# The stage runs in a fresh interpreter here (VCAREPRO_WARM=0): what moves is data, and a warm server per clone would
# only cost its start-up.
COLD = {"VCAREPRO_WARM": "0"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None, f"the server exited ({proc.returncode}) before it listened on {port}"
            assert time.monotonic() < deadline, f"nothing listened on {port} within {timeout} s"
            time.sleep(0.1)


def stop(proc: subprocess.Popen) -> None:
    """The server and every process it started (sshd forks one per connection)."""
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=30)


class Server:
    """A server the test started on 127.0.0.1: ``start()`` again after ``kill()``."""

    def __init__(self, argv: list, port: int, log: Path, env: dict | None = None):
        self.argv, self.port, self.log, self.env, self.proc = argv, port, log, env, None

    def start(self) -> "Server":
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=self.env
            )
        wait_for_port(self.port, self.proc)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop(self.proc)


@pytest.fixture
def s3_server(tmp_path):
    """moto's S3 server (what dvc-s3's own tests run against) on 127.0.0.1 with a bucket ``lab-results``, checking
    keys as S3 does: after the 4 set-up calls, only the key of an IAM user ``lab`` allowed everything is accepted.
    Yields the endpoint and that key (``access_key_id``, ``secret_access_key``)."""
    boto3 = pytest.importorskip("boto3")  # moto's own dependency (pyproject.toml says why it is not named there)
    pytest.importorskip("dvc_s3")
    port = free_port()
    server = Server(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        port,
        tmp_path / "moto.log",
        env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "4"},
    ).start()
    url = f"http://127.0.0.1:{port}"
    anyone = {"endpoint_url": url, "region_name": "us-east-1", "aws_access_key_id": "x", "aws_secret_access_key": "x"}
    boto3.client("s3", **anyone).create_bucket(Bucket="lab-results")
    iam = boto3.client("iam", **anyone)
    iam.create_user(UserName="lab")
    key = iam.create_access_key(UserName="lab")["AccessKey"]
    everything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="lab", PolicyName="everything", PolicyDocument=json.dumps(everything))
    yield SimpleNamespace(
        url=url, keys={"access_key_id": key["AccessKeyId"], "secret_access_key": key["SecretAccessKey"]}
    )
    server.kill()


def add_s3_remote(repo: Path, s3, commit_it: bool = True) -> None:
    """docs/lab.md's S3 remote: the address, `verify` and a connect timeout in .dvc/config (committed), the keys in
    .dvc/config.local (not)."""
    if commit_it:
        sh(f"dvc remote add -d store s3://lab-results/vca && dvc remote modify store endpointurl {s3.url}", repo)
        sh("dvc remote modify store verify true && dvc remote modify store connect_timeout 3", repo)
    for key, value in s3.keys.items():
        sh(f"dvc remote modify --local store {key} {value}", repo)


def clone(origin: Path, to: Path) -> Path:
    sh(f"git clone -q {origin} {to}", origin.parent)
    return to


def published(tmp_path: Path, **probe) -> tuple:
    """A lab repository after `dvc repro`, committed and pushed to a bare git repository ``origin``."""
    origin = tmp_path / "origin.git"
    a = lab_repo(tmp_path / "a", **probe)
    branch = sh("git branch --show-current", a).stdout.strip()
    sh(f"git init -q --bare --initial-branch={branch} {origin}", tmp_path)
    sh(f"git remote add origin {origin}", a)
    sh("dvc repro", a, env=COLD)
    commit(a, "results")
    return origin, a


def data_files(repo: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted((repo / "data").iterdir())}


@pytest.mark.slow
def test_results_and_an_experiment_travel_through_s3(tmp_path, s3_server):
    """Pull instead of retraining: clone A pushes, a fresh clone B pulls, and B is up to date (no stage runs). Then
    one experiment moves from A to B with `dvc exp push` / `dvc exp pull`, its numbers and its outputs."""
    origin, a = published(tmp_path, files=20)
    add_s3_remote(a, s3_server)
    commit(a, "the lab's remote")
    sh("git push -q origin HEAD && dvc push", a)
    b = clone(origin, tmp_path / "b")
    add_s3_remote(b, s3_server, commit_it=False)
    sh("dvc pull", b)
    assert json.loads(sh("dvc status --json", b).stdout) == {}
    assert "Running stage" not in sh("dvc repro", b, env=COLD).stdout
    assert data_files(b) == data_files(a)
    sh("dvc exp run -n shared -S probe.lr=0.05", a, env=COLD)
    shared = data_files(a)
    sh("dvc exp push origin shared", a)
    sh("dvc exp pull origin shared", b)
    assert metrics_of(experiments(b)["shared"])["lr"] == 0.05
    sh("dvc exp apply shared", b)  # its outputs come from the cache the pull filled: no stage runs
    assert data_files(b) == shared and json.loads(sh("dvc status --json", b).stdout) == {}


SSHD_CONFIG = """\
Port {port}
ListenAddress 127.0.0.1
HostKey {keys}/host_key
AuthorizedKeysFile {keys}/authorized_keys
PidFile {keys}/sshd.pid
UsePAM no
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
Subsystem sftp internal-sftp
"""


@pytest.fixture
def sshd(tmp_path):
    """Debian's openssh-server on 127.0.0.1 with its own config, host key and an authorized key the test made
    (``user_key``; ``stranger_key`` is not authorized)."""
    binary = shutil.which("sshd") or "/usr/sbin/sshd"
    if not Path(binary).exists():
        if os.environ.get("VCAREPRO_REQUIRE_SSH"):
            pytest.fail("sshd is missing: apt-get install openssh-server (.ci/run does)")
        pytest.skip("Debian's openssh-server is not installed")
    pytest.importorskip("dvc_ssh")
    keys = tmp_path / "sshd"
    keys.mkdir(mode=0o700)
    for name in ("host_key", "user_key", "stranger_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True)
    (keys / "authorized_keys").write_text((keys / "user_key.pub").read_text())
    port = free_port()
    (keys / "sshd_config").write_text(SSHD_CONFIG.format(port=port, keys=keys))
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory, which only root needs
    server = Server([binary, "-D", "-e", "-f", str(keys / "sshd_config")], port, keys / "sshd.log").start()
    yield SimpleNamespace(server=server, port=port, keys=keys, user=getpass.getuser())
    server.kill()


def add_ssh_remote(repo: Path, sshd, store: Path, key: str = "user_key") -> None:
    """docs/lab.md's SSH remote: the address, a connection timeout and `verify` in .dvc/config, the key in
    config.local."""
    sh(f"dvc remote add -f -d store ssh://{sshd.user}@127.0.0.1:{sshd.port}{store}", repo)
    sh("dvc remote modify store timeout 10 && dvc remote modify store verify true", repo)
    sh(f"dvc remote modify --local store keyfile {sshd.keys / key}", repo)


def objects(store: Path) -> dict:
    """A remote's or a cache's objects (files/md5/xx/yyy...) -> whether the bytes hash to the name. An upload or a
    download cut short leaves at most DVC's temporary file (``yyy.<random>.tmp``), which is not an object."""
    found = {}
    for path in (store / "files" / "md5").rglob("*"):
        if path.is_file() and not path.name.endswith(".tmp"):
            name = path.parent.name + path.name
            found[name] = hashlib.md5(path.read_bytes()).hexdigest() == name.removesuffix(".dir")
    return found


@pytest.mark.slow
def test_a_wrong_s3_key_or_an_unreachable_endpoint_fails_in_one_sentence_within_30_s(tmp_path, s3_server):
    """A key the store does not know, a port nothing listens on, an endpoint that never answers a connection
    (within the remote's `connect_timeout` of 3 s, which botocore retries): each `dvc push` ends non-zero within
    30 s with DVC's one ERROR line, which names the cause."""
    origin, a = published(tmp_path)
    add_s3_remote(a, s3_server)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(0)  # one connection in its backlog, never accepted: the next connection's SYN goes unanswered,
    filler = socket.create_connection(silent.getsockname())  # as from a host that is down or behind a firewall
    cases = {
        "a wrong key": (
            "access_key_id",
            "AKIANOTAKEYOFTHELAB0",
            "(403) when calling the HeadObject operation: Forbidden",
        ),
        "a closed port": ("endpointurl", f"http://127.0.0.1:{free_port()}", "Could not connect to the endpoint URL"),
        "a silent endpoint": ("endpointurl", f"http://127.0.0.1:{silent.getsockname()[1]}", "Connect timeout"),
    }
    for case, (option, value, says) in cases.items():
        sh(f"dvc remote modify --local store {option} {value}", a)
        started = time.monotonic()
        failed = sh("dvc push", a, check=False)
        took = time.monotonic() - started
        errors = [line for line in failed.stderr.splitlines() if line.startswith("ERROR")]
        assert failed.returncode != 0 and took < 30 and len(errors) == 1 and says in errors[0], (case, took, errors)
        if option == "access_key_id":
            sh(f"dvc remote modify --local store access_key_id {s3_server.keys['access_key_id']}", a)
    filler.close()
    silent.close()


@pytest.mark.slow
def test_a_pull_refuses_an_object_whose_bytes_are_not_its_hash(tmp_path):
    """A remote on a shared filesystem that holds a damaged object (a disk that filled on the remote's side, a
    copy cut short by hand): with `verify true` (docs/lab.md) `dvc pull` hashes what it fetched and refuses it,
    exit 1; with DVC's default (`verify false`) it would be checked out as it is."""
    origin, a = published(tmp_path, files=3)
    store = tmp_path / "store"
    sh(f"dvc remote add -d store {store} && dvc remote modify store verify true && dvc push", a)
    commit(a, "the lab's remote")
    sh("git push -q origin HEAD", a)
    damaged = next(p for p in (store / "files" / "md5").rglob("*") if p.is_file() and not p.name.endswith(".dir"))
    damaged.write_bytes(damaged.read_bytes()[:100])
    b = clone(origin, tmp_path / "b")
    refused = sh("dvc pull", b, check=False)
    assert refused.returncode != 0, refused.stdout
    whole = objects(b / ".dvc" / "cache") if (b / ".dvc" / "cache").exists() else {}
    assert all(whole.values()) and damaged.parent.name + damaged.name not in whole
    sh("dvc remote modify --local store verify false && dvc pull", b)  # what DVC's default would have done
    assert data_files(b) != data_files(a)


@pytest.mark.slow
def test_a_push_cut_by_the_server_completes_when_run_again_and_a_pull_takes_no_partial_object(tmp_path, sshd):
    """Over SSH: the server is killed while `dvc push` uploads; the push fails within the connection timeout and
    leaves no object on the remote whose bytes are not its hash; run again, it completes, and a fresh clone pulls
    every file whole."""
    origin, a = published(tmp_path, files=300, file_kib=64)  # 300 objects of 64 KiB
    store = tmp_path / "store"
    add_ssh_remote(a, sshd, store)
    commit(a, "the lab's remote")
    sh("git push -q origin HEAD", a)
    push = popen("dvc push", a, COLD)
    deadline = time.monotonic() + 120
    while len(objects(store)) < 20 and push.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    sshd.server.kill()
    cut = time.monotonic()
    out, _ = push.communicate(timeout=60)
    assert push.returncode != 0, out
    assert time.monotonic() - cut < 30
    uploaded = objects(store)
    assert 0 < len(uploaded) < 301 and all(uploaded.values()), out
    sshd.server.start()
    sh("dvc push", a)
    assert len(objects(store)) == 301 and all(objects(store).values())
    b = clone(origin, tmp_path / "b")
    sh(f"dvc remote modify --local store keyfile {sshd.keys / 'user_key'}", b)
    pull = popen("dvc pull", b, COLD)  # cut as well: the clone's cache takes no object that is not whole
    deadline = time.monotonic() + 120
    while len(objects(b / ".dvc" / "cache")) < 20 and pull.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    sshd.server.kill()
    out, _ = pull.communicate(timeout=60)
    pulled = objects(b / ".dvc" / "cache")
    assert pull.returncode != 0 and 0 < len(pulled) < 301 and all(pulled.values()), out
    sshd.server.start()
    sh("dvc pull", b)
    assert data_files(b) == data_files(a)
    assert json.loads(sh("dvc status --json", b).stdout) == {}


@pytest.mark.slow
def test_a_wrong_key_or_a_silent_host_fails_in_one_sentence_within_30_s(tmp_path, sshd):
    """A key the server does not know, a port nothing listens on, and a host that accepts and never answers: each
    `dvc push` ends non-zero within 30 s (the last through the remote's `timeout`), with DVC's one ERROR line."""
    origin, a = published(tmp_path)
    store = tmp_path / "store"
    add_ssh_remote(a, sshd, store, key="stranger_key")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts, never speaks
    closed = free_port()
    cases = {"a wrong key": None, "a closed port": closed, "a silent host": silent.getsockname()[1]}
    for case, port in cases.items():
        if port is not None:
            sh(f"dvc remote modify --local store keyfile {sshd.keys / 'user_key'}", a)
            sh(f"dvc remote modify store url ssh://{sshd.user}@127.0.0.1:{port}{store}", a)
        started = time.monotonic()
        failed = sh("dvc push", a, check=False)
        took = time.monotonic() - started
        errors = [line for line in failed.stderr.splitlines() if line.startswith("ERROR")]
        assert failed.returncode != 0 and took < 30 and len(errors) == 1, (case, took, failed.stderr)
    silent.close()
    assert not store.exists()


@pytest.mark.slow
def test_a_shared_cache_computes_each_result_once(tmp_path):
    """Two clones on one machine (or one cluster's shared disk) with `dvc cache dir` on a shared path and
    `cache.shared group`: what the first computed, the second restores from DVC's run cache without running."""
    base = lab_repo(tmp_path / "base", files=3)
    cache, trace = tmp_path / "shared-cache", tmp_path / "trace"
    env = {**COLD, "LAB_TRACE": str(trace)}
    clones = [clone(base, tmp_path / name) for name in ("a", "b")]
    for repo in clones:
        sh(f"dvc cache dir --local {cache} && dvc config --local cache.shared group", repo)
    sh("dvc repro", clones[0], env=env)
    second = sh("dvc repro", clones[1], env=env).stdout
    assert "Stage 'lab' is cached - skipping run, checking out outputs" in second, second
    assert len(trace.read_text().splitlines()) == 1  # the stage ran once, in the first clone
    assert data_files(clones[1]) == data_files(clones[0])
    shared = [path for path in (cache / "files" / "md5").rglob("*") if path.is_file()]
    assert shared and all(path.stat().st_mode & 0o060 == 0o040 for path in shared)  # the group may read them
