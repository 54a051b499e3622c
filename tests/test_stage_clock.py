"""The stage clock (vcarepro.core.stage_clock): who records a stage's wall time, under which DVC run, and the table
the report prints at the end of a `dvc repro` (tests/test_pipeline.py holds it on a real micro pipeline)."""

import json
import os
import subprocess
import sys
import time

import pytest

from vcarepro.core import stage_clock


def test_only_the_stages_own_process_under_dvc_takes_the_start_and_it_leaves_the_environment():
    env = {"DVC_STAGE": "train_cls@deit_tiny-vca"}
    stage_clock.note_start(100.5, env)  # pytest runs under no dvc: no DVC process is noted
    assert stage_clock.take_start(env) == {"started": 100.5, "dvc_pid": None, "dvc_started": None}
    assert stage_clock.STARTED not in env  # seed workers forked after this see no start: they record nothing
    assert stage_clock.take_start(env) is None
    rank1 = {"DVC_STAGE": "train_cls@x", "RANK": "1"}
    stage_clock.note_start(100.5, rank1)
    assert stage_clock.take_start(rank1) is None and stage_clock.STARTED not in rank1  # rank 0 records
    by_hand = {"RANK": "0"}
    stage_clock.note_start(100.5, by_hand)
    assert stage_clock.take_start(by_hand) is None  # run by hand: no DVC_STAGE


def test_the_dvc_process_is_the_nearest_ancestor_named_dvc(tmp_path):
    fake = tmp_path / "dvc"  # a process whose argv names a program called dvc, as `dvc repro` does
    child = (
        "import os; from vcarepro.core.stage_clock import dvc_process; "
        "d = dvc_process(); print(d['pid'], os.getppid(), d['started'])"
    )
    fake.write_text(f"import subprocess, sys\nsys.exit(subprocess.call([sys.executable, '-c', {child!r}]))\n")
    before = time.time()
    out = subprocess.run([sys.executable, str(fake)], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == out[1]  # the parent: the process that ran the program named dvc
    assert before - 2 <= float(out[2]) <= time.time() + 0.1  # its start, read from /proc, is when it started
    assert stage_clock.dvc_process(os.getpid()) is None  # pytest runs under no dvc


def test_the_table_orders_stages_by_wall_time_and_gives_dvc_the_time_between_them(tmp_path):
    rows = [
        {"stage": "train_cls@a", "started": 17.0, "start_up_s": 0.5, "work_s": 19.5, "wall_s": 20.0, "ended": 37.0,
         "status": "ok", "dvc_pid": 7, "dvc_started": 8.0},
        {"stage": "prepare_cls", "started": 10.0, "start_up_s": 1.0, "work_s": 4.0, "wall_s": 5.0, "ended": 15.0,
         "status": "ok", "dvc_pid": 7, "dvc_started": 8.0},
        {"stage": "report", "started": 40.0, "start_up_s": 0.2, "work_s": 0.8, "wall_s": 1.0, "ended": 41.0,
         "status": "ok", "dvc_pid": 7, "dvc_started": 8.0},
    ]  # fmt: skip
    text = stage_clock.table(rows)
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in lines[1:4]] == ["| train_cls@a", "| prepare_cls", "| report"]
    assert "| train_cls@a | 20.0 | 0.5 | 19.5 | ok |" in lines
    assert "| all 3 stages | 26.0 | 1.7 | 24.3 | |" in lines
    assert "| DVC between the stages | 5.0 | | | |" in lines  # 15 -> 17 and 37 -> 40
    assert "| first stage's start to last one's end | 31.0 | | | |" in lines  # 10 -> 41: 26 + 5


def test_a_stage_records_under_dvc_and_the_table_keeps_to_its_own_dvc_run(tmp_path):
    for stage, (pid, began) in (("old", (1, 1.0)), ("a", (7, 8.0)), ("report", (7, 8.0))):
        start = {"started": 10.0, "dvc_pid": pid, "dvc_started": began}
        record = json.loads(stage_clock.record(tmp_path, stage, start, 11.0, 12.5, "ok").read_text())
    assert (record["start_up_s"], record["work_s"], record["wall_s"], record["dvc_pid"]) == (1.0, 1.5, 2.5, 7)
    assert [r["stage"] for r in stage_clock.this_repro(tmp_path, "report")] == ["a", "report"]
    text = stage_clock.write_table(tmp_path, "report")
    assert (tmp_path / "timings" / "stages.md").read_text() == text and "| old |" not in text


def test_a_full_disk_keeps_the_previous_record_and_leaves_no_temporary_file(small_disk):
    from vcarepro.core.errors import DiskFull

    start = {"started": 10.0, "dvc_pid": 7, "dvc_started": 8.0}
    path = stage_clock.record(small_disk.path, "train", start, 11.0, 12.5, "ok")
    before = small_disk.files()
    small_disk.fill()
    with pytest.raises(DiskFull, match=f"while writing {path}"):
        stage_clock.record(small_disk.path, "train", start, 11.0, 99.0, "ok")
    assert small_disk.files() == before and json.loads(path.read_text())["work_s"] == 1.5


def test_a_stage_whose_clock_finds_the_disk_full_keeps_its_own_status(small_disk, monkeypatch, capsys):
    """The wall time is never worth a stage's result: a full disk at the clock is one note line, the stage's exit
    status is its own (here: it succeeded)."""
    from vcarepro.core import stage

    monkeypatch.setenv("DVC_STAGE", "train")
    monkeypatch.setenv("DVC_ROOT", str(small_disk.path))
    monkeypatch.setenv(stage_clock.STARTED, json.dumps({"started": 10.0}))
    monkeypatch.setattr(stage.errors, "run_stage", lambda main, what=None: main())
    small_disk.fill()
    stage.run_stage(lambda: None)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("note: the stage's wall time was not recorded (no space is left")
    assert not small_disk.files()


def test_the_recorded_status_follows_the_stages_exit(tmp_path, monkeypatch):
    from vcarepro.core import stage

    monkeypatch.setenv("DVC_STAGE", "prepare")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    for stop, status in (
        (None, "ok"),
        (0, "ok"),
        (2, "error: exit 2"),
        (130, "interrupted: exit 130"),
        ("no", "exit 1"),
    ):
        monkeypatch.setenv(stage_clock.STARTED, json.dumps({"started": 10.0}))

        def ends(main, what=None, stop=stop):
            raise SystemExit(stop)

        monkeypatch.setattr(stage.errors, "run_stage", ends)
        with pytest.raises(SystemExit):
            stage.run_stage(lambda: None)
        assert json.loads((tmp_path / "timings" / "stages" / "prepare.json").read_text())["status"] == status, stop
