"""The training loops themselves: precision, torch.compile, checkpoint contents and resume."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save

from helpers import TRAINED, same_weights, train_tiny
from vcarepro.core.integrity import sha256_file
from vcarepro.core.io import write_manifest
from vcarepro.core.recipes import GenRecipe
from vcarepro.data.embedded import export_digits
from vcarepro.params.config import compose
from vcarepro.params.runs import cls_run
from vcarepro.train.checkpoint import load_checkpoint, previous_path, save_checkpoint
from vcarepro.train.classification import ClassifierSpec, train_classifier
from vcarepro.train.distributed import DistInfo
from vcarepro.train.generation import GeneratorSpec, train_generator
from vcarepro.train.precision import MixedPrecision

UPDATES_PER_EPOCH = 5  # 1,437 training digits in batches of 256, the last one dropped
CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    root = tmp_path_factory.mktemp("digits") / "cls"
    counts = export_digits(root, val_fraction=0.2, seed=0)
    assert counts["train"] // 256 == UPDATES_PER_EPOCH
    return root


@pytest.fixture(scope="module")
def embedded():
    return compose([])


def tiny_cls(embedded, **recipe):
    spec = ClassifierSpec("deit_tiny", "vca", {}, dict(embedded["cls_shape"], depth=1, embed_dim=32))
    return spec, cls_run(embedded, "deit_tiny-vca").recipe.model_copy(update=dict(epochs=2, batch_size=256, **recipe))


def train_cls(spec, recipe, digits, tmp, **kw):
    return train_classifier(
        spec=spec,
        recipe=recipe,
        data_root=digits,
        seed=0,
        out_dir=tmp / "out",
        ckpt_dir=tmp / "ckpt",
        info=CPU,
        fingerprint="f",
        **kw,
    )


def test_precision_names_are_checked_and_only_fp16_scales_the_loss():
    with pytest.raises(ValueError, match="precision='fp8' is unknown"):
        MixedPrecision("fp8", torch.device("cpu"))
    assert not MixedPrecision("bf16", torch.device("cpu")).scaler.is_enabled()
    assert MixedPrecision("fp16", torch.device("cpu")).scaler.is_enabled()
    with MixedPrecision("bf16", torch.device("cpu")).autocast():
        assert torch.ones(2, 2).mm(torch.ones(2, 2)).dtype == torch.bfloat16
    with MixedPrecision("fp32", torch.device("cpu")).autocast():
        assert torch.ones(2, 2).mm(torch.ones(2, 2)).dtype == torch.float32


@pytest.mark.parametrize("path", ["pil", "fast"])
@pytest.mark.parametrize("workers", [0, 2])
def test_an_interrupted_classifier_resumes_to_the_same_weights(
    tmp_path, digits, embedded, one_torch_thread, workers, path
):
    # with augmentation on, so that the augmentation streams (in the workers, and the fast path's erasing and mixing
    # in this process), not only the data order, must resume
    spec, recipe = tiny_cls(embedded, workers=workers, train_augment=True, input_path=path, hflip=0.5, reprob=0.25)
    straight = train_cls(spec, recipe, digits, tmp_path / "a")
    # the first run stops at the end of epoch 1, the second resumes from its checkpoint
    train_cls(spec, recipe, digits, tmp_path / "b", max_steps=UPDATES_PER_EPOCH)
    assert load_checkpoint(tmp_path / "b" / "ckpt" / "last.pt")["epoch"] == 1
    resumed = train_cls(spec, recipe, digits, tmp_path / "b")
    a = load_file(str(tmp_path / "a" / "out" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "out" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["val_top1"] == straight["val_top1"]


def test_a_checkpoint_of_other_settings_is_not_resumed(tmp_path, digits, embedded, one_torch_thread):
    spec, recipe = tiny_cls(embedded)
    train_cls(spec, recipe, digits, tmp_path, max_steps=1)
    figures = train_classifier(
        spec=spec,
        recipe=recipe,
        data_root=digits,
        seed=0,
        out_dir=tmp_path / "out",
        ckpt_dir=tmp_path / "ckpt",
        info=CPU,
        fingerprint="other",
    )
    assert figures["epoch"] == 2 and load_checkpoint(tmp_path / "ckpt" / "last.pt")["fingerprint"] == "other"


def test_fp16_training_keeps_its_loss_scale_in_the_checkpoint(tmp_path, digits, embedded, one_torch_thread):
    spec, recipe = tiny_cls(embedded, precision="fp16", clip_grad=1.0)
    figures = train_cls(spec, recipe, digits, tmp_path, max_steps=1)
    scaler = load_checkpoint(tmp_path / "ckpt" / "last.pt")["scaler"]
    assert scaler["scale"] > 0 and "_growth_tracker" in scaler
    assert torch.isfinite(torch.tensor(figures["train_loss"]))
    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert all(v.dtype == torch.float32 for v in weights.values())  # autocast leaves the master weights fp32


def test_bf16_and_compiled_steps_train_and_save_plain_state_dicts(tmp_path, digits, embedded, one_torch_thread):
    spec, recipe = tiny_cls(embedded, precision="bf16", compile="eager")
    figures = train_cls(spec, recipe, digits, tmp_path, max_steps=1)
    assert torch.isfinite(torch.tensor(figures["train_loss"]))
    keys = load_file(str(tmp_path / "out" / "model.safetensors")).keys()
    assert keys == spec.create(num_classes=10).state_dict().keys()  # no "_orig_mod." prefixes
    assert load_checkpoint(tmp_path / "ckpt" / "last.pt")["scaler"] == {}  # bf16 needs no loss scale


def test_generator_fp16_and_compile_paths_write_scaler_state(tmp_path, embedded, one_torch_thread):
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    data = tmp_path / "gen"
    data.mkdir()
    save_file(
        {"inputs": torch.randn(32, 1, 8, 8, generator=g), "labels": torch.arange(32) % 10},
        str(data / "train.safetensors"),
    )
    (data / "meta.json").write_text('{"kind": "pixels"}')
    write_manifest(data)  # as prepare_gen does
    spec = GeneratorSpec("dit_s2", "vca", {}, dict(embedded["gen_shape"], depth=1, hidden_size=32))
    recipe = GenRecipe.model_construct(**embedded["gen_recipe"]).model_copy(
        update=dict(steps=2, batch_size=8, ckpt_every=2, precision="fp16", compile="eager")
    )
    figures = train_generator(
        spec=spec,
        objective="ddpm",
        recipe=recipe,
        data_root=data,
        seed=0,
        out_dir=tmp_path / "out",
        ckpt_dir=tmp_path / "ckpt",
        info=CPU,
        fingerprint="f",
    )
    assert figures["steps"] == 2
    assert load_checkpoint(tmp_path / "ckpt" / "last.pt")["scaler"]["scale"] > 0
    assert Path(tmp_path / "out" / "model_ema.safetensors").is_file()


def test_the_train_step_benchmark_projects_a_full_run_from_its_step_time(one_torch_thread):
    from vcarepro.tools.bench.train_step import bench_train_step

    row = bench_train_step("sit_s8-vca", batch=2, device="cpu", precision="fp32", min_run_time=0.2)
    assert (row["objective"], row["model"]["arch"], row["global_batch"], row["recipe_steps"]) == (
        "flow",
        "dit_s8",
        256,
        400_000,
    )
    assert row["projected_device_hours"] == pytest.approx(400_000 * 128 * row["ms_per_step"] / 1e3 / 3600)


def test_the_proxy_classification_step_projects_epochs_of_imagenet_100(one_torch_thread, monkeypatch):
    from vcarepro.tools.bench import train_step
    from vcarepro.tools.bench.timing import Measured

    # a fixed step time
    monkeypatch.setattr(train_step, "measure_step", lambda build, batch, device, **kw: Measured(batch, 0.25))
    row = train_step.bench_train_step("deit_tiny-vca", scale="proxy", batch=8, device="cpu", precision="fp32")
    # 100 epochs x floor(126,689 / 1024) = 123 updates, each 128 device steps of 8, at 0.25 s
    assert (row["objective"], row["global_batch"], row["recipe_steps"]) == ("classification", 1024, 100 * 123)
    assert row["projected_device_hours"] == pytest.approx(100 * 123 * 128 * 0.25 / 3600)
    with pytest.raises(KeyError, match="no run 'sit_s2-vca' at scale proxy"):
        train_step.bench_train_step("sit_s2-vca", scale="proxy", batch=2)


def test_dit_batches_walk_shuffled_epochs_dealt_disjointly_to_ranks():
    from vcarepro.train.generation import epoch_batch

    ranks = [DistInfo(rank=r, world_size=2, local_rank=r, device=torch.device("cpu")) for r in range(2)]
    # 11 examples, 2 ranks, 2 per rank: 5 per rank per epoch, 2 full batches each, the rest dropped
    epoch0 = [torch.cat([epoch_batch(step, n=11, per_rank=2, info=info, seed=0) for step in (0, 1)]) for info in ranks]
    seen = torch.cat(epoch0)
    assert len(seen) == 8 and len(set(seen.tolist())) == 8  # disjoint across ranks, no repeats in an epoch
    epoch1 = torch.cat([epoch_batch(2, n=11, per_rank=2, info=info, seed=0) for info in ranks])
    assert not torch.equal(epoch1, torch.cat([epoch0[0][:2], epoch0[1][:2]]))  # a new permutation each epoch
    assert torch.equal(
        epoch_batch(3, n=11, per_rank=2, info=ranks[0], seed=0), epoch_batch(3, n=11, per_rank=2, info=ranks[0], seed=0)
    )  # a function of the step alone
    assert not torch.equal(epoch_batch(0, n=11, per_rank=2, info=ranks[0], seed=1), epoch0[0][:2])


class RecordingLive:
    """Stands in for dvclive.Live: records (step, name, value) of every logged metric."""

    def __init__(self):
        self.step, self.logged = 0, []

    def log_metric(self, name, value):
        self.logged.append((self.step, name, value))


SEEDS_SCRIPT = """
import sys, torch
from pathlib import Path
from vcarepro.params.config import compose
from vcarepro.params.runs import cls_run
from vcarepro.train.classification import ClassifierSpec, train_classifier
from vcarepro.train.seeds import train_seeds
torch.set_num_threads(1)
digits, root, processes = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 2
p = compose([])
spec = ClassifierSpec("deit_tiny", "vca", {}, dict(p["cls_shape"], depth=1, embed_dim=32))
recipe = cls_run(p, "deit_tiny-vca").recipe.model_copy(update=dict(epochs=epochs, batch_size=256))
def train_one(seed, info, live):
    return train_classifier(spec=spec, recipe=recipe, data_root=digits, seed=seed, out_dir=root / f"out{seed}",
                            ckpt_dir=root / f"ckpt{seed}", info=info, live=live, fingerprint="f",
                            log_prefix=f"seed_{seed}/")
