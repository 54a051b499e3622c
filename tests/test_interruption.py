"""Kill a real training process mid-run (SIGTERM, SIGKILL); re-running finishes with the uninterrupted result."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vcarepro.core.integrity import sha256_file
from vcarepro.train.checkpoint import load_checkpoint, previous_path, save_checkpoint

DRIVER = Path(__file__).resolve().parent / "train_driver.py"
WEIGHTS = {"cls": "model.safetensors", "gen": "model_ema.safetensors"}


def start(branch: str, workdir: Path, seed: int = 0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(DRIVER), branch, str(workdir), str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(branch: str, workdir: Path, seed: int = 0) -> str:
    process = start(branch, workdir, seed)
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-2000:]
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    results = {}
    for branch in ("cls", "gen"):
        workdir = tmp_path_factory.mktemp(f"straight_{branch}")
        out = finish(branch, workdir)
        results[branch] = (load_file(str(workdir / "out" / WEIGHTS[branch])), out.split("finished", 1)[1])
    return results


@pytest.mark.slow
@pytest.mark.parametrize("branch", ["cls", "gen"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_killed_run_resumes_to_the_uninterrupted_result(tmp_path, uninterrupted, branch, signum):
    process = start(branch, tmp_path)
    checkpoint = tmp_path / "ckpt" / "last.pt"
    deadline = time.monotonic() + 300
    while not checkpoint.is_file():  # kill it once it has something to resume from
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.02)
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
    assert not (tmp_path / "out" / WEIGHTS[branch]).exists()  # nothing finished-looking
    state = load_checkpoint(checkpoint)
    progress = state["epoch"] if branch == "cls" else state["step"]
    assert 0 < progress < (8 if branch == "cls" else 600)

    out = finish(branch, tmp_path)
    weights, figures = uninterrupted[branch]
    resumed = load_file(str(tmp_path / "out" / WEIGHTS[branch]))
    assert resumed.keys() == weights.keys() and all(torch.equal(resumed[k], weights[k]) for k in weights)
    assert out.split("finished", 1)[1].split("'train_seconds'")[0] == figures.split("'train_seconds'")[0]


def test_a_truncated_checkpoint_falls_back_to_the_one_before(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"step": 1, "w": torch.ones(3)})
    save_checkpoint(path, {"step": 2, "w": torch.ones(3)})
    assert load_checkpoint(previous_path(path))["step"] == 1 and load_checkpoint(path)["step"] == 2
    assert sha256_file(path) == (tmp_path / "last.pt.sha256").read_text().split()[0]  # sha256sum's format
    assert (tmp_path / "last.pt.prev.sha256").read_text().split()[1] == "last.pt.prev"
    path.write_bytes(path.read_bytes()[:100])  # a disk that lost the tail of the newest file
    problems = []
    state = load_checkpoint(path, problems)
    assert state["step"] == 1 and state["_loaded_from"] == str(previous_path(path))
    assert problems == [f"{path} fails its checksum"]
    previous_path(path).write_bytes(b"")
    assert load_checkpoint(path) is None  # nothing intact: start afresh rather than crash
    assert not list(tmp_path.glob(".last.pt.*.tmp"))  # no stray temporary files


def zero_tensor_records(path: Path) -> None:
    """Zero the bytes of every tensor record of a torch zip, keeping every header: the zip stays well formed."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as archive:
        spans = []
        for info in archive.infolist():
            if "/data/" in info.filename:
                with open(path, "rb") as f:
                    f.seek(info.header_offset)
                    header = f.read(30)
                name_len, extra_len = struct.unpack("<HH", header[26:30])
                spans.append((info.header_offset + 30 + name_len + extra_len, info.compress_size))
    with open(path, "r+b") as f:
        for start, size in spans:
            f.seek(start)
            f.write(bytes(size))
    assert torch.load(path, weights_only=True)["epoch"] > 0  # PyTorch itself loads it without a word


def trained_with_two_checkpoints(workdir: Path) -> None:
    """A finished run: last.pt (epoch 8) and last.pt.prev (epoch 7), both intact. (Killing a run instead could
    land between save_checkpoint's renames, where last.pt is briefly absent.)"""
    finish("cls", workdir)
    shutil.rmtree(workdir / "out")
    assert load_checkpoint(workdir / "ckpt" / "last.pt.prev")["epoch"] == 7


