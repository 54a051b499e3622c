"""Long work shows its progress (issue 39): a line every progress.interval_s in a log, a bar on a terminal.

The reporter itself runs on a fake clock; then the stages themselves (data preparation, training with seeds in
worker processes, sampling, feature extraction) run at a micro size in a temporary project, once with their output
in a file and once on a pseudo-terminal, and must write the same bytes either way.
"""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from helpers import ROOT, load_stage, micro_params
from vcarepro.core import progress
from vcarepro.core.progress import Progress, parse_line
from vcarepro.tools.cluster.status import log_progress, status_lines

CLS, GEN = "deit_tiny-vca", "dit_s2-vca"
UPDATES_PER_EPOCH = 5  # 1,437 training digits in batches of 256


@pytest.fixture
def configured(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    progress.configure({"progress": {"interval_s": 10}}, "train_cls", CLS)
    yield
    progress.reset()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_log_gets_a_line_at_the_start_every_interval_and_at_the_end(configured):
    clock, out, read = Clock(), io.StringIO(), []

    def figures():
        read.append(clock.now)
        return {"epoch": "1/300", "loss": 6.9078, "lr": 1.2e-6}

    with Progress(
        None, 100, unit="step", images_per_step=1024, seed=0, figures=figures, clock=clock, stream=out
    ) as bar:
        for step in range(1, 36):  # a step a second: lines at 10, 20 and 30 s
            clock.now += 1.0
            bar.update(step)
    lines = out.getvalue().splitlines()
    assert lines[0] == f"train_cls {CLS} seed 0 | step 0/100 (0.0%) | start, 1024 images a step"
    assert lines[1] == (
        f"train_cls {CLS} seed 0 | step 10/100 (10.0%) | epoch 1/300 | loss 6.908 | lr 1.2e-06 | "
        f"1024 img/s | elapsed 0:00:10 | eta 0:01:30"
    )
    assert [parse_line(line).n for line in lines] == [0, 10, 20, 30, 35]
    assert [parse_line(line).eta for line in lines[1:4]] == ["0:01:30", "0:01:20", "0:01:10"]
    assert lines[-1].startswith(f"train_cls {CLS} seed 0 | step 35/100 (35.0%) | done in 0:00:35 | 1024 img/s")
    assert read == [1010.0, 1020.0, 1030.0, 1035.0]  # the figures (a loss on a GPU: a sync) only when a line is due


def test_a_resumed_loop_counts_its_eta_from_this_runs_pace_and_a_finished_one_says_nothing(configured):
    clock, out = Clock(), io.StringIO()
    with Progress("sampling", 1000, start=500, unit="sample", clock=clock, stream=out) as bar:
        clock.now += 10.0
        bar.update(600)
    assert out.getvalue().splitlines()[:2] == [
        f"train_cls {CLS} sampling | sample 500/1000 (50.0%) | start, resuming",
        f"train_cls {CLS} sampling | sample 600/1000 (60.0%) | 10 img/s | elapsed 0:00:10 | eta 0:00:40",
    ]
    finished = io.StringIO()
    with Progress(None, 10, start=10, clock=clock, stream=finished) as bar:
        bar.update(10)
    assert finished.getvalue() == ""


def test_a_long_run_reads_in_days_and_a_count_without_total_has_no_eta(configured):
    clock, out = Clock(), io.StringIO()
    with Progress(None, 375_000, clock=clock, stream=out) as bar:
        clock.now += 3600.0
        bar.update(1000)
    assert "eta 15d 14:00:00" in out.getvalue()
    count = io.StringIO()
    with Progress("extracting val", None, unit="image", clock=clock, stream=count) as bar:
        clock.now += 30.0
        bar.update(700)
    lines = count.getvalue().splitlines()
    assert lines[1] == f"train_cls {CLS} extracting val | image 700 | 23.3 img/s | elapsed 0:00:30"
    assert parse_line(lines[1]).total is None and parse_line(lines[1]).eta is None


def test_only_a_configured_rank_zero_reports(monkeypatch):
    out = io.StringIO()
    progress.reset()
    Progress(None, 10, interval_s=0, stream=out).update(5)  # a library call outside a stage (a test, the preflight)
    progress.configure({}, "train_cls", CLS, interval_s=0)
    try:
        monkeypatch.setenv("RANK", "1")
        Progress(None, 10, stream=out).update(5)
        Progress(None, 10, stream=out, enabled=False).update(5)
        assert out.getvalue() == ""
        monkeypatch.setenv("RANK", "0")
        Progress(None, 10, stream=out).update(5)
        assert len(out.getvalue().splitlines()) == 2  # start, step 5
    finally:
        progress.reset()


def test_an_update_costs_a_clock_comparison(configured):
    bar = Progress(None, 10**9, stream=io.StringIO(), figures=lambda: {"loss": 1.0})
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for step in range(100_000):
            bar.update(step)
        best = min(best, time.perf_counter() - start)
    assert best / 100_000 < 2e-6, f"{best / 100_000 * 1e9:.0f} ns an update"  # about 150 ns on a quiet machine


LOG = """\
train_gen dit_s2-vca seed 0 | step 0/400000 (0.0%) | start, 256 images a step
Loading stuff
train_gen dit_s2-vca seed 0 | step 1200/400000 (0.3%) | epoch 1 | loss 0.1523 | lr 0.0001 | 812 img/s | elapsed 0:06:18 | eta 1d 10:53:02
train_gen dit_s2-vca seed 1 | step 0/400000 (0.0%) | start, 256 images a step
train_gen dit_s2-vca seed 1 | step 1100/400000 (0.3%) | epoch 1 | loss 0.1611 | lr 0.0001 | 790 img/s | elapsed 0:06:10 | eta 1d 12:01:00
train_gen dit_s2-vca seed 0 | step 1400/400000 (0.4%) | epoch 1 | loss 0.1499 | lr 0.0001 | 805 img/s | elapsed 0:07:20 | eta 1d 10:50:00
"""  # noqa: E501  (a SLURM job's log: the loops' lines as long as they are)


def test_cluster_status_shows_each_running_loops_step_of_total_and_eta(tmp_path):
    log = tmp_path / "123_0_log.out"
    log.write_text(LOG)
    shown = log_progress(log, f"train_gen@{GEN}")
    assert shown == (
        "seed 1: step 1100/400000 (0.3%), eta 1d 12:01:00; seed 0: step 1400/400000 (0.3%), eta 1d 10:50:00"
    )
    log.write_text(LOG + f"train_gen {GEN} seed 1 | step 400000/400000 (100.0%) | done in 1d 12:00:00 | 800 img/s\n")
    assert log_progress(log, f"train_gen@{GEN}") == "seed 0: step 1400/400000 (0.3%), eta 1d 10:50:00"
    assert log_progress(tmp_path / "absent.out", "x") == ""
    rows = [
        {
            "stage": f"train_gen@{GEN}",
            "state": "running",
            "job": "123",
            "log": ".slurm/logs/123_0_log.err",
            "note": "",
            "progress": shown,
        },
        {"stage": "report", "state": "waiting", "job": "", "log": "", "note": "", "progress": ""},
    ]
    table = status_lines(rows)
    assert table[0].split() == ["stage", "state", "job", "progress", "log"]
    assert table[1].startswith(f"train_gen@{GEN}  running  123      seed 1: step 1100/400000 (0.3%), eta 1d")
    assert table[1].endswith(" .slurm/logs/123_0_log.err")
    for row in rows:
        row["progress"] = ""
    assert status_lines(rows)[0].split() == ["stage", "state", "job", "log"]  # as before, while nothing reports


def test_the_vae_encoding_of_prepare_gen_reports_images_of_the_total(tmp_path, monkeypatch, capsys, one_torch_thread):
    from vcarepro.data.embedded import export_digits
    from vcarepro.params.config import compose
    from vcarepro.tools.standins import write_random_vae

    export_digits(tmp_path / "data" / "cls", val_fraction=0.9, seed=0)  # 179 training digits
    write_random_vae(tmp_path / "vae", seed=0, block_out_channels=(8, 16), sample_size=16)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RANK", raising=False)
    progress.configure({"progress": {"interval_s": 0}}, "prepare_gen")
    try:
        settings = dict(
            compose(["scale=paper"])["prepare_gen"],
            vae=str(tmp_path / "vae"),
            image_size=16,
            vae_batch_size=64,
            shard_size=100,
        )
        load_stage("prepare_gen").prepare_latents(settings)
    finally:
        progress.reset()
    seen = loops(capsys.readouterr().out)["prepare_gen encoding"]
    assert [(parsed.state, parsed.n, parsed.total) for parsed, _ in seen] == [
        ("start", 0, 179),
        ("running", 64, 179),
        ("running", 100, 179),
        ("running", 164, 179),
        ("running", 179, 179),
        ("done", 179, 179),
    ]  # batches of 64 within shards of 100


# -- the stages themselves ------------------------------------------------------------------------------------------

PIPELINE = [
    ("prepare_cls.py",),
    ("prepare_gen.py",),
    ("train_cls.py", "--run", CLS),
    ("eval_cls.py", "--run", CLS),
    ("train_gen.py", "--run", GEN),
    ("sample_gen.py", "--run", GEN),
    ("fid_reference.py",),
    ("eval_gen.py", "--run", GEN),
]
# The DVC outputs of those stages (dvclive's plots carry wall-clock timestamps and are no output's content).
OUTPUTS = [
    "data/cls",
    "data/gen",
    "data/fid_reference",
    f"runs/cls/{CLS}/train",
    f"runs/cls/{CLS}/live/metrics.json",
    f"runs/cls/{CLS}/metrics.json",
    f"runs/cls/{CLS}/provenance.json",
    f"runs/gen/{GEN}/train",
    f"runs/gen/{GEN}/live/metrics.json",
    f"runs/gen/{GEN}/samples",
    f"runs/gen/{GEN}/metrics.json",
    f"runs/gen/{GEN}/provenance.json",
]


@pytest.fixture(scope="module")
def imagenet(tmp_path_factory):
    from vcarepro.tools.standins import MiniImageNet

    root = tmp_path_factory.mktemp("imagenet")
    MiniImageNet.synthetic(classes=4, train_per_class=8, val_per_class=2).write_official(root)
    return root


def project(path: Path, imagenet: Path) -> Path:
    """Two directories: the pipeline's stages on the digits, and prepare_cls on the miniature ImageNet archives."""
    params = micro_params(cls_runs=[CLS], gen_runs=[GEN])
    params["cls_runs"][CLS]["seeds"] = [0, 1]
    params["distributed"]["seed_processes"] = 2  # the seeds in forked workers: their lines must reach the log
    params["gen_recipe"].update(steps=6, log_every=3, ckpt_every=6)
    params["sampling"].update(batch_size=35)
    params["progress"]["interval_s"] = 0  # a line at every update
    (path / "digits").mkdir(parents=True)
    (path / "digits" / "params.yaml").write_text(yaml.safe_dump(params))
    params["prepare_cls"].update(
        source="imagenet", imagenet_root=str(imagenet), expect_full=False, workers=1, other_copy="stand-ins"
    )
    (path / "imagenet").mkdir()
    (path / "imagenet" / "params.yaml").write_text(yaml.safe_dump(params))
    return path


def commands(path: Path):
    for args in PIPELINE:
        yield path / "digits", [str(ROOT / "stages" / args[0]), *args[1:]]
    yield path / "imagenet", [str(ROOT / "stages" / "prepare_cls.py")]


ENV = {**os.environ, "DVC_NO_ANALYTICS": "1", "VCAREPRO_WARM_IDLE": "30", "PYTHONWARNINGS": "ignore"}


def in_a_log(path: Path) -> Dict[str, str]:
    """Each stage through stages/run.py (as dvc.yaml starts it), stdout and stderr to files; their texts."""
    out = {}
    for cwd, args in commands(path):
        with open(cwd / "stdout.log", "w") as stdout, open(cwd / "stderr.log", "w") as stderr:
            code = subprocess.run(
                [sys.executable, str(ROOT / "stages" / "run.py"), *args],
                cwd=cwd,
                env=ENV,
                stdout=stdout,
                stderr=stderr,
                timeout=600,
            ).returncode
        assert code == 0, (args, (cwd / "stdout.log").read_text()[-2000:], (cwd / "stderr.log").read_text()[-3000:])
        out["stdout"] = out.get("stdout", "") + (cwd / "stdout.log").read_text()
        out["stderr"] = out.get("stderr", "") + (cwd / "stderr.log").read_text()
    return out


def on_a_terminal(path: Path) -> str:
    """Each stage as above, its stdin, stdout and stderr a pseudo-terminal of 120 columns; what it showed."""
    shown = b""
    for cwd, args in commands(path):
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "stages" / "run.py"), *args],
            cwd=cwd,
            env=ENV,
            stdin=slave,
            stdout=slave,
            stderr=slave,
        )
        os.close(slave)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every end of the terminal is closed
                    break
                shown += data
            elif proc.poll() is not None:  # ended, and nothing left to read
                break
        os.close(master)
        assert proc.wait(timeout=60) == 0, (args, shown.decode(errors="replace")[-3000:])
    return shown.decode(errors="replace")


