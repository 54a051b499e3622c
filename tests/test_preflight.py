"""python -m vcarepro.preflight: every run of a scale stepped once on this machine, its cost projected from
the recipe, and every problem a run would meet later reported now as one sentence (exit status 2)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vcarepro.config import compose
from vcarepro.errors import USER_ERROR_STATUS
from vcarepro.pipeline import cls_run

ROOT = Path(__file__).resolve().parents[1]
HOURS = ("train CPU-h", "sample CPU-h", "CPU-h")


def preflight(cwd: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """The real CLI in a fresh process, in a directory with no prepared data and no weights (unless a test adds them)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "vcarepro.preflight", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def rows(stdout: str) -> dict:
    """The printed table as {run: {column: cell}}, the total row under 'total'."""
    lines = [line for line in stdout.splitlines() if line.startswith("| ")]
    head = [cell.strip() for cell in lines[0].strip("|").split("|")]
    table = {}
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        table[cells[0]] = dict(zip(head, cells))
    return table


def errors(result) -> list:
    assert "Traceback" not in result.stderr, result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")]


def assert_hours_follow_the_formula(table: dict) -> None:
    runs = {name: row for name, row in table.items() if name != "total"}
    for name, row in runs.items():
        step = float(row["step s"])
        assert step > 0, name
        train = int(row["seeds"]) * int(row["steps"]) * step * int(row["devices"]) / 3600
        assert float(row["train CPU-h"]) == pytest.approx(train, rel=2e-3), name
        assert float(row["CPU-h"]) == pytest.approx(float(row["train CPU-h"]) + float(row["sample CPU-h"]),
                                                    rel=2e-3, abs=1e-6), name
    for column in HOURS:
        assert float(table["total"][column]) == pytest.approx(sum(float(r[column]) for r in runs.values()), rel=2e-3)


def assert_json_matches(table: dict, report: dict) -> None:
    from vcarepro.preflight import fmt

    assert [r["run"] for r in report["runs"]] == [name for name in table if name != "total"]
    for entry in report["runs"]:
        row = table[entry["run"]]
        assert row["step s"] == fmt(entry["step_seconds"])
        assert row["steps"] == str(entry["steps"]) and row["seeds"] == str(entry["seeds"])
        assert row["train CPU-h"] == fmt(entry["train_gpu_hours"])
        assert row["sample CPU-h"] == fmt(entry["sample_gpu_hours"])
        assert row["CPU-h"] == fmt(entry["gpu_hours"])
        assert row["batch run/recipe"].rstrip("*") == f"{entry['batch_run']}/{entry['recipe_batch']}"
        assert row["fits"] == {True: "yes", False: "no"}[entry["fits"]]
    assert table["total"]["CPU-h"] == fmt(report["total"]["gpu_hours"])


# --- the embedded scale: every run, fast ---

@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("embedded")
    result = preflight(cwd, "--scale", "embedded", "--json", "preflight.json", "--loader-seconds", "0.5")
    return result, json.loads((cwd / "preflight.json").read_text())


