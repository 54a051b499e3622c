"""A number is shown as current only where the params that claim it produced it (issue 21, problem 7).

Each evaluation stage writes runs/<branch>/<run>/provenance.json beside metrics.json; the report
rebuilds that record from the current params, and a run whose record differs (or is missing) is
stale: every table, figure and export says which stage to re-run instead of showing its numbers or
computing anything from them.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from markupsafe import escape

from helpers import micro_params, project, reproduced_repo, sh, vouch  # noqa: F401  (project: fixtures)
from vcarepro.params.config import compose
from vcarepro.params.provenance import PROVENANCE_FILE, check, run_provenance, write_provenance
from vcarepro.report.changes import metrics_changes
from vcarepro.report.render import render_report

MHSA_STALE = "stale: re-run dvc repro eval_cls@deit_tiny-mhsa"
TOP1 = 47.31  # the baseline's number on disk: "47.3" in Table 1, "47.31" in the runs table


def params_of(project: Path) -> dict:
    return yaml.safe_load((project / "params.yaml").read_text())


def write_baseline(project: Path, produced_by=None) -> Path:
    """deit_tiny-mhsa's metrics.json, with a record from ``produced_by`` (params; None: no record)."""
    run = project / "runs" / "cls" / "deit_tiny-mhsa"
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.json").write_text(
        json.dumps({"top1": TOP1, "top1_std": 0.0, "top1_seed0": TOP1, "n_seeds": 1, "top5": 91.17, "loss": 1.23})
    )
    logs = run / "live" / "plots" / "metrics" / "seed_0" / "train"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "loss.tsv").write_text("timestamp\tstep\tloss\n0\t1\t2.0\n0\t2\t1.5\n")
    if produced_by is not None:
        write_provenance(produced_by, "cls", "deit_tiny-mhsa", run)
    return run


def row_of(html: str, start: str) -> str:
    part = html[html.index(start) :]
    return part[: part.index("</tr>")]


def exported(project: Path) -> dict:
    return {path.name: path.read_text() for path in sorted((project / "reports" / "tables").iterdir())}


def other_recipe(params):
    params["cls_runs"]["deit_tiny-mhsa"]["recipe"] = "lab_deit_tiny"
    return params


def other_seeds(params):
    params["cls_runs"]["deit_tiny-mhsa"]["seeds"] = [0]
    return params


def other_recipe_value(params):
    params["cls_recipe_overrides"]["lr"] = params["cls_recipe_overrides"]["lr"] * 2
    return params


# (how the params that produced the number differ from the current ones, a field the report names)
PRODUCERS = {
    "recipe name": (other_recipe, 'recipe_name: recorded "lab_deit_tiny", params now "deit"'),
    "seeds": (other_seeds, "seeds: recorded [0], params now [0, 1, 2]"),
    "recipe value": (other_recipe_value, "recipe.lr: recorded"),
    "scale": (lambda p: compose(["scale=proxy"]), 'scale: recorded "proxy", params now "embedded"'),
}


@pytest.mark.parametrize("producer", PRODUCERS)
def test_a_number_other_params_produced_is_stale_in_every_table_figure_and_export(project, producer):
    change, field = PRODUCERS[producer]
    write_baseline(project, produced_by=change(copy.deepcopy(params_of(project))))
    html = render_report(project, project / "reports" / "index.html").read_text()
    tables = exported(project)
    # the number is nowhere: not in a cell, not in a difference with VCA (88.25 - 47.31), not in an export
    for text in [html, *tables.values()]:
        assert "47.3" not in text and "40.94" not in text and "91.17" not in text
    assert MHSA_STALE in row_of(html, '<td>DeiT-T<div class="note">MHSA</div></td><td>baseline (original recipe)')
    assert any(str(escape(field)) in tip for tip in re.findall(r'title="([^"]*)"', html))  # the tooltip: what differs
    gain = row_of(html[html.index("What VCA brings") :], "<td>DeiT-T<")
    assert MHSA_STALE in gain and "direction" not in gain
    assert MHSA_STALE in row_of(
        html[html.index('<h2 id="runs">') :], "<tr><td><code>deit_tiny-mhsa</code>"
    )  # the runs table
    curves = html.split("<h2>Training curves")[1].split("<h2>")[0]
    assert 'alt="curves of deit_tiny-mhsa"' not in curves and MHSA_STALE in curves  # its curves are not drawn
    assert MHSA_STALE in row_of(html[html.index("<h3>Our runs") :], "<tr><td>MHSA (baseline)")  # the family table
    # the exports carry the same text where the number would be
    for name in ("table1.csv", "table1.md", "gains.csv", "decomposition.csv", "cls_runs.csv", "family.csv"):
        assert MHSA_STALE in tables[name], name
    table1 = next(line for line in tables["table1.csv"].splitlines() if ",deit_tiny-mhsa," in line)
    assert MHSA_STALE in table1
    assert field in tables["stale.md"] and "eval_cls@deit_tiny-mhsa" in tables["stale.csv"]
    # the run whose record matches keeps its number (deit_tiny-vca, the fixture's)
    assert "88.2 ± 1.5 (n=2)" in row_of(html, '<td>DeiT-T<div class="note">VCA</div></td>')  # final epoch
    assert "stale: re-run dvc repro eval_cls@deit_tiny-vca" not in html


