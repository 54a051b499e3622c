"""The repository keeps its promises: README commands, CI, DVC config."""

from __future__ import annotations

import configparser
import json
import re
import subprocess
import sys

import pytest
import yaml

from helpers import ROOT


def readme_commands():
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_readme_opens_with_exactly_two_commands_and_ci_runs_the_test_one():
    main_job, tests = readme_commands()
    assert main_job.endswith("dvc repro")
    assert tests.endswith('python -m pytest -m "not slow" -n 2')  # the fast tier; .ci/run adds the slow one
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert (ROOT / "README.md").read_text().splitlines()[4] == tests and 'bash -c "$(sed -n 5p README.md)"' in ci_lines


def test_dvc_never_reaches_for_the_network():
    config = configparser.ConfigParser()
    config.read(ROOT / ".dvc" / "config")
    assert config["core"]["analytics"] == "false"
    assert config["core"]["check_update"] == "false"


def test_every_stage_declares_the_param_sections_it_reads():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for name, stage in stages.items():
        for key in stage.get("params", []):
            if isinstance(key, dict):  # `- params.yaml:`, the whole file (check_params)
                assert list(key) == ["params.yaml"] and None in key.values(), f"{name} declares {key}"
                continue
            assert key.split(".")[0] in params, f"{name} declares {key}, absent from params.yaml"


@pytest.mark.slow
def test_complexity_stage_measures_every_model(tmp_path):
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["models"] = {k: v for k, v in params["models"].items() if k.startswith("deit_tiny-")}
    params["cls_runs"] = {k: v for k, v in params["cls_runs"].items() if v["model"] in params["models"]}
    params["gen_runs"] = {}
    params["complexity"]["throughput_batch"] = 1
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    out = tmp_path / "complexity.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "stages" / "complexity.py"),
            "--params",
            str(tmp_path / "params.yaml"),
            "--out",
            str(out),
        ],
        check=True,
        cwd=tmp_path,
    )
    figures = json.loads(out.read_text())
    assert set(figures) == set(params["models"])
    assert figures["deit_tiny-mhsa"]["params_m"] == pytest.approx(5.717, abs=1e-3)
    assert figures["deit_tiny-vca"]["params_m"] - figures["deit_tiny-mhsa"]["params_m"] == pytest.approx(
        0.2565, abs=1e-4
    )
    assert figures["deit_tiny-vca"]["gmacs"] == pytest.approx(1.257, abs=1e-3)
    timing = json.loads((tmp_path / "timings" / "complexity.json").read_text())["throughput_img_s"]
    assert set(timing) == set(figures) and all(v > 0 for v in timing.values())
    assert not any("throughput_img_s" in f for f in figures.values())  # a wall time is in no DVC output
    assert not (tmp_path / "complexity.json.tmp").exists()


def test_what_dvc_repro_removes_before_the_report_runs_is_what_faults_md_says(tmp_path):
    """faults.md: under `dvc repro` a failed report stage leaves its outputs missing (DVC deleted them before the
    command ran), the page and tables beside them whole, and `dvc checkout` restores the outputs byte-identical."""
    report = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["report"]
    declared = [o for kind in ("outs", "metrics", "plots") for o in report.get(kind) or []]  # each is an output
    outs = [next(iter(o)) if isinstance(o, dict) else o for o in declared]
    assert not any(isinstance(o, dict) and next(iter(o.values())).get("persist") for o in declared)
    row = next(
        line for line in (ROOT / "docs" / "faults.md").read_text().splitlines() if "the report, an export" in line
    )
    claim = row.split("Under `dvc repro`", 1)[1].split("|", 1)[0]
    assert sorted(re.findall(r"`((?:reports|metrics)/[^`]+)`", claim)) == sorted(outs) and "`dvc checkout`" in claim
    # DVC itself: an output is gone once its stage fails, a file beside it is not, and checkout restores the output
    write = (
        "import pathlib, sys; pathlib.Path('reports').mkdir(exist_ok=True); "
        "pathlib.Path('reports/index.html').write_text(sys.argv[1]); "
        "sys.exit(3) if pathlib.Path('full').exists() else pathlib.Path('reports/results.json').write_text(sys.argv[1])"
    )
    dvc = [sys.executable, "-m", "dvc"]
    for argv in (["git", "init", "-q"], [*dvc, "init", "-q"]):
        subprocess.run(argv, cwd=tmp_path, check=True, timeout=120)
    (tmp_path / "write.py").write_text(write)
    subprocess.run([*dvc, "stage", "add", "-q", "-n", "report", "-o", "reports/results.json",
                    f"{sys.executable} write.py first"], cwd=tmp_path, check=True, timeout=120)  # fmt: skip
    subprocess.run([*dvc, "repro", "-q"], cwd=tmp_path, check=True, timeout=120)
    (tmp_path / "write.py").write_text(write.replace("sys.argv[1]", "'second'", 1))  # the page is rendered anew
    (tmp_path / "full").touch()  # and then the disk is full
    failed = subprocess.run([*dvc, "repro", "-q", "-f"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert failed.returncode != 0
    assert not (tmp_path / "reports" / "results.json").exists()
    assert (tmp_path / "reports" / "index.html").read_text() == "second"
    subprocess.run([*dvc, "checkout", "-q"], cwd=tmp_path, check=True, timeout=120)
    assert (tmp_path / "reports" / "results.json").read_text() == "first"
