"""A prepared image that cannot be read as it was prepared stops the stage that meets it with one sentence naming
the file and the fix, exit status 2 and no traceback, wherever it is read: the stage's own process, a seed worker, a
loader worker, a rank of a launch. Nothing is left looking finished."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from helpers import ROOT
from vcarepro.core.errors import USER_ERROR_STATUS, BadInput, UserError, run_stage
from vcarepro.data.embedded import export_digits
from vcarepro.data.folders import ManifestDataset, UnreadableImage
from vcarepro.params.config import compose

RUN = "deit_tiny-vca"
FIX = "re-run prepare_cls (`dvc repro -f -s prepare_cls`) or restore it (`dvc checkout --force data/cls`)"


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """The embedded digits, prepared, with the second half of the first training image of the manifest zeroed in
    their archive: (root, the image as the sentence names it within root)."""
    root = tmp_path_factory.mktemp("damaged") / "cls"
    export_digits(root)
    with (root / "manifest.csv").open(newline="") as f:
        row = next(row for row in csv.DictReader(f) if row["split"] == "train")
    offset, length = int(row["offset"]), int(row["length"])
    packed = bytearray((root / row["file"]).read_bytes())
    packed[offset + length // 2 : offset + length] = bytes(length - length // 2)
    (root / row["file"]).write_bytes(bytes(packed))
    return root, f"{row['file']}:{row['member']}"


def project(tmp_path: Path, damaged, seeds=(0,), seed_processes: int = 1) -> Path:
    """A project directory: tiny params, the damaged data as data/cls."""
    params = compose([])
    params["cls_runs"] = {RUN: {**params["cls_runs"][RUN], "seeds": list(seeds)}}
    params["cls_shape"].update(depth=1, embed_dim=32)
    params["cls_recipe_overrides"].update(epochs=1)
    params["distributed"]["seed_processes"] = seed_processes
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cls").symlink_to(damaged[0])
    return tmp_path


def run(cwd: Path, *command: str, timeout: int = 300):
    # warnings off: stderr must hold the sentence alone, whatever a library warns about on this machine
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def the_sentence(result, shown: str) -> str:
    """The stage's one line on stderr, checked: it names the damaged file (as ``shown``) and the fix."""
    assert result.returncode == USER_ERROR_STATUS, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    line = errors[0]
    assert line.startswith(f"error: the prepared image {shown} cannot be read (its bytes are not those prepare_cls")
    assert FIX in line
    return line


def nothing_finished(cwd: Path) -> None:
    assert not (cwd / "runs" / "cls" / RUN / "train").exists()  # the stage's DVC output
    assert not (cwd / "runs" / "cls" / RUN / "live" / "metrics.json").exists()
    assert not (cwd / "runs" / "cls" / RUN / "metrics.json").exists()


@pytest.mark.parametrize("seed_processes", [1, 2], ids=["one-process", "two-seed-workers"])
def test_training_on_a_truncated_image_is_one_sentence_naming_it_and_the_fix(tmp_path, damaged, seed_processes):
    cwd = project(tmp_path, damaged, seeds=(0, 1) if seed_processes == 2 else (0,), seed_processes=seed_processes)
    result = run(cwd, str(ROOT / "stages" / "train_cls.py"), "--run", RUN)
    line = the_sentence(result, f"data/cls/{damaged[1]}")
    assert result.stderr == line + "\n"  # the sentence alone: no worker's report, no "running them here"
    if seed_processes == 2:  # the seeds really were in workers, and the stage did not redo them
        assert f"train_cls {RUN}: seeds [0, 1] in 2 worker processes" in result.stdout
    nothing_finished(cwd)


def raised_by(read) -> UserError:
    """The UserError ``read()`` raises, without its traceback: the loader iterator its frames hold goes at once
    (collected later, a loader iterator waits 5 s for its worker)."""
    try:
        read()
    except UserError as err:
        err.__traceback__ = None
        return err
    pytest.fail("the damaged image was read")


def test_a_loader_worker_gives_the_same_sentence_as_the_loading_process(damaged, capsys):
    # eval_cls's read and, at paper scale (workers > 0), training's: a ManifestDataset through loader workers
    root, rel = damaged
    data = ManifestDataset(root, "train", transform=lambda image: torch.zeros(1))
    bad = next(i for i, (image, _) in enumerate(data.samples) if str(image) == str(root / rel))
    here = raised_by(lambda: data[bad])
    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(data, [bad]), num_workers=1)
    in_worker = raised_by(lambda: next(iter(loader)))  # torch re-raises it as its class, traceback in the message
    assert type(in_worker) is type(here) is UnreadableImage
    assert str(in_worker) == str(here)
    assert str(here).startswith(f"the prepared image {root / rel} cannot be read") and FIX in str(here)
    assert isinstance(here, OSError)  # what PIL raised, and what callers caught, before

    def stage():
        raise in_worker

    with pytest.raises(SystemExit) as stop:
        run_stage(stage)
    assert stop.value.code == USER_ERROR_STATUS
    assert capsys.readouterr().err == f"error: {here}\n"