@pytest.mark.slow
def test_every_run_of_the_embedded_scale_is_stepped_and_costed(embedded):
    result, report = embedded
    assert result.returncode == 0, result.stderr  # the embedded scale needs nothing from outside
    table = rows(result.stdout)
    params = compose(["scale=embedded"])
    assert set(table) - {"total"} == set(params["cls_runs"]) | set(params["gen_runs"])
    assert "These are CPU times" in result.stdout and "CPU projection" in result.stdout
    assert_hours_follow_the_formula(table)
    assert_json_matches(table, report)
    # per-device batch 64 of the recipe, capped to 2 on a CPU by default and marked as scaled
    assert {row["batch run/recipe"] for name, row in table.items() if name != "total"} == {"2/64*"}
    # 15 epochs x floor(1,437 digits / 64); DiT's steps straight from the recipe
    assert table["deit_tiny-vca"]["steps"] == str(15 * (1437 // 64))
    assert table["dit_s2-vca"]["steps"] == str(params["gen_recipe"]["steps"])
    assert float(table["dit_s2-vca"]["sample CPU-h"]) > 0 and float(table["deit_tiny-vca"]["sample CPU-h"]) == 0
    # DDPM's sampler: one pass per step over the whole sampling batch
    sampling = next(r["sampling"] for r in report["runs"] if r["run"] == "dit_s2-vca")
    assert (sampling["passes_per_batch"], sampling["batches"]) == (params["sampling"]["ddpm_steps"], 1)
    assert "no file from outside the repository is needed" in result.stdout
    assert "generated 500 x 375 JPEGs" in result.stdout  # no data/cls in this directory, and it says so


# --- paper runs at batch 1 (the CPU cannot hold a batch of 1024 at 224 px) ---

@pytest.mark.slow
def test_paper_runs_at_batch_one_project_the_recipe_and_report_missing_inputs(tmp_path):
    missing = tmp_path / "no-imagenet"
    result = preflight(tmp_path, "--scale", "paper", "--runs", "deit_tiny-mhsa,dit_s2-mhsa", "--batch", "1",
                       "--devices", "8", "--json", "out.json", "--loader-seconds", "1",
                       f"prepare_cls.imagenet_root={missing}")
    table = rows(result.stdout)
    assert set(table) == {"deit_tiny-mhsa", "dit_s2-mhsa", "total"}
    # DeiT's recipe: 1024 images a step over 8 devices; DiT's 256 over 8
    assert table["deit_tiny-mhsa"]["recipe"] == "deit" and table["deit_tiny-mhsa"]["precision"] == "fp16"
    assert table["deit_tiny-mhsa"]["batch run/recipe"] == "1/128*"
    assert table["dit_s2-mhsa"]["batch run/recipe"] == "1/32*"
    assert table["deit_tiny-mhsa"]["steps"] == str(300 * (1_281_167 // 1024))
    assert table["dit_s2-mhsa"]["steps"] == "400000"
    assert float(table["dit_s2-mhsa"]["sample CPU-h"]) > 0
    assert_hours_follow_the_formula(table)
    assert_json_matches(table, json.loads((tmp_path / "out.json").read_text()))
    # the data is missing, the models were stepped anyway; each missing file is one sentence, exit 2
    assert result.returncode == USER_ERROR_STATUS
    lines = errors(result)
    assert f"error: ImageNet root not found at {missing} (prepare_cls.imagenet_root); " in "\n".join(lines)
    for name in ("SD-VAE", "Inception weights", "ADM reference batch"):
        assert any(line.startswith(f"error: {name} not found at ") and line.endswith(".") for line in lines), name
    assert f"ImageNet root (prepare_cls.imagenet_root = {missing}): MISSING" in result.stdout


# --- a prepared dataset is read, and a split too small for one batch is caught ---

def write_tiny_prepared_set(root: Path, train_images: int) -> None:
    from PIL import Image

    from vcarepro.data.folders import write_manifest

    (root / "train" / "c0").mkdir(parents=True)
    for i in range(4):
        Image.new("RGB", (16, 16), (60 * i, 0, 0)).save(root / "train" / "c0" / f"{i}.png")
    write_manifest(root, [("train", f"train/c0/{i % 4}.png", i % 10) for i in range(train_images)])
    (root / "classes.json").write_text(json.dumps([{"index": i, "wnid": f"c{i}", "name": f"c{i}"}
                                                   for i in range(10)]))


@pytest.mark.slow
def test_a_prepared_split_too_small_for_one_batch_is_one_sentence(tmp_path):
    write_tiny_prepared_set(tmp_path / "data" / "cls", train_images=40)  # the embedded recipe's batch is 64
    result = preflight(tmp_path, "--scale", "embedded", "--runs", "deit_tiny-vca", "--loader-seconds", "0.3")
    assert result.returncode == USER_ERROR_STATUS
    assert errors(result) == ["error: deit_tiny-vca: the training split has 40 images, fewer than one global batch "
                              "of 64, so no step would run; lower batch_size."]
    assert rows(result.stdout)["deit_tiny-vca"]["steps"] == "0"
    assert "data/cls prepared (10 classes, 40 training images)" in result.stdout
    assert "on the prepared data/cls" in result.stdout


def test_an_unknown_run_name_exits_2_with_one_sentence(tmp_path):
    result = preflight(tmp_path, "--scale", "embedded", "--runs", "deit_tiny-vca,no_such_run")
    assert result.returncode == USER_ERROR_STATUS
    assert errors(result) == [line for line in result.stderr.splitlines() if line.strip()]
    (line,) = errors(result)
    assert line.startswith("error: no run 'no_such_run' at scale embedded; choose from deit_tiny-mhsa, ")
    assert "| " not in result.stdout  # nothing was measured


def test_an_unknown_scale_exits_2_naming_the_scales(tmp_path):
    result = preflight(tmp_path, "--scale", "nowhere")
    assert result.returncode == USER_ERROR_STATUS
    from vcarepro.preflight import scales

    assert "embedded" in scales() and "paper" in scales()
    assert errors(result) == [f"error: no scale 'nowhere' under conf/scale/; choose one of {', '.join(scales())}."]


# --- in-process pieces ---

class _FakeStep:
    def __init__(self, batch: int, fits_up_to: int):
        if batch > fits_up_to:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        self.batch = batch

    def __call__(self):
        pass

    def static_bytes(self) -> int:
        return 1000


def test_running_out_of_memory_halves_the_batch_and_records_where_it_failed():
    from vcarepro.preflight import RunCost, _fill_costs, measure_step

    measured = measure_step(lambda b: _FakeStep(b, fits_up_to=3), 16, torch.device("cpu"))
    assert (measured.batch, measured.out_of_memory_at) == (2, 16)  # 16, 8, 4 fail; 2 runs
    assert measured.seconds is not None and measured.seconds >= 0
    cost = RunCost("r", "cls", "m", "deit", "fp32", seeds=1, devices=1, accum_steps=1, global_batch=16,
                   recipe_batch=16, steps=10, device_memory=2 ** 30)
    _fill_costs(cost, measured)
    assert cost.fits is False and cost.out_of_memory_at == 16
    assert cost.problems == ["r: a per-device batch of 16 does not fit the 1.0 GiB of this device (out of memory at "
                             "batch 16); raise the device count (distributed.nproc_per_node, --devices here) or the "
                             "recipe's accum_steps."]
    # a step of 2 scaled to the recipe's 16
    assert cost.step_seconds == pytest.approx(measured.seconds * 8)


def test_anything_but_out_of_memory_is_not_swallowed():
    from vcarepro.preflight import measure_step

    def broken(batch):
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        measure_step(broken, 4, torch.device("cpu"))


def test_a_projected_peak_keeps_the_static_part_and_scales_the_rest():
    from vcarepro.preflight import Measured, RunCost, _fill_costs

    cost = RunCost("r", "gen", "m", "ddpm", "tf32", seeds=3, devices=2, accum_steps=1, global_batch=256,
                   recipe_batch=128, steps=100, device_memory=10 * 2 ** 30)
    _fill_costs(cost, Measured(batch=2, seconds=0.5, peak_bytes=3 * 2 ** 30, static_bytes=2 ** 30))
    assert cost.peak_bytes == 2 ** 30 + 2 * 2 ** 30 * 64 and cost.peak_projected
    assert cost.fits is False and "projected from batch 2" in cost.problems[0]
    assert cost.train_gpu_hours == pytest.approx(3 * 100 * (0.5 * 64) * 2 / 3600)


def test_the_classification_step_counts_steps_from_the_dataset_and_the_recipe():
    from vcarepro.preflight import Dataset, cls_cost

    params = compose(["scale=embedded"])
    run = cls_run(params, "deit_tiny-vca")
    cost = cls_cost(run, dataset=Dataset("cls", True, 6400, "test"), num_classes=10, devices=2, cap=2,
                    device=torch.device("cpu"), repeats=1)
    assert cost.recipe_batch == 32 and cost.batch_run == 2
    assert cost.steps == (run.recipe["epochs"] + run.recipe["cooldown_epochs"]) * 100
    assert cost.peak_bytes_measured is not None and cost.step_seconds > 0 and not cost.problems
    assert math.isclose(cost.train_gpu_hours, 3 * cost.steps * cost.step_seconds * 2 / 3600)