@pytest.mark.slow
def test_a_damaged_checkpoint_is_passed_over_for_the_one_before_and_the_run_ends_bit_identical(tmp_path, uninterrupted):
    trained_with_two_checkpoints(tmp_path)
    ckpt = tmp_path / "ckpt"
    epoch_before = load_checkpoint(ckpt / "last.pt.prev")["epoch"]
    zero_tensor_records(ckpt / "last.pt")  # a torn copy or bad sector: same size, headers intact
    out = finish("cls", tmp_path)
    assert (
        f"seed 0: checkpoint {ckpt / 'last.pt'} fails its checksum; resuming at epoch {epoch_before + 1} of 8 "
        f"from {ckpt / 'last.pt.prev'}"
    ) in out
    weights, figures = uninterrupted["cls"]
    resumed = load_file(str(tmp_path / "out" / WEIGHTS["cls"]))
    assert all(torch.equal(resumed[k], weights[k]) for k in weights)
    assert out.split("finished", 1)[1].split("'train_seconds'")[0] == figures.split("'train_seconds'")[0]
    assert load_checkpoint(ckpt / "last.pt.prev")["epoch"] == 7  # the damaged file was not rotated into .prev


@pytest.mark.slow
def test_two_damaged_checkpoints_start_afresh_and_say_so(tmp_path, uninterrupted):
    trained_with_two_checkpoints(tmp_path)
    ckpt = tmp_path / "ckpt"
    zero_tensor_records(ckpt / "last.pt")
    (ckpt / "last.pt.prev").write_bytes((ckpt / "last.pt.prev").read_bytes()[:-7])  # and a truncated one
    out = finish("cls", tmp_path)
    assert (
        f"seed 0: checkpoint {ckpt / 'last.pt'} fails its checksum and {ckpt / 'last.pt.prev'} fails its "
        f"checksum; starting afresh"
    ) in out
    assert "weights_only" not in out and "resuming" not in out
    weights, _ = uninterrupted["cls"]
    again = load_file(str(tmp_path / "out" / WEIGHTS["cls"]))
    assert all(torch.equal(again[k], weights[k]) for k in weights)


@pytest.mark.slow
def test_same_seed_in_a_fresh_process_gives_identical_bytes_and_another_seed_differs(tmp_path, uninterrupted):
    weights, figures = uninterrupted["gen"]
    finish("gen", tmp_path / "again")
    again = tmp_path / "again"
    assert (again / "out" / WEIGHTS["gen"]).read_bytes() == save_bytes(weights)
    first_ckpt = load_checkpoint(again / "ckpt" / "last.pt")
    finish("gen", tmp_path / "third")
    assert (tmp_path / "third" / "ckpt" / "last.pt").read_bytes() == (again / "ckpt" / "last.pt").read_bytes()
    finish("gen", tmp_path / "seed1", seed=1)
    other = load_file(str(tmp_path / "seed1" / "out" / WEIGHTS["gen"]))
    assert any(not torch.equal(other[k], weights[k]) for k in weights)  # init, data order, noise all follow the seed
    assert first_ckpt["step"] == 600


def save_bytes(tensors) -> bytes:
    from safetensors.torch import save

    return save(tensors)


KILLED_BUILD = """
import os, signal, sys
from vcarepro.core.io import atomic_directory
with atomic_directory(sys.argv[1]) as tmp:
    (tmp / "manifest.csv").write_text("half written")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_preparation_killed_midway_leaves_nothing_a_later_stage_would_accept(tmp_path):
    from vcarepro.core.io import atomic_directory

    target = tmp_path / "data" / "cls"
    killed = subprocess.run([sys.executable, "-c", KILLED_BUILD, str(target)], capture_output=True)
    assert killed.returncode == -signal.SIGKILL
    assert not target.exists() and len(list(target.parent.glob(".cls.*.tmp"))) == 1  # only the scratch copy
    with atomic_directory(target) as tmp:
        (tmp / "manifest.csv").write_text("complete")
    assert (target / "manifest.csv").read_text() == "complete"
    assert list(target.parent.iterdir()) == [target]  # the leftover was cleared
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as tmp:
            (tmp / "manifest.csv").write_text("broken")
            raise RuntimeError("a failed rebuild")
    assert (target / "manifest.csv").read_text() == "complete" and list(target.parent.iterdir()) == [target]