def test_a_number_the_current_params_produced_is_shown(project):
    write_baseline(project, produced_by=params_of(project))
    html = render_report(project, project / "reports" / "index.html").read_text()
    assert "47.3" in row_of(html, '<td>DeiT-T<div class="note">MHSA</div></td><td>baseline (original recipe)')
    assert "47.31" in row_of(html[html.index('<h2 id="runs">') :], "<tr><td><code>deit_tiny-mhsa</code>")
    assert "+40.94" in row_of(html[html.index("What VCA brings") :], "<td>DeiT-T<")  # 88.25 - 47.31
    assert "stale: re-run" not in html and "Stale results" not in html
    assert 'alt="curves of deit_tiny-mhsa"' in html
    assert "stale.csv" not in exported(project)


def test_a_run_without_a_provenance_record_is_stale(project):
    write_baseline(project, produced_by=None)  # a metrics.json from before stages recorded provenance
    html = render_report(project, project / "reports" / "index.html").read_text()
    assert "47.3" not in html
    assert MHSA_STALE in row_of(html, '<td>DeiT-T<div class="note">MHSA</div></td><td>baseline (original recipe)')
    assert f"no {PROVENANCE_FILE} beside metrics.json" in exported(project)["stale.md"]


def test_a_metrics_file_the_record_was_not_written_for_is_stale(project):
    run = write_baseline(project, produced_by=params_of(project))
    (run / "metrics.json").write_text(json.dumps({"top1": 12.5, "n_seeds": 1}))  # copied in after the record
    stale = check(run, params_of(project), "cls", "deit_tiny-mhsa")
    assert stale is not None and stale.fields == ("metrics.json is not the file the record was written for",)
    html = render_report(project, project / "reports" / "index.html").read_text()
    assert "12.5" not in html and MHSA_STALE in html


def test_a_generation_run_from_other_sampling_is_stale_with_its_samples_and_protocol(project):
    run = project / "runs" / "gen" / "dit_s2-vca"
    (run / "samples").mkdir(parents=True)
    from PIL import Image

    Image.new("L", (17, 17), 128).save(run / "samples" / "grid_seed_0.png")
    (run / "metrics.json").write_text(
        json.dumps(
            {
                "fid": 137.59,
                "fid_std": 0.0,
                "n_seeds": 1,
                "sampler": "ddpm",
                "sampler_steps": 25,
                "cfg_scale": 1.0,
                "labels": "random",
                "decoder": "none (pixels)",
                "reference": "own",
                "train_precision": "fp32",
                "num_samples": 200,
            }
        )
    )
    produced_by = params_of(project)
    produced_by["sampling"]["num_samples"] = 50
    write_provenance(produced_by, "gen", "dit_s2-vca", run)
    html = render_report(project, project / "reports" / "index.html").read_text()
    stale = "stale: re-run dvc repro eval_gen@dit_s2-vca"
    assert "137.5" not in html and "137.6" not in html
    table2 = row_of(html[html.index("<h2>Table 2") :], '<td>DiT-S/2<div class="note">VCA</div></td>')
    assert stale in table2 and "ddpm 25 steps" not in table2  # nor the protocol it claims
    assert 'alt="samples of dit_s2-vca' not in html and stale in html.split("<h2>Samples")[1]
    assert "sampling.num_samples: recorded 50, params now 200" in html
    tables = exported(project)
    assert stale in tables["table2.csv"] and stale in tables["gen_runs.md"] and "137.6" not in tables["table2.csv"]


