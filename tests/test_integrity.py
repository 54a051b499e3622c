"""Damaged inputs are refused, a full disk is one sentence: through real `dvc repro` runs of a micro pipeline.

The micro pipeline (tests/test_pipeline.py's configuration, one classification and one generation
run) is reproduced once; each test damages one thing, checks the sentence, the exit status and
that DVC recorded nothing, then puts the repository back with `dvc checkout`.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import micro_params, reproduced_repo, sh
from vcarepro.core.integrity import MANIFEST, check, sha256_file
from vcarepro.data.samples import NpzSampleWriter

CLS, GEN = "deit_tiny-vca", "dit_s2-vca"
TARGETS = f"eval_cls@{CLS} eval_gen@{GEN}"  # and the stages they depend on


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    params = micro_params(cls_runs=[CLS], gen_runs=[GEN])
    repo = reproduced_repo(tmp_path_factory.mktemp("integrity") / "repo", params, targets=TARGETS)
    sh("git add -A && git -c user.name=t -c user.email=t@t commit -qm results", repo)
    return repo


def flip_byte(path: Path, offset: int = -1) -> None:
    """``path`` replaced by its bytes with one flipped: a new file, as the output's link to DVC's cache object
    (.dvc/config's cache type) must not be written through, or the cache's only copy would change too."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.unlink()
    path.write_bytes(bytes(data))


def refused(repo: Path, stage: str, env=None):
    """`dvc repro -f -s stage` that must fail: (its stderr's `error:` lines, the whole output), dvc.lock unchanged."""
    lock = (repo / "dvc.lock").read_bytes()
    result = sh(f"dvc repro -f -s {stage}", repo, check=False)
    assert result.returncode != 0, result.stdout[-2000:]
    assert (repo / "dvc.lock").read_bytes() == lock  # DVC recorded nothing as finished
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output[-3000:]
    assert "exited with 2" in output, output[-3000:]  # the stage's own status: a user error
    return [line for line in output.splitlines() if line.startswith("error: ")], output


def restored(repo: Path) -> None:
    sh(f"dvc checkout --force --with-deps -q {TARGETS}", repo)
    status = sh(f"dvc status --with-deps {TARGETS}", repo)
    assert "up to date" in status.stdout, status.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "path, stage",
    [
        ("data/gen/train.safetensors", f"train_gen@{GEN}"),  # the prepared training set
        ("data/fid_reference/features.npy", f"eval_gen@{GEN}"),  # the FID reference
        (f"runs/gen/{GEN}/samples/seed_0.npz", f"eval_gen@{GEN}"),  # the sample batch FID is measured on
    ],
    ids=["training set", "FID reference", "samples"],
)
def test_a_damaged_prepared_file_is_refused_before_any_work(repo, path, stage):
    directory = Path(path).parent
    writer = {"data/gen": "prepare_gen", "data/fid_reference": "fid_reference"}.get(str(directory), f"sample_gen@{GEN}")
    assert check(repo / path) is None  # written with its digest by the stage that made it
    flip_byte(repo / path)  # one bit flipped on disk: numpy and safetensors would read it without a word
    errors, _ = refused(repo, stage)
    assert errors == [
        f"error: {path} fails its checksum, so its bytes are not what was written; restore it with "
        f"`dvc checkout {directory}` (DVC's cache keeps the bytes it recorded) or rebuild it with "
        f"`dvc repro -f -s {writer}`."
    ]
    restored(repo)
    assert check(repo / path) is None


@pytest.mark.slow
def test_damaged_trained_weights_are_refused(repo):
    weights = repo / "runs" / "cls" / CLS / "train" / "seed_0" / "model.safetensors"
    assert (weights.parent / "model.safetensors.sha256").read_text().split()[0] == sha256_file(weights)
    flip_byte(weights)
    errors, _ = refused(repo, f"eval_cls@{CLS}")
    assert len(errors) == 1 and errors[0].startswith(
        f"error: runs/cls/{CLS}/train/seed_0/model.safetensors fails its checksum"
    )
    restored(repo)


