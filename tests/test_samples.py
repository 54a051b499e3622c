"""Sample files in the ADM evaluator's format, written batch by batch, resumable by index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import ROOT
from vcarepro.data.samples import NpzSampleWriter, discard_work, read_samples

IMAGES = torch.randint(0, 256, (10, 3, 4, 5), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
LABELS = torch.arange(10) % 3


def write_batches(writer, batches):
    for batch in batches:
        start = batch * 4
        writer.write(batch, start, IMAGES[start : start + 4], LABELS[start : start + 4])


def test_samples_read_back_as_adm_arrays_and_nothing_is_left_behind(tmp_path):
    writer = NpzSampleWriter(tmp_path / "out" / "seed_0.npz", 10, (4, 5, 3), work_dir=tmp_path / "work", key="k")
    write_batches(writer, [0, 1])
    assert not (tmp_path / "out" / "seed_0.npz").exists()  # nothing finished-looking before close()
    write_batches(writer, [2])
    assert writer.preview(per_class=1, classes=3).shape == (3, 4, 5, 3)  # labels 0, 1, 2 from the maps
    writer.close()
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["seed_0.npz"]
    # the finished work stays until the stage's output is committed, then goes
    again = NpzSampleWriter(tmp_path / "out" / "seed_0.npz", 10, (4, 5, 3), work_dir=tmp_path / "work", key="k")
    assert again.done_batches == 3  # a re-run after a later seed's interruption re-zips, it does not re-sample
    del again
    discard_work(tmp_path / "work")
    assert not (tmp_path / "work").exists()
    with np.load(tmp_path / "out" / "seed_0.npz", allow_pickle=False) as data:
        assert data.files == ["arr_0", "arr_1"] and data["arr_0"].shape == (10, 4, 5, 3)
    got, got_labels = read_samples(tmp_path / "out" / "seed_0.npz")
    assert np.array_equal(got, IMAGES.permute(0, 2, 3, 1).numpy()) and np.array_equal(got_labels, LABELS.numpy())


def test_an_interrupted_sample_set_resumes_by_index_without_duplicates_or_gaps(tmp_path):
    first = NpzSampleWriter(tmp_path / "seed_0.npz", 10, (4, 5, 3), work_dir=tmp_path / "work", key="k")
    write_batches(first, [0, 1])
    del first  # killed: never closed
    again = NpzSampleWriter(tmp_path / "seed_0.npz", 10, (4, 5, 3), work_dir=tmp_path / "work", key="k")
    assert again.done_batches == 2
    with pytest.raises(ValueError, match="batch 1 written after 2 finished batches"):
        write_batches(again, [1])  # a duplicate is refused
    write_batches(again, [2])
    again.close()
    assert np.array_equal(read_samples(tmp_path / "seed_0.npz")[0], IMAGES.permute(0, 2, 3, 1).numpy())


def test_work_left_by_other_settings_is_discarded(tmp_path):
    first = NpzSampleWriter(tmp_path / "seed_0.npz", 10, (4, 5, 3), work_dir=tmp_path / "work", key="old model")
    write_batches(first, [0])
    del first
    assert (
        NpzSampleWriter(
            tmp_path / "seed_0.npz", 10, (4, 5, 3), work_dir=tmp_path / "work", key="new model"
        ).done_batches
        == 0
    )
    assert (
        NpzSampleWriter(
            tmp_path / "seed_0.npz", 12, (4, 5, 3), work_dir=tmp_path / "work", key="new model"
        ).done_batches
        == 0
    )  # another size: afresh too


def test_sampling_resumed_at_a_batch_gives_the_uninterrupted_batches(one_torch_thread):
    from vcarepro.params.config import compose
    from vcarepro.train.generation import GeneratorSpec, generate_batches

    params = compose([])
    model = GeneratorSpec("dit_s2", "mhsa", {}, dict(params["gen_shape"], depth=1, hidden_size=32)).create()
    sampling = dict(params["sampling"], batch_size=4, ddpm_steps=3)
    kw = dict(num_samples=10, num_classes=10, input_shape=(1, 8, 8), seed=3, device=torch.device("cpu"))
    full = list(generate_batches(model, "ddpm", sampling, **kw))
    tail = list(generate_batches(model, "ddpm", sampling, start_batch=1, **kw))
    assert [s for s, _, _ in full] == [0, 4, 8] and [s for s, _, _ in tail] == [4, 8]
    for (_, a, ya), (_, b, yb) in zip(full[1:], tail):
        assert torch.equal(a, b) and torch.equal(ya, yb)
    other = list(generate_batches(model, "ddpm", sampling, **{**kw, "seed": 4}))
    assert not torch.equal(other[0][1], full[0][1])


def test_random_labels_are_uniform_draws_per_batch_and_resume_to_the_same_draws():
    """DiT's / SiT's sample_ddp.py: torch.randint(0, num_classes, (n,)) per batch."""
    from scipy.stats import chisquare

    from vcarepro.train.generation import sample_labels

    def labels(mode, seed, batches, size=500, classes=10):
        out = []
        for b in batches:
            generator = torch.Generator().manual_seed(seed * 1_000_003 + b)
            out.append(sample_labels(mode, b * size, size, classes, generator))
        return torch.cat(out)

    drawn = labels("random", seed=0, batches=range(20))  # 10,000 labels
    counts = torch.bincount(drawn, minlength=10).numpy()
    assert counts.sum() == 10_000 and len(set(counts.tolist())) > 1  # not balanced
    # multinomial with equal probabilities: a chi-square test far from rejecting (fixed seed, no flakiness)
    assert chisquare(counts).pvalue > 0.01
    # per-batch streams: batches 5.. drawn afresh equal the uninterrupted run's
    assert torch.equal(labels("random", seed=0, batches=range(5, 20)), drawn[5 * 500 :])
    assert not torch.equal(labels("random", seed=1, batches=range(20)), drawn)
    assert torch.equal(labels("balanced", seed=0, batches=range(2)), torch.arange(1000) % 10)
    with pytest.raises(ValueError, match="sampling.labels='uniform' is unknown; use one of random, balanced"):
        labels("uniform", seed=0, batches=[0])


def test_sampling_writes_the_labels_it_conditioned_on(one_torch_thread):
    from vcarepro.params.config import compose
    from vcarepro.train.generation import GeneratorSpec, generate_batches

    params = compose([])
    assert params["sampling"]["labels"] == "random"  # the paper's protocol, at every scale
    model = GeneratorSpec("dit_s2", "mhsa", {}, dict(params["gen_shape"], depth=1, hidden_size=32)).create()
    sampling = dict(params["sampling"], batch_size=6, ddpm_steps=2)
    kw = dict(num_samples=12, num_classes=10, input_shape=(1, 8, 8), seed=0, device=torch.device("cpu"))
    ys = torch.cat([y for _, _, y in generate_batches(model, "ddpm", sampling, **kw)])
    assert ys.shape == (12,) and not torch.equal(ys, torch.arange(12) % 10)
    balanced = torch.cat([y for _, _, y in generate_batches(model, "ddpm", {**sampling, "labels": "balanced"}, **kw)])
    assert torch.equal(balanced, torch.arange(12) % 10)


def test_sample_files_that_are_missing_or_not_images_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the sample_gen stage"):
        read_samples(tmp_path / "absent.npz")
    np.savez(tmp_path / "floats.npz", np.zeros((2, 4, 4, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="arr_0 must be uint8"):
        read_samples(tmp_path / "floats.npz")
    np.savez(tmp_path / "other.npz", images=np.zeros((2, 4, 4, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="has no arr_0"):
        read_samples(tmp_path / "other.npz")


# -- the same arrays are the same .npz bytes under every CPython (issue 25) -----------------------------------------


def _cpython_311s():
    """Every CPython 3.11 on this machine (the venv's, Debian's, pyenv's): one ABI, so the venv's numpy loads in
    each."""
    import glob
    import shutil
    import subprocess
    import sys

    found = {}
    for candidate in [
        sys.executable,
        shutil.which("python3.11"),
        "/usr/bin/python3",
        "/usr/bin/python3.11",
        *glob.glob("/root/.pyenv/versions/3.11*/bin/python3"),
    ]:
        if candidate and Path(candidate).exists():
            done = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version.split()[0])"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if done.returncode == 0 and done.stdout.startswith("3.11."):
                found.setdefault(done.stdout.strip(), candidate)
    return found


def test_npz_outputs_are_the_same_bytes_under_every_python_here(tmp_path):
    """np.savez forces zip64 records, which CPython wrote one way before 3.11.4 and another after: Debian's 3.11.2
    and pyenv's 3.11.7 on these machines wrote the same samples and FID statistics as different files, so
    a lock recorded with one never reproduced with the other. io.write_npz_to gives one content."""
    import subprocess
    import sysconfig

    pythons = _cpython_311s()
    if len(pythons) < 2:
        pytest.skip(f"one CPython 3.11 here ({', '.join(pythons)}): nothing to compare")
    np.save(tmp_path / "big.npy", np.arange(5000, dtype=np.uint8).reshape(50, 100))
    code = (
        "import sys, numpy as np; from vcarepro.core.io import write_npz, write_npz_to; "
        "write_npz(sys.argv[1], {'mu': np.arange(4.0), 'sigma': np.eye(4), 'num': np.int64(7)}); "
        "f = open(sys.argv[2], 'wb'); write_npz_to(f, {'arr_0': sys.argv[3], 'arr_1': np.arange(3)}); f.close()"
    )
    path = f"{ROOT / 'src'}:{sysconfig.get_paths()['purelib']}"
    outputs = {}
    for version, python in pythons.items():
        stats, samples = tmp_path / f"stats-{version}.npz", tmp_path / f"samples-{version}.npz"
        subprocess.run(
            [python, "-c", code, str(stats), str(samples), str(tmp_path / "big.npy")],
            check=True,
            timeout=120,
            env={"PYTHONPATH": path, "PATH": "/usr/bin:/bin"},
        )
        outputs[version] = (stats.read_bytes(), samples.read_bytes())
    assert len(set(outputs.values())) == 1, f"different bytes under {sorted(outputs)}"
    with np.load(tmp_path / f"stats-{version}.npz") as data:
        assert np.array_equal(data["sigma"], np.eye(4)) and int(data["num"]) == 7
    with np.load(tmp_path / f"samples-{version}.npz") as data:
        assert np.array_equal(data["arr_0"], np.arange(5000, dtype=np.uint8).reshape(50, 100))