def test_changes_since_the_last_commit_say_stale_instead_of_a_current_value():
    rows = metrics_changes({}, {"deit_tiny-mhsa": {"top1": 60.0}}, stale={"deit_tiny-mhsa": MHSA_STALE})
    assert rows == [{"run": "deit_tiny-mhsa", "metric": "top1", "previous": "60", "now": MHSA_STALE, "change": ""}]


def test_the_record_holds_what_defines_a_run_and_survives_json():
    params = compose([])
    record = run_provenance(params, "cls", "deit_tiny-vca")
    assert (record["scale"], record["run"], record["model_name"], record["recipe_name"], record["seeds"]) == (
        "embedded",
        "deit_tiny-vca",
        "deit_tiny-vca",
        "lab_deit_tiny",
        [0, 1, 2],
    )
    assert record["recipe"]["epochs"] == params["cls_recipe_overrides"]["epochs"]  # the effective recipe
    # the path that fed its training images: the digits are not augmented, so the PIL path whatever input_path says
    assert record["recipe"]["input_path"] == "fast" and record["input_path"] == "pil"
    augmented = run_provenance(compose(["scale=paper"]), "cls", "deit_tiny-vca")
    assert (
        augmented["input_path"]
        == "fast"
        != run_provenance(compose(["scale=paper", "cls_recipe_overrides.input_path=pil"]), "cls", "deit_tiny-vca")[
            "input_path"
        ]
    )
    assert record["shape"] == params["cls_shape"] and record["model"] == params["models"]["deit_tiny-vca"]
    gen = run_provenance(params, "gen", "dit_s2-vca")
    assert gen["sampling"] == params["sampling"] and gen["recipe"]["steps"] == params["gen_recipe"]["steps"]
    assert json.loads(json.dumps(record)) == record


@pytest.mark.slow
def test_eval_cls_records_what_produced_its_numbers_and_the_report_marks_them_stale_when_params_change(tmp_path):
    params = micro_params(cls_runs=["deit_tiny-mhsa"])
    repo = reproduced_repo(tmp_path / "repo", params, targets="eval_cls@deit_tiny-mhsa complexity")
    run = repo / "runs" / "cls" / "deit_tiny-mhsa"
    record = json.loads((run / PROVENANCE_FILE).read_text())
    assert {k: v for k, v in record.items() if k != "metrics_sha256"} == run_provenance(params, "cls", "deit_tiny-mhsa")
    top1 = json.loads((run / "metrics.json").read_text())["top1"]
    table1_row = '<td>DeiT-T<div class="note">MHSA</div></td><td>baseline (original recipe)'

    sh("python stages/report.py", repo)
    html = (repo / "reports" / "index.html").read_text()
    assert f"{top1:.1f}" in row_of(html, table1_row) and MHSA_STALE not in html

    # the bug's case: params of another recipe and other seeds, the report alone re-rendered
    params["cls_runs"]["deit_tiny-mhsa"].update(recipe="lab_deit_tiny", seeds=[0, 1, 2])
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh("python stages/report.py", repo)
    html = (repo / "reports" / "index.html").read_text()
    row = row_of(html, table1_row)
    assert MHSA_STALE in row and f"{top1:.1f}" not in row
    assert "recipe_name: recorded &#34;deit&#34;, params now &#34;lab_deit_tiny&#34;" in html
    assert "seeds: recorded [0], params now [0, 1, 2]" in html
    tables = exported(repo)
    runs_row = next(line for line in tables["cls_runs.csv"].splitlines() if line.startswith("deit_tiny-mhsa,"))
    assert MHSA_STALE in runs_row and f"{top1:.2f}" not in runs_row
    assert MHSA_STALE in next(line for line in tables["table1.csv"].splitlines() if ",deit_tiny-mhsa," in line)