def test_a_user_error_in_a_seed_worker_is_raised_by_the_stage_not_redone(capsys):
    from vcarepro.train.seeds import run_in_workers

    def work(seed):
        if seed == 1:
            raise BadInput("seed 1's data is bad; fix it.")
        return {"seed": seed}

    with pytest.raises(BadInput, match=r"^seed 1's data is bad; fix it\.$"):
        run_in_workers("run", [0, 1], work, 2)
    assert "did not finish in a worker" not in capsys.readouterr().err


# The ranks of a launch: a rank that meets the damaged image stops with its sentence (run_stage); the ranks waiting
# for it in a collective fail when it leaves the process group. Their failure must not bury the sentence.


def test_a_rank_whose_collective_a_user_error_broke_exits_quietly_and_any_other_keeps_its_traceback(
    tmp_path, monkeypatch, capsys
):
    import torch.distributed as dist

    from vcarepro.train import seeds
    from vcarepro.train.distributed import DistInfo

    def lost(seed, info, live):  # what gloo raises in a rank whose peer has left
        raise RuntimeError("Connection closed by peer")

    def damaged_image(seed, info, live):
        raise UnreadableImage("the prepared image x.png cannot be read; re-run prepare_cls.")

    def rank(number, train_one):  # one rank of two, over the one process group of this process
        monkeypatch.setattr(seeds, "init_distributed", lambda: DistInfo(number, 2, 0, torch.device("cpu")))
        seeds.train_seeds("run", [0], tmp_path / "live", train_one)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", "lo"))  # as the launcher's ranks
    monkeypatch.setattr(seeds, "shutdown", lambda info: None)  # the group stays for the next "rank"
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="closed by peer"):  # no rank said why: a real failure, kept
            rank(1, lost)
        with pytest.raises(UnreadableImage):  # rank 0 meets the damaged image: run_stage prints its sentence
            rank(0, damaged_image)
        with pytest.raises(SystemExit) as quiet:  # rank 1's collective, broken by rank 0's leaving
            rank(1, lost)
        assert quiet.value.code == seeds.PEER_STOPPED_STATUS != USER_ERROR_STATUS
        assert capsys.readouterr().err == ""
    finally:
        dist.destroy_process_group()


def test_a_rank_stopping_on_a_user_error_outlasts_the_launchers_sigterm(monkeypatch, capsys):
    def stage():
        raise BadInput("the data is bad; fix it.")

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setenv("WORLD_SIZE", "2")  # a rank of a launch
    try:
        with pytest.raises(SystemExit):
            run_stage(stage)
        # the launcher stops the other ranks once one of them exits; this one is ending with status 2 anyway
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)
    assert capsys.readouterr().err == "error: the data is bad; fix it.\n"


# Two ranks as the launcher sees them: rank 1, whose collective rank 0 broke, exits first with status 1; rank 0 has
# printed its sentence and exits with status 2 a moment later (ignoring SIGTERM, as run_stage makes it).
RANKS = """
import os, signal, sys, time
from pathlib import Path
left = Path(sys.argv[1])
if os.environ["RANK"] == "1":
    left.touch()
    sys.exit(1)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("error: the data is bad; fix it.", file=sys.stderr, flush=True)
while not left.exists():
    time.sleep(0.05)
time.sleep(0.5)  # rank 1 has exited, and the launcher has seen it
sys.exit(2)
"""


def test_the_launcher_names_the_rank_that_stopped_on_a_user_error_and_exits_with_its_status(tmp_path, capfd):
    from vcarepro.train.launch import run_local

    (tmp_path / "ranks.py").write_text(RANKS)
    assert run_local(str(tmp_path / "ranks.py"), [str(tmp_path / "rank1-left")], 2, grace=10) == USER_ERROR_STATUS
    err = capfd.readouterr().err.splitlines()
    assert err == [
        "error: the data is bad; fix it.",
        "launch: rank 0 exited with status 2; stopped rank 1; see the ranks' output above.",
    ]