def output_bytes(path: Path) -> Dict[str, bytes]:
    files = {}
    for root, rel in [(path / "digits", out) for out in OUTPUTS] + [(path / "imagenet", "data/cls")]:
        target = root / rel
        for file in sorted([target] if target.is_file() else target.rglob("*")):
            if file.is_file():
                files[str(file.relative_to(path))] = file.read_bytes()
    return files


@pytest.fixture(scope="module")
def logged(tmp_path_factory, imagenet):
    path = project(tmp_path_factory.mktemp("logged"), imagenet)
    return path, in_a_log(path)


def loops(text: str) -> Dict[str, List]:
    """Every loop's lines, by label, in order."""
    found: Dict[str, List] = {}
    for line in text.splitlines():
        parsed = parse_line(line)
        if parsed is not None:
            found.setdefault(parsed.label, []).append((parsed, line))
    return found


@pytest.mark.slow
def test_each_stage_reports_its_loops_in_its_log_with_step_of_total_eta_and_loss(logged):
    path, out = logged
    seen = loops(out["stdout"])
    expected = {  # label: (unit, total)
        "prepare_gen extractor training": ("step", 23),  # ceil(1,437 digits / 64)
        f"train_cls {CLS} seed 0": ("step", UPDATES_PER_EPOCH),
        f"train_cls {CLS} seed 1": ("step", UPDATES_PER_EPOCH),  # from its worker process, the seed named
        f"eval_cls {CLS} seed 1 val": ("image", 360),
        f"train_gen {GEN} seed 0": ("step", 6),
        f"sample_gen {GEN} seed 0 sampling": ("sample", 70),
        "fid_reference reference features": ("image", 1437),
        f"eval_gen {GEN} seed 0 features": ("image", 70),
        "prepare_cls checking train": ("image", None),  # read from the archive as it is checked: no count before
        "prepare_cls checking val": ("image", None),
    }
    assert set(expected) <= set(seen), sorted(seen)
    for label, (unit, total) in expected.items():
        lines = seen[label]
        states = [parsed.state for parsed, _ in lines]
        assert states[0] == "start" and states[-1] == "done" and set(states[1:-1]) == {"running"}, (label, states)
        steps = [parsed.n for parsed, _ in lines]
        assert steps == sorted(steps) and len(set(steps[1:-1])) == len(steps) - 2, (label, steps)  # monotone
        assert all(parsed.unit == unit and parsed.total == total for parsed, _ in lines), label
        if total is not None:
            assert steps[-1] == total, label
            assert all(parsed.eta for parsed, _ in lines[1:-1]), label
    for label in (f"train_cls {CLS} seed 0", f"train_gen {GEN} seed 0"):
        for _, line in seen[label][1:-1]:
            assert re.search(
                r"\| epoch [\d/]+ \| loss \d+\.\d{4} .*\| lr [\d.e-]+ \| [\d.]+ img/s \| elapsed "
                r"\d:\d\d:\d\d \| eta \d:\d\d:\d\d$",
                line,
            ), line
    epoch_end = [line for line in out["stdout"].splitlines() if line.startswith(f"train_cls {CLS} seed 1 | epoch 1/1")]
    assert len(epoch_end) == 1 and re.search(
        r"epoch 1/1 done \| train loss \d\.\d{4} \| lr [\d.e-]+ \| val top-1 "
        r"[\d.]+ \(best [\d.]+ at epoch 1\)$",
        epoch_end[0],
    ), epoch_end
    assert parse_line(epoch_end[0]) is None  # not a position: cluster status skips it
    # nothing of it on stderr, and none of it in an output: timings stay in logs and timings/
    assert " | eta " not in out["stderr"] and "\r" not in out["stderr"], out["stderr"][-2000:]
    for name, data in output_bytes(path).items():
        if name.endswith((".json", ".csv", ".txt", ".sha256")):
            assert b"img/s" not in data and b"elapsed" not in data, name


@pytest.mark.slow
def test_on_a_terminal_the_stages_draw_bars_and_write_the_same_bytes(tmp_path, logged, imagenet):
    logged_path, _ = logged
    path = project(tmp_path, imagenet)
    shown = on_a_terminal(path)
    assert "\r" in shown and re.search(rf"train_gen {GEN} seed 0: +100%\|[^\r\n]*\| 6/6 ", shown), shown[-3000:]
    assert re.search(rf"sample_gen {GEN} seed 0 sampling: +100%\|[^\r\n]*\| 70/70 ", shown), shown[-3000:]
    assert f"train_gen {GEN} seed 0 | step 0/6 (0.0%) | start" not in shown  # a bar, not lines
    assert f"train_cls {CLS} seed 1 | step 0/5 (0.0%) | start" in shown  # a seed worker: lines, even here
    ours, theirs = output_bytes(path), output_bytes(logged_path)
    assert ours.keys() == theirs.keys() and len(ours) > 20
    assert [name for name in ours if ours[name] != theirs[name]] == []