def in_small_tmpfs(directory: str, free_bytes: int, command: str) -> str:
    """``command`` in a private mount namespace where ``directory`` is a fresh tmpfs with ``free_bytes`` left."""
    unshare = "unshare --mount" if os.geteuid() == 0 else "unshare --user --map-root-user --mount"
    return (
        f"{unshare} sh -c 'mount -t tmpfs -o size=1m tmpfs {directory} && "
        f"head -c $((1048576 - {free_bytes})) /dev/zero > {directory}/.filler && {command}'"
    )


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux's unshare is needed for a private tmpfs")
@pytest.mark.parametrize(
    "directory, written",
    [
        ("checkpoints", f"checkpoints/cls/{CLS}/seed_0/last.pt"),  # the first checkpoint fills the disk
        ("runs", "runs/cls"),  # the run's outputs (dvclive's logs, the weights) fill it
    ],
)
def test_a_full_disk_is_one_sentence_naming_the_path_and_nothing_is_recorded(repo, directory, written):
    lock = (repo / "dvc.lock").read_bytes()
    # a fresh interpreter, inside the namespace (a warm server outside it would write to the real disk)
    result = sh(in_small_tmpfs(directory, 16384, f"VCAREPRO_WARM=0 dvc repro -f -s train_cls@{CLS}"), repo, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "exited with 2" in output, output[-3000:]
    assert "Traceback" not in output and "Errno 28" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, output[-3000:]
    assert errors[0].startswith("error: no space is left on the device while writing ") and written in errors[0]
    assert "free space there (`df -h" in errors[0] and "then re-run `dvc repro`" in errors[0]
    if directory == "checkpoints":
        assert "bytes were needed" in errors[0]
    assert (repo / "dvc.lock").read_bytes() == lock
    restored(repo)  # the real disk: the previous checkpoint and outputs untouched
    assert check(repo / "checkpoints" / "cls" / CLS / "seed_0" / "last.pt") is None


def test_a_damaged_finished_sample_batch_is_sampled_again_and_the_result_is_unchanged(tmp_path):
    def batches():
        for k in range(3):
            g = torch.Generator().manual_seed(k)
            yield k, 4 * k, torch.randint(0, 256, (4, 3, 8, 8), generator=g, dtype=torch.uint8), torch.arange(4) + k

    whole = NpzSampleWriter(tmp_path / "whole.npz", 12, (8, 8, 3), work_dir=tmp_path / "w1", key="k")
    for k, start, images, labels in batches():
        whole.write(k, start, images, labels)
    whole.close()

    part = NpzSampleWriter(tmp_path / "part.npz", 12, (8, 8, 3), work_dir=tmp_path / "w2", key="k")
    for k, start, images, labels in batches():
        part.write(k, start, images, labels)
    del part  # killed here, all three batches recorded
    arr = np.load(tmp_path / "w2" / "arr_0.npy", mmap_mode="r+")
    arr[5, 0, 0, 0] ^= 0xFF  # a bit of batch 1 flipped on disk
    arr.flush()
    del arr
    resumed = NpzSampleWriter(tmp_path / "part.npz", 12, (8, 8, 3), work_dir=tmp_path / "w2", key="k")
    assert resumed.done_batches == 1
    assert resumed.note == (
        f"finished batch 1 in {tmp_path / 'w2'} fails its checksum; sampling again from batch 1 "
        "(batches 1..2 are redone)"
    )
    for k, start, images, labels in list(batches())[1:]:
        resumed.write(k, start, images, labels)
    resumed.close()
    assert (tmp_path / "part.npz").read_bytes() == (tmp_path / "whole.npz").read_bytes()


def test_a_prepared_directory_without_its_manifest_is_refused(tmp_path):
    from vcarepro.core.errors import UserError
    from vcarepro.core.integrity import prepared
    from vcarepro.core.io import atomic_directory

    with atomic_directory(tmp_path / "gen", digests=True) as tmp:
        (tmp / "meta.json").write_text("{}")
    assert (tmp_path / "gen" / MANIFEST).read_text() == f"{sha256_file(tmp_path / 'gen' / 'meta.json')}  meta.json\n"
    prepared(tmp_path / "gen", "prepare_gen")
    (tmp_path / "gen" / MANIFEST).unlink()
    with pytest.raises(
        UserError, match=r"has no SHA256SUMS, so its files cannot be verified .*dvc repro -f -s prepare_gen"
    ):
        prepared(tmp_path / "gen", "prepare_gen")


SAMPLES_ON_A_FULL_DISK = """
import sys
from vcarepro.data.samples import NpzSampleWriter
from vcarepro.core.errors import run_stage
run_stage(lambda: NpzSampleWriter(sys.argv[1] + "/seed_0.npz", 2000, (64, 64, 3), work_dir=sys.argv[1] + "/work"))
"""


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux's unshare is needed for a private tmpfs")
def test_memory_maps_on_a_full_disk_are_one_sentence_not_a_bus_error(tmp_path):
    # 2,000 samples of 64x64x3 need 24.6 MB; written through a sparse memory map, the first page that
    # finds no block would be a SIGBUS; allocated up front (as the latent shards are too) it is one sentence
    small = tmp_path / "small"
    small.mkdir()
    (tmp_path / "snippet.py").write_text(SAMPLES_ON_A_FULL_DISK)
    command = f"{sys.executable} {tmp_path / 'snippet.py'} {small}"
    result = sh(in_small_tmpfs(str(small), 1 << 19, command), tmp_path, check=False)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert result.stderr.splitlines() == [
        f"error: no space is left on the device while writing {small}/work/arr_0.npy (24,576,128 bytes were needed); "
        f"free space there (`df -h {small}/work`) or point that directory elsewhere (checkpoints/ and runs/ may be "
        f"symbolic links to a larger disk), then run `python {tmp_path / 'snippet.py'} {small}` again."
    ]


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux's unshare is needed for a private tmpfs")
def test_a_full_disk_under_a_tool_names_that_command_to_run_again(tmp_path):
    """Not a stage: no `dvc repro` to re-run, so the sentence gives back the command the user typed."""
    from vcarepro.tools.bench.loader import write_imagenet_like_jpegs

    folder = write_imagenet_like_jpegs(tmp_path / "images", count=2) / "train"
    small = tmp_path / "small"
    small.mkdir()
    vcarepro = Path(sys.executable).parent / "vcarepro"
    typed = f"vcarepro bench loader --root {folder} --seconds 0.05 --workers 0 --batch 2 --json {small}/out.json"
    result = sh(in_small_tmpfs(str(small), 0, f"{vcarepro}{typed[8:]}"), tmp_path, check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    line = result.stderr.splitlines()[-1]
    assert line.startswith(f"error: no space is left on the device while writing {small}/out.json ("), line
    assert line.endswith(f"(`df -h {small}`) or point that directory elsewhere (checkpoints/ and runs/ may be symbolic "
                         f"links to a larger disk), then run `{typed}` again."), line  # fmt: skip
