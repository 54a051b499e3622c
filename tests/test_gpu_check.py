"""Issue 42: the GPU acceptance check (`vcarepro gpu-check`), on this CPU at tiny sizes.

One run of the whole check (every part, `--profile` too) is shared by most tests: a subprocess whose imports of DVC
and dvclive are refused and logged (the device machine has neither), as its torchrun child's are. What each part
must cover is derived here from conf/ (the composed params) and the package's own lists, not from the check's.
The runner's behaviour around a failing, late or hung part is tested in this process on small parts.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from helpers import ROOT
from vcarepro.core.choices import BENCH_LAYERS
from vcarepro.core.recipes import GenRecipe
from vcarepro.params.config import compose
from vcarepro.tools.gpu_check import cli, parts, steps
from vcarepro.tools.gpu_check.report import CPU_NOTE

TINY_TOKENS = {16, 36, 64}  # the tiny sides 4, 6 and 8
BLOCKER = """
import importlib.abc, os, sys

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("dvc", "dvclive"):
            with open(os.environ["GPU_CHECK_REFUSED"], "a") as log:
                log.write(name + "\\n")
            raise ImportError(f"{name}: the device machine has no DVC")
        return None

sys.meta_path.insert(0, Refuse())
"""


def env_with(*paths: Path, **extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, paths), str(ROOT / "src")]), **extra}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The whole check at tiny sizes, DVC and dvclive refused: (the process, its JSON, its Markdown, out, log)."""
    base = tmp_path_factory.mktemp("gpu-check")
    (base / "blocker").mkdir()
    (base / "blocker" / "sitecustomize.py").write_text(BLOCKER)
    refused = base / "refused.log"
    out = base / "out"
    process = subprocess.run(
        [sys.executable, "-m", "vcarepro.tools.gpu_check", "--tiny", "--no-compile", "--profile", "--out", str(out)],
        cwd=base,
        env=env_with(base / "blocker", GPU_CHECK_REFUSED=str(refused)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    result = json.loads((out / cli.JSON_FILE).read_text()) if (out / cli.JSON_FILE).is_file() else None
    markdown = (out / cli.MARKDOWN_FILE).read_text() if (out / cli.MARKDOWN_FILE).is_file() else ""
    return process, result, markdown, out, refused


def part(result, name):
    found = [p for p in result["parts"] if p["part"] == name]
    assert len(found) == 1, [p["part"] for p in result["parts"]]
    return found[0]


def positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.slow
def test_every_part_runs_at_tiny_sizes_passes_and_says_so(tiny):
    process, result, markdown, _, _ = tiny
    assert process.returncode == 0, process.stderr[-3000:]
    assert [p["part"] for p in result["parts"]] == list(cli.PART_NAMES)
    for p in result["parts"]:
        assert p["status"] == "pass", (p["part"], p["reason"])
        assert p["reason"] and "\n" not in p["reason"]
        assert p["rows"], p["part"]
        assert all(r["status"] == "pass" and r["reason"] for r in p["rows"]), p["part"]
    assert result["tiny"] is True and result["note"] == CPU_NOTE and result["passed"] is True
    assert result["device"]["type"] == "cpu"
    assert {"torch", "timm", "cuda", "triton", "python"} <= set(result["versions"])
    assert CPU_NOTE in markdown and result["device"]["name"] in markdown.splitlines()[0]


@pytest.mark.slow
def test_the_check_imports_neither_dvc_nor_dvclive(tiny):
    process, result, _, _, refused = tiny
    assert process.returncode == 0, process.stderr[-3000:]
    assert not refused.exists(), refused.read_text()  # nothing even tried (the torchrun child included)


@pytest.mark.slow
def test_the_steps_are_the_smoke_scales_distinct_runs_each_in_its_recipes_precision(tiny):
    _, result, _, _, _ = tiny
    smoke, paper = compose(["scale=smoke"]), compose(["scale=paper"])
    expected = {}
    for branch in ("cls", "gen"):
        for entry in smoke[f"{branch}_runs"].values():
            model = paper["models"][entry["model"]]
            if branch == "cls":
                key = (model["arch"], model["attention"], entry["recipe"])
                expected[key] = paper["cls_recipes"][entry["recipe"]]["precision"]
            else:
                expected[(model["arch"], model["attention"], entry["objective"])] = paper["gen_recipe"]["precision"]
    rows = [r for r in part(result, "steps")["rows"] if not r.get("probe")]
    got = [(r["arch"], r["attention"], r["recipe"] or r["objective"]) for r in rows]
    assert len(got) == len(set(got)) and set(got) == set(expected)
    activations = {"fp16": "float16", "bf16": "bfloat16", "tf32": "float32", "fp32": "float32"}
    for key, row in zip(got, rows):
        assert row["precision"] == expected[key], row["id"]
        assert row["autocast_dtype"] == activations[row["precision"]], row["id"]
        assert row["grad_scaler"] is (row["precision"] == "fp16"), row["id"]
        assert positive(row["step_ms"]) and row["finite"] is True, row["id"]
    assert {"fp16", "tf32"} <= {r["precision"] for r in rows}  # the precisions the paper's recipes use
    assert part(result, "steps")["data"]["compile_probe"] == "skipped: --no-compile"


@pytest.mark.slow
def test_the_loader_part_times_the_fast_paths_device_side_and_a_step_it_feeds(tiny):
    """The lab DeiT-T recipe's fast path on the device: its device side at the per-device batch (tiny: 4 crops at the
    tiny model's 32 px), the same training step fed by it and on a ready batch, and the cores it would take here."""
    _, result, _, _, _ = tiny
    device, fed = part(result, "loader")["rows"]
    assert device["id"] == "device side" and (device["batch"], device["img_size"]) == (4, 32)
    assert positive(device["ms_per_image"]) and device["ms"] == pytest.approx(device["ms_per_image"] * 4)
    assert fed["id"] == "deit_tiny-vca step fed by it" and fed["precision"] == "tf32"
    assert positive(fed["fed_step_ms"]) and positive(fed["plain_step_ms"]) and positive(fed["cpu_core_images_per_s"])
    assert fed["cores_needed"] == pytest.approx(fed["images_per_s"] / fed["cpu_core_images_per_s"])


@pytest.mark.slow
def test_the_cost_rows_are_the_proxy_runs_at_both_scales_at_their_recipes_batch_and_precision(tiny):
    _, result, _, _, _ = tiny
    proxy, paper = compose(["scale=proxy"]), compose(["scale=paper"])
    names = [*proxy["cls_runs"], *proxy["gen_runs"]]
    rows = {r["id"]: r for r in part(result, "cost")["rows"]}
    assert set(rows) == {f"{scale} {name}" for scale in ("proxy", "paper") for name in names}
    for scale, params, devices in (("proxy", proxy, 1), ("paper", paper, 8)):
        for name in names:
            row = rows[f"{scale} {name}"]
            if name in params["cls_runs"]:
                recipe = {**params["cls_recipes"][params["cls_runs"][name]["recipe"]]}
                recipe.update({k: v for k, v in params["cls_recipe_overrides"].items() if v is not None})
            else:
                recipe = params["gen_recipe"]
            assert row["precision"] == recipe["precision"], row["id"]
            assert row["devices"] == devices
            assert row["recipe_batch"] == recipe["batch_size"] // (devices * recipe.get("accum_steps", 1)), row["id"]
            assert row["batch"] == steps.TINY_BATCH  # capped at tiny sizes only
            assert positive(row["step_ms"]) and all(positive(t) for t in row["step_ms_each"]), row["id"]
            assert row["peak_gib"] is not None and row["peak_gib"] >= 0
    assert {r["precision"] for r in rows.values() if r["scale"] == "proxy"} == {"bf16"}
    ratios = part(result, "cost")["data"]["vca_over_mhsa_step_time"]
    assert set(ratios) == {f"{s} {b}" for s in ("proxy", "paper") for b in ("deit_tiny", "dit_s2")}
    assert all(positive(v) for v in ratios.values())


@pytest.mark.slow
def test_every_family_member_at_every_n_forward_and_backward_against_timms_fused_mhsa(tiny):
    _, result, _, _, _ = tiny
    rows = part(result, "attention")["rows"]
    assert sorted((r["layer"], r["tokens"]) for r in rows) == sorted(
        (layer, n) for layer in BENCH_LAYERS for n in TINY_TOKENS
    )
    for row in rows:
        assert positive(row["forward_ms"]) and positive(row["forward_backward_ms"]), row["id"]
        assert positive(row["forward_backward_x_mhsa"]), row["id"]
    baselines = [r for r in rows if r["baseline"]]
    assert {r["tokens"] for r in baselines} == TINY_TOKENS and {r["layer"] for r in baselines} == {"mhsa"}
    assert all(r["kernel"] == "flash" and r["forward_x_mhsa"] == 1.0 for r in baselines)
    assert all(r["output_dtype"] == "bfloat16" for r in baselines)  # the layer ran under bf16 autocast
    assert part(result, "attention")["data"]["dtype"] == "bf16 autocast"


@pytest.mark.slow
def test_ddp_steps_through_torchrun_with_the_backend_training_picks(tiny):
    _, result, _, _, _ = tiny
    (row,) = part(result, "ddp")["rows"]
    assert row["command"].startswith("torchrun --nnodes=1 --nproc-per-node=1 ")
    assert row["backend"] == "gloo" and row["world_size"] == 1 and row["all_reduce"] == 1.0
    assert row["torchelastic"] is True and row["ddp_wrapped"] is True and math.isfinite(row["loss"])


@pytest.mark.slow
def test_the_vae_stand_in_round_trips_and_fid_comes_from_the_evaluator(tiny):
    _, result, _, _, _ = tiny
    (row,) = part(result, "fid")["rows"]
    side = row["image_size"]
    assert row["latent_shape"] == [4, side // 8, side // 8] and row["decoded_shape"] == [3, side, side]
    assert row["vae_device"] == "cpu" and row["inception_device"] == "cpu"
    assert math.isfinite(row["fid"]) and row["fid"] >= 0 and row["fid_feature_dims"] < row["images"]


@pytest.mark.slow
def test_the_profile_names_the_slowest_ops_of_vca_and_mhsa_and_writes_torchs_table(tiny):
    _, result, _, out, _ = tiny
    profile = part(result, "profile")
    assert {r["layer"] for r in profile["rows"]} == {"vca", "mhsa"}
    assert all(0 < r["share"] <= 1 for r in profile["rows"])
    text = (out / profile["data"]["file"]).read_text()
    assert "== vca " in text and "== mhsa " in text and "N=64" in text


def markdown_sections(markdown: str) -> dict:
    """part -> the first cells of its table's rows."""
    sections, current = {}, None
    for line in markdown.splitlines():
        heading = re.match(r"^## (\w+): ", line)
        if heading:
            current = sections.setdefault(heading.group(1), [])
        elif current is not None and line.startswith("| ") and not line.startswith("| id |"):
            current.append(line.split(" | ")[0][2:])
    return sections


@pytest.mark.slow
def test_the_markdown_lists_the_same_rows_as_the_json(tiny):
    _, result, markdown, _, _ = tiny
    sections = markdown_sections(markdown)
    assert set(sections) == {p["part"] for p in result["parts"]}
    for p in result["parts"]:
        assert sections[p["part"]] == [r["id"] for r in p["rows"]], p["part"]
    summary = markdown.split("## Parts")[1].split("\n## ")[0]
    listed = [line.split(" | ")[0][2:] for line in summary.splitlines() if line.startswith("| ")]
    assert listed[1:] == list(cli.PART_NAMES)  # under its header


# -- the runner: a failing, a late and a hung part ----------------------------------------------------------------


def run_in_process(monkeypatch, tmp_path, replaced: dict, argv) -> tuple:
    if not cli.PARTS:
        cli.PARTS.update(cli._parts())
    for name, fn in replaced.items():
        monkeypatch.setitem(cli.PARTS, name, parts.Part(name, f"{name} (test)", cli.PARTS[name].share, fn))
    status = cli.main(["--out", str(tmp_path), *argv])
    return status, json.loads((tmp_path / cli.JSON_FILE).read_text())


def test_a_part_that_raises_fails_in_one_line_and_the_others_still_run(monkeypatch, tmp_path):
    def boom(check, outcome):
        raise RuntimeError("boom\nsecond line")

    status, result = run_in_process(monkeypatch, tmp_path, {"fid": boom}, ["--parts", "fid,profile", "--tiny"])
    assert status == 1 and result["passed"] is False
    assert part(result, "fid")["status"] == "fail" and part(result, "fid")["reason"] == "RuntimeError: boom"
    assert part(result, "profile")["status"] == "pass" and part(result, "profile")["rows"]  # ran after it, for real
    assert "| fid | fail |" in (tmp_path / cli.MARKDOWN_FILE).read_text()


def test_a_missing_package_is_named_with_where_to_get_it(monkeypatch, tmp_path):
    def missing(check, outcome):  # what `import diffusers` raises where it is not installed
        raise ModuleNotFoundError("No module named 'diffusers'", name="diffusers")

    status, result = run_in_process(monkeypatch, tmp_path, {"fid": missing}, ["--parts", "fid", "--tiny"])
    assert status == 1
    reason = part(result, "fid")["reason"]
    assert reason.startswith("diffusers is not installed here; carry its wheel") and "GPU check" in reason


def test_a_part_out_of_its_share_is_reported_as_such(monkeypatch, tmp_path):
    status, result = run_in_process(monkeypatch, tmp_path, {}, ["--parts", "attention", "--tiny", "--budget-s", "1e-6"])
    attention = part(result, "attention")
    assert status == 1 and attention["status"] == "timeout"
    assert re.match(r"ran out of its \d+ s share after 0 of \d+ layer measurements", attention["reason"])


def test_a_hung_part_is_abandoned_and_the_next_still_runs(monkeypatch, tmp_path):
    release = threading.Event()

    def hang(check, outcome):
        outcome.rows.append({"id": "before the hang", "status": "pass", "reason": "-"})
        release.wait(60)

    def quick(check, outcome):
        outcome.rows.append({"id": "after", "status": "pass", "reason": "ran"})

    try:
        status, result = run_in_process(
            monkeypatch, tmp_path, {"steps": hang, "fid": quick}, ["--parts", "steps,fid", "--tiny", "--budget-s", "1"]
        )
    finally:
        release.set()
    hung = part(result, "steps")
    assert status == 1 and hung["status"] == "timeout" and "abandoned" in hung["reason"]
    assert [r["id"] for r in hung["rows"]] == ["before the hang"]
    assert part(result, "fid")["status"] == "pass"


# -- the pieces ------------------------------------------------------------------------------------------------------


def test_a_recipe_that_asks_for_compile_is_compiled_unless_switched_off(monkeypatch):
    assert steps.compile_backend(GenRecipe(compile=None), True)[0] is None
    assert steps.compile_backend(GenRecipe(compile="none"), True)[0] is None
    assert steps.compile_backend(GenRecipe(compile="inductor"), True)[0] == "inductor"
    backend, note = steps.compile_backend(GenRecipe(compile="inductor"), False)
    assert backend is None and "--no-compile" in note

    import torch

    from vcarepro.params.runs import cls_run
    from vcarepro.tools.bench import train_step

    asked = []
    monkeypatch.setattr(train_step, "maybe_compile", lambda module, backend: asked.append(backend) or module)
    run = cls_run(compose(["scale=paper"]), "deit_tiny-vca")
    check = parts.Check(torch.device("cpu"), True)
    row = steps.step_row("cls", run, check, batch=2, repeats=1, backend="inductor", note="asked")
    assert asked == ["inductor"] and row["compile"] == "inductor" and row["status"] == "pass"


def test_a_step_whose_activations_or_scaler_contradict_its_precision_fails():
    ok = {"autocast_dtype": "float16", "grad_scaler": True}
    assert steps.precision_problems("fp16", ok, "cpu") == []
    assert steps.precision_problems("fp16", {**ok, "autocast_dtype": "float32"}, "cpu")
    assert steps.precision_problems("fp16", {**ok, "grad_scaler": False}, "cpu")
    assert steps.precision_problems("tf32", {"autocast_dtype": "float32", "grad_scaler": False}, "cpu") == []
    tf32_off = {"autocast_dtype": "float32", "grad_scaler": False, "tf32_matmul": False}
    assert steps.precision_problems("tf32", tf32_off, "cuda")


def test_a_bad_out_is_one_error_sentence_with_status_2(tmp_path):
    afile = tmp_path / "a-file"
    afile.write_text("")
    for command in (
        [sys.executable, "-m", "vcarepro.tools.gpu_check", "--out", str(afile)],
        [sys.executable, "-c", "import sys; from vcarepro.tools.cli import main; sys.exit(main())", "gpu-check"]
        + ["--out", str(afile)],
    ):
        done = subprocess.run(command, env=env_with(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines() == [
            f"error: --out {afile} is a file, not a folder; give a folder to write the check's results into."
        ]