train_seeds("run", [0, 1, 2], root / "live", train_one, seed_processes=processes)
"""


def test_seeds_trained_in_forked_workers_equal_seeds_trained_one_after_another(tmp_path, digits):
    # in fresh processes: a process that has run autograd cannot fork workers that do (torch's
    # "Autograd and Fork"); a stage forks before any backward, and so does this script
    def run(name, processes):
        result = subprocess.run(
            [sys.executable, "-c", SEEDS_SCRIPT, str(digits), str(tmp_path / name), str(processes)],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        return result

    one, side = run("a", 1), run("b", 2)
    assert "worker processes" not in one.stdout
    assert "run: seeds [0, 1, 2] in 2 worker processes, 1 thread(s) each" in side.stdout
    assert "did not finish in a worker" not in side.stderr
    assert "seed 2: already trained (2 of 2 epochs" in side.stdout  # the stage's pass reads each worker's result back
    for seed in (0, 1, 2):  # one thread each way: the same arithmetic, so the same weights and history
        a, b = (load_file(str(tmp_path / d / f"out{seed}" / "model.safetensors")) for d in ("a", "b"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        assert (tmp_path / "a" / f"out{seed}" / "history.json").read_text() == (
            tmp_path / "b" / f"out{seed}" / "history.json"
        ).read_text()
    summary = (tmp_path / "b" / "live" / "metrics.json").read_text()
    assert '"seed_2"' in summary and '"train_seconds"' not in summary  # a wall time is in no DVC output
    seconds = json.loads((tmp_path / "timings" / tmp_path.name / "b.json").read_text())["train_seconds"]
    assert set(seconds) == {"seed_0", "seed_1", "seed_2"} and all(v > 0 for v in seconds.values())


def _forked_children(pid: int) -> list:
    """The live processes forked from ``pid`` (same command line), oldest first."""
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    forked = [
        int(c)
        for c in children
        if Path(f"/proc/{c}/cmdline").is_file() and Path(f"/proc/{c}/cmdline").read_bytes() == cmdline
    ]
    return sorted(forked, key=lambda c: int(Path(f"/proc/{c}/stat").read_text().rsplit(")", 1)[1].split()[19]))


@pytest.mark.slow
@pytest.mark.alone
def test_sigterm_to_one_seed_worker_stops_the_stage_and_the_rerun_is_bit_identical(tmp_path, digits):
    from vcarepro.core.integrity import check

    def command(name):
        return [sys.executable, "-c", SEEDS_SCRIPT, str(digits), str(tmp_path / name), "2", "6"]

    # in tmp_path: the stage writes its wall times to ./timings
    straight = subprocess.run(command("straight"), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert straight.returncode == 0, straight.stderr[-2000:]
    process = subprocess.Popen(command("b"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    checkpoint = tmp_path / "b" / "ckpt1" / "last.pt"
    deadline = time.monotonic() + 300
    while not checkpoint.is_file():  # seed 1 (the second worker's) has something to resume from
        assert process.poll() is None and time.monotonic() < deadline, "seed 1 ended before its first checkpoint"
        time.sleep(0.02)
    worker = _forked_children(process.pid)[1]  # seeds [0, 2] in the first worker, [1] in the second
    os.kill(worker, signal.SIGTERM)
    sent = time.monotonic()
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143, err[-2000:]  # the stage stops, as for a preempted rank: DVC caches nothing
    assert time.monotonic() - sent < 60
    stopped = [line for line in err.splitlines() if line.startswith("run: stopped by SIGTERM in a seed worker (")]
    assert len(stopped) == 1 and "seed 1 at epoch" in stopped[0]  # one line; the other worker stopped with it
    assert "re-run `dvc repro` to resume" in err and "running them here" not in err
    assert not any((tmp_path / "b" / f"out{seed}" / "model.safetensors").exists() for seed in (0, 1, 2))
    assert check(checkpoint) is None  # the worker's checkpoint is kept, intact

    again = subprocess.run(command("b"), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "seed 1: resuming at epoch" in again.stdout or "seed 1: already trained" in again.stdout
    for seed in (0, 1, 2):  # every seed as the uninterrupted run made it, the preempted one included
        a, b = (load_file(str(tmp_path / d / f"out{seed}" / "model.safetensors")) for d in ("straight", "b"))
        assert all(torch.equal(a[k], b[k]) for k in a), seed


def test_a_sigterm_before_training_installs_its_own_flag_is_not_lost():
    from vcarepro.train.preemption import stop_on_sigterm

    with stop_on_sigterm() as worker:  # a seed worker's flag, while the seed is still setting up
        os.kill(os.getpid(), signal.SIGTERM)
        assert worker.requested
        with stop_on_sigterm() as training:  # the training loop's own
            assert training.requested  # it stops at its first step boundary
    with stop_on_sigterm() as worker:
        with stop_on_sigterm() as training:
            os.kill(os.getpid(), signal.SIGTERM)
        assert worker.requested  # and one during training reaches the worker's flag on the way out


def test_a_seed_whose_worker_fails_is_trained_by_the_stage_with_the_reason_said(capsys):
    from vcarepro.train.seeds import run_in_workers

    def work(seed):
        if seed == 1:
            raise ValueError("no data for seed 1")
        return {"seed": seed}

    done = run_in_workers("run", [0, 1, 2], work, 2)
    assert done == {0: {"seed": 0}, 2: {"seed": 2}}
    assert "run: seeds 1 (ValueError: no data for seed 1) did not finish in a worker" in capsys.readouterr().err


def test_a_rerun_after_a_finished_checkpoint_replays_the_logs_and_returns_the_figures(
    tmp_path, digits, embedded, one_torch_thread
):
    spec, recipe = tiny_cls(embedded)
    first_log, again_log = RecordingLive(), RecordingLive()
    first = train_cls(spec, recipe, digits, tmp_path, live=first_log)
    again = train_cls(spec, recipe, digits, tmp_path, live=again_log)  # DVC deleted the logs, not the checkpoint
    assert again_log.logged == first_log.logged and {s for s, _, _ in again_log.logged} == {1, 2}
    assert {k: v for k, v in again.items() if k != "train_seconds"} == {
        k: v for k, v in first.items() if k != "train_seconds"
    }


def test_a_diverging_classifier_stops_at_once_naming_the_step_and_keeps_its_last_good_checkpoint(
    tmp_path, digits, embedded, one_torch_thread
):
    from vcarepro.train.classification import NonFiniteLossError

    spec, recipe = tiny_cls(embedded)
    train_cls(spec, recipe, digits, tmp_path, max_steps=UPDATES_PER_EPOCH)  # one good epoch
    good = (tmp_path / "ckpt" / "last.pt").read_bytes()
    # other settings (fingerprint "b"): trained afresh, and diverging within its first epoch
    with pytest.raises(NonFiniteLossError, match=r"became (nan|inf|-inf) at epoch 0, batch \d+; lower the learning"):
        train_classifier(
            spec=spec,
            recipe=recipe.model_copy(update=dict(lr=1e30, warmup_epochs=0)),
            data_root=digits,
            seed=0,
            out_dir=tmp_path / "out2",
            ckpt_dir=tmp_path / "ckpt",
            info=CPU,
            fingerprint="b",
        )
    assert (tmp_path / "ckpt" / "last.pt").read_bytes() == good and not (tmp_path / "out2").exists()


def test_a_diverging_generator_stops_at_once(tmp_path, embedded, one_torch_thread):
    from safetensors.torch import save_file

    from vcarepro.train.classification import NonFiniteLossError

    data = tmp_path / "gen"
    data.mkdir()
    save_file({"inputs": torch.randn(32, 1, 8, 8), "labels": torch.arange(32) % 10}, str(data / "train.safetensors"))
    (data / "meta.json").write_text('{"kind": "pixels"}')
    write_manifest(data)  # as prepare_gen does
    spec = GeneratorSpec("dit_s2", "mhsa", {}, dict(embedded["gen_shape"], depth=1, hidden_size=32))
    recipe = GenRecipe.model_construct(**embedded["gen_recipe"]).model_copy(
        update=dict(steps=20, batch_size=8, ckpt_every=100, lr=1e30)
    )
    with pytest.raises(NonFiniteLossError, match=r"at step \d+; lower the learning rate"):
        train_generator(
            spec=spec,
            objective="ddpm",
            recipe=recipe,
            data_root=data,
            seed=0,
            out_dir=tmp_path / "out",
            ckpt_dir=tmp_path / "ckpt",
            info=CPU,
            fingerprint="f",
        )
    assert not (tmp_path / "out").exists() and not (tmp_path / "ckpt" / "last.pt").exists()


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


def trained_with_two_checkpoints(workdir: Path):
    """A finished run of the driver's classifier, its weights and figures read and its outputs removed: last.pt
    (epoch 8) and last.pt.prev (epoch 7), both intact. (Killing a run instead could land between save_checkpoint's
    renames, where last.pt is briefly absent.)"""
    out = train_tiny("cls", workdir)
    weights = load_file(str(workdir / "out" / TRAINED["cls"]))
    shutil.rmtree(workdir / "out")
    assert load_checkpoint(workdir / "ckpt" / "last.pt.prev")["epoch"] == 7
    return weights, out.split("finished", 1)[1].split("'train_seconds'")[0]


@pytest.mark.slow
def test_a_damaged_checkpoint_is_passed_over_for_the_one_before_and_the_run_ends_bit_identical(tmp_path):
    weights, figures = trained_with_two_checkpoints(tmp_path)
    ckpt = tmp_path / "ckpt"
    epoch_before = load_checkpoint(ckpt / "last.pt.prev")["epoch"]
    zero_tensor_records(ckpt / "last.pt")  # a torn copy or bad sector: same size, headers intact
    out = train_tiny("cls", tmp_path)
    assert (
        f"seed 0: checkpoint {ckpt / 'last.pt'} fails its checksum; resuming at epoch {epoch_before + 1} of 8 "
        f"from {ckpt / 'last.pt.prev'}"
    ) in out
    assert same_weights(tmp_path / "out" / TRAINED["cls"], weights)
    assert out.split("finished", 1)[1].split("'train_seconds'")[0] == figures
    assert load_checkpoint(ckpt / "last.pt.prev")["epoch"] == 7  # the damaged file was not rotated into .prev


@pytest.mark.slow
def test_two_damaged_checkpoints_start_afresh_and_say_so(tmp_path):
    weights, _ = trained_with_two_checkpoints(tmp_path)
    ckpt = tmp_path / "ckpt"
    zero_tensor_records(ckpt / "last.pt")
    (ckpt / "last.pt.prev").write_bytes((ckpt / "last.pt.prev").read_bytes()[:-7])  # and a truncated one
    out = train_tiny("cls", tmp_path)
    assert (
        f"seed 0: checkpoint {ckpt / 'last.pt'} fails its checksum and {ckpt / 'last.pt.prev'} fails its "
        f"checksum; starting afresh"
    ) in out
    assert "weights_only" not in out and "resuming" not in out
    assert same_weights(tmp_path / "out" / TRAINED["cls"], weights)


@pytest.mark.slow
def test_same_seed_in_a_fresh_process_gives_identical_bytes_and_another_seed_differs(tmp_path):
    for name, seed in (("first", 0), ("again", 0), ("seed1", 1)):
        train_tiny("gen", tmp_path / name, seed)
    first = load_file(str(tmp_path / "first" / "out" / TRAINED["gen"]))
    assert (tmp_path / "again" / "out" / TRAINED["gen"]).read_bytes() == save(first)
    assert (tmp_path / "again" / "ckpt" / "last.pt").read_bytes() == (
        tmp_path / "first" / "ckpt" / "last.pt"
    ).read_bytes()
    assert load_checkpoint(tmp_path / "first" / "ckpt" / "last.pt")["step"] == 600
    other = load_file(str(tmp_path / "seed1" / "out" / TRAINED["gen"]))
    assert any(not torch.equal(other[k], first[k]) for k in first)  # init, data order, noise all follow the seed
