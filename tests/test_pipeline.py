"""The real `dvc repro`, end to end, on a micro configuration in a temporary git repository."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import dvc.api
import pytest
import yaml

from helpers import CLS_RUNS, GEN_RUNS, ROOT, micro_params, reproduced_repo, sh, stage_names

LR = "cls_recipe_overrides.lr"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = reproduced_repo(tmp_path_factory.mktemp("pipeline") / "repo", micro_params())
    # every output lies under a path the project's .gitignore files name already: DVC adds no .gitignore
    assert sh("git status --porcelain", repo).stdout == "?? dvc.lock\n"
    sh("git add -A && git -c user.name=t -c user.email=t@t commit -qm results", repo)
    return repo


@pytest.mark.slow
@pytest.mark.alone
def test_every_stage_runs_and_writes_finite_metrics(repo):
    params = yaml.safe_load((repo / "params.yaml").read_text())
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    assert set(lock["stages"]) == stage_names(params)
    for branch, runs, key in (("cls", CLS_RUNS, "top1"), ("gen", GEN_RUNS, "fid")):
        for run in runs:
            metrics = json.loads((repo / "runs" / branch / run / "metrics.json").read_text())
            numbers = [v for v in metrics.values() if not isinstance(v, str)]
            assert key in metrics and all(math.isfinite(v) for v in numbers), (run, metrics)
            if branch == "gen":  # how the samples were made travels with the numbers
                assert (metrics["num_samples"], metrics["sampler_steps"], metrics["weights"]) == (70, 3, "ema")
                assert (metrics["labels"], metrics["reference"], metrics["decoder"], metrics["train_precision"]) == (
                    "random",
                    "own",
                    "none (pixels)",
                    "fp32",
                )
                assert metrics["sampler"] == ("ddpm" if run.startswith("dit") else "flow-sde")
                # eval_gen copied the protocol sample_gen recorded beside the samples
                sampled = json.loads((repo / "runs" / branch / run / "samples" / "protocol.json").read_text())
                assert {k: metrics[k] for k in sampled} == sampled
                assert {"kid_mean", "inception_score", "precision", "recall"} <= set(metrics)
    shown = json.loads(sh("dvc metrics show --json", repo).stdout)
    assert any("top1" in json.dumps(v) for v in shown.values())
    # the wall times are there, outside every output: no hash holds one
    assert json.loads((repo / "timings" / "cls" / "deit_tiny-vca.json").read_text())["train_seconds"]["seed_0"] > 0
    assert "train_seconds" not in (repo / "runs" / "cls" / "deit_tiny-vca" / "live" / "metrics.json").read_text()
    assert json.loads((repo / "timings" / "attention_cost.json").read_text())["rows"][0]["forward_ms"] > 0
    assert "forward_ms" not in (repo / "metrics" / "attention_macs.json").read_text()


def cache_objects(repo: Path) -> dict:
    """DVC's cache objects: path -> whether its bytes still hash to its name (an object is named by its MD5)."""
    objects = {}
    for path in (repo / ".dvc" / "cache" / "files" / "md5").glob("*/*"):
        name = path.parent.name + path.name.removesuffix(".dir")
        objects[path] = hashlib.md5(path.read_bytes()).hexdigest() == name
    return objects


@pytest.mark.slow
@pytest.mark.alone
def test_every_output_is_stored_once_and_no_stage_wrote_into_one(repo):
    """The repository's cache type links each output to its cache object (nothing stored twice on a filesystem
    without reflinks), so a stage writing into an existing output in place, its deps included, would change the
    cache's only copy: after the whole pipeline every object still hashes to its name."""
    objects = cache_objects(repo)
    assert objects and all(objects.values()), sorted(str(p) for p, intact in objects.items() if not intact)
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    outputs = [repo / out["path"] for stage in lock["stages"].values() for out in stage.get("outs", [])]
    files = [f for out in outputs for f in ([out] if out.is_file() else out.rglob("*")) if f.is_file()]
    cached = {(p.stat().st_dev, p.stat().st_ino) for p in objects}
    assert files and all((f.stat().st_dev, f.stat().st_ino) in cached for f in files), [
        str(f) for f in files if (f.stat().st_dev, f.stat().st_ino) not in cached
    ]


@pytest.mark.slow
@pytest.mark.alone
def test_every_stage_is_timed_and_the_report_ends_the_run_with_the_table(repo):
    """timings/stages/ has one record per stage that ran; the report, last, prints the table of that run."""
    stages = stage_names(yaml.safe_load((repo / "params.yaml").read_text()))
    records = {p.stem: json.loads(p.read_text()) for p in (repo / "timings" / "stages").glob("*.json")}
    assert set(records) == stages
    dvc_runs = {(r["dvc_pid"], r["dvc_started"]) for r in records.values()}
    assert len(dvc_runs) == 1 and None not in next(iter(dvc_runs))  # one `dvc repro`, found among the ancestors
    for name, r in records.items():
        assert r["stage"] == name and r["status"] == "ok", r
        assert r["start_up_s"] >= 0 and r["work_s"] >= 0 and abs(r["wall_s"] - r["start_up_s"] - r["work_s"]) < 0.01
        assert r["dvc_started"] <= r["started"] <= r["ended"] - r["wall_s"] + 0.01
    printed = (repo.parent / "repro.out").read_text()
    table = (repo / "timings" / "stages.md").read_text()
    assert f"{table}(also in timings/stages.md)" in printed
    assert printed.index(table) > printed.rindex("Running stage")  # after the last stage's own lines
    rows = {line.split(" | ")[0][2:]: line for line in table.splitlines() if line.startswith("| ")}
    assert stages <= set(rows)  # every stage, the report included (its record is written before the table)
    between = float(rows["DVC between the stages"].split(" | ")[1])
    span = float(rows["first stage's start to last one's end"].split(" | ")[1])
    total = float(rows[f"all {len(stages)} stages"].split(" | ")[1])
    assert between > 0 and abs(span - total - between) < 0.2  # one stage after another, DVC's time between
    assert abs(total - sum(r["wall_s"] for r in records.values())) < 0.1 * len(stages)
    assert sh("git status --porcelain", repo).stdout == ""  # timings/ is ignored, like every wall time


@pytest.mark.slow
@pytest.mark.alone
def test_report_names_every_run_and_is_self_contained(repo):
    html = (repo / "reports" / "index.html").read_text()
    for run in CLS_RUNS + GEN_RUNS:
        assert run in html
    assert "data:image/png;base64," in html and "http://" not in html.split("<body>")[1].replace("http://www", "")


@pytest.mark.slow
@pytest.mark.alone
def test_plots_and_params_are_visible_to_dvc(repo):
    plots = sh("dvc plots show --json", repo)
    assert "seed_0/train/loss" in plots.stdout
    params = json.loads(sh("dvc params diff --all --json", repo).stdout)
    assert "params.yaml" in params


@pytest.mark.slow
@pytest.mark.alone
def test_second_repro_runs_nothing(repo):
    out = sh("dvc repro", repo).stdout
    assert "Running stage" not in out


@pytest.mark.slow
@pytest.mark.alone
def test_changing_one_run_reruns_only_that_run_and_the_report(repo):
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["cls_runs"]["deit_tiny-vca"]["seeds"] = [1]
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = sh("dvc repro --dry", repo).stdout
    ran = {line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage")}
    assert ran == {"check_params", "train_cls@deit_tiny-vca", "eval_cls@deit_tiny-vca", "report"}  # check: seconds
    sh("dvc repro", repo)
    # the report shows what changed against the last commit, params and metrics, read through dvc.api
    html = (repo / "reports" / "index.html").read_text()
    changes = html[html.index("Changes since the previous commit") : html.index("<h2>Complexity")]
    assert "<td><code>cls_runs.deit_tiny-vca.seeds</code></td><td>[0]</td><td>[1]</td>" in changes
    assert "<td><code>deit_tiny-vca</code></td><td>top1</td>" in changes
    assert "<code>deit_tiny-mhsa</code>" not in changes  # unchanged runs are not listed
    sh("git checkout params.yaml && dvc repro", repo)  # back to the committed state (from DVC's run cache)


def readme_command(start: str) -> str:
    """The one command line of the README's code blocks that starts with ``start``: the test runs what it shows."""
    lines = [line.strip() for line in (ROOT / "README.md").read_text().splitlines() if line.strip().startswith(start)]
    assert len(lines) == 1, lines
    return lines[0].split("  #")[0].strip()


@pytest.mark.slow
@pytest.mark.alone
def test_a_targeted_experiment_shows_its_own_numbers_and_leaves_the_checkout_as_it_was(repo):
    """README "Comparing runs": `dvc exp run --temp -S <a recipe knob> <two evaluations>` runs those two runs only;
    `dvc exp show --json` then holds, under the experiment's name, the numbers its own evaluations wrote (read back
    from the experiment's commit), and the README's `dvc exp show` line, in a 160-column terminal, gives the knob and
    both runs' means beside the baseline's; the checkout's files stay as committed, and Ctrl-C in a second
    experiment leaves them so too."""
    # the micro params are written, not composed from conf/: -S edits params.yaml itself (Hydra off, in the
    # untracked .dvc/config.local)
    sh("dvc config --local hydra.enabled false", repo)
    committed = {name: (repo / name).read_bytes() for name in ("params.yaml", "dvc.lock")}
    ran = sh(readme_command("dvc exp run").replace("lr=0.012", "lr=0.1").replace("lr-half", "lr-up"), repo).stdout
    assert "train_gen" not in ran and "report" not in ran, ran  # only the two runs' stages
    assert sh("git status --porcelain", repo).stdout == ""
    assert {name: (repo / name).read_bytes() for name in committed} == committed
    exp = json.loads(sh("dvc exp show --json", repo).stdout)
    baseline = exp[1]["data"]["metrics"]
    lr_up = next(e for e in exp[1]["experiments"] if e["name"] == "lr-up")["revs"][0]
    assert lr_up["data"]["params"]["params.yaml"]["data"]["cls_recipe_overrides"]["lr"] == 0.1
    for run in CLS_RUNS:
        path = f"runs/cls/{run}/headline.json"
        own = json.loads(dvc.api.read(f"runs/cls/{run}/metrics.json", repo=str(repo), rev=lr_up["rev"]))
        shown = lr_up["data"]["metrics"][path]["data"][run]
        assert shown == {"top1": own["top1"], "n_seeds": 1}  # one seed: no spread
        assert shown != baseline[path]["data"][run], run  # lr 0.1 trains another model
    assert not any(path.startswith("metrics/") for path in lr_up["data"]["metrics"])  # no report-stage number
    shown = sh(readme_command("dvc exp show"), repo, env={"COLUMNS": "160"}).stdout
    lines = shown.splitlines()
    assert lines and max(len(line) for line in lines) <= 160, shown
    header = next(line for line in lines if "Experiment" in line).split()
    assert header[1:] == [*(f"{run}.top1" for run in CLS_RUNS), LR], shown  # from before any experiment too
    rows = {
        line.split("[")[1].split("]")[0] if "[" in line else line.split()[0]: line.split()
        for line in lines
        if line.strip(" ─") and "Experiment" not in line
    }  # not the rules
    commit = sh("git branch --show-current", repo).stdout.strip()
    for name, metrics in ((commit, baseline), ("lr-up", lr_up["data"]["metrics"])):
        top1 = [metrics[f"runs/cls/{run}/headline.json"]["data"][run]["top1"] for run in CLS_RUNS]
        assert [float(x) for x in rows[name][-3:-1]] == pytest.approx(top1, rel=1e-4), shown
        assert rows[name][-1] == ("0.024" if name == commit else "0.1"), shown
    side_by_side = sh(readme_command("dvc metrics diff").replace("main", commit).replace("lr-half", "lr-up"), repo)
    assert {line.split()[1] for line in side_by_side.stdout.splitlines()[1:]} == {
        f"{run}.{key}" for run in CLS_RUNS for key in ("n_seeds", "top1")
    }, side_by_side.stdout  # the seeds too, unchanged
    # Ctrl-C (SIGINT to the process group, as a terminal sends it) during training: the checkout is as it was
    proc = subprocess.Popen(
        "dvc exp run --temp -S cls_recipe_overrides.lr=0.2 -n stopped",
        shell=True,
        cwd=repo,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )
    for line in proc.stdout:
        # the stage's own first line: it runs, and its Ctrl-C handler is set. DVC's "Running stage" line comes before
        # the stage starts, while DVC ignores SIGINT itself (as a shell does while its child runs): a Ctrl-C there
        # reaches no one, and CI's alone tier once saw that experiment finish
        if line.startswith("train_cls "):
            os.killpg(proc.pid, signal.SIGINT)
            break
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert sh("git status --porcelain", repo).stdout == ""
    assert {name: (repo / name).read_bytes() for name in committed} == committed
    assert "stopped" not in sh("dvc exp list --name-only", repo).stdout
    sh("dvc exp remove -A && dvc config --local --unset hydra.enabled", repo)


@pytest.mark.slow
@pytest.mark.alone
def test_results_travel_through_a_local_remote(repo, tmp_path):
    remote = tmp_path / "remote"
    sh(f"dvc remote add -f -d local {remote} && dvc push -q", repo)
    # a fresh clone: every git-ignored file goes (all DVC outputs, the cache, checkpoints)
    sh("git clean -fdXq", repo)
    assert (
        not (repo / ".dvc" / "cache").exists() and not (repo / "runs" / "cls" / CLS_RUNS[0] / "metrics.json").exists()
    )
    sh("dvc pull -q", repo)
    assert (repo / "reports" / "results.json").is_file()
    status = sh("dvc status --json", repo).stdout
    assert json.loads(status) == {}, status
    assert "Running stage" not in sh("dvc repro", repo).stdout
    # the page is the run's record, in no hash: rendered again from the pulled results, the lock unchanged
    assert not (repo / "reports" / "index.html").exists()
    sh("dvc repro -f -s report", repo)
    assert (repo / "reports" / "index.html").is_file() and sh("git status --porcelain dvc.lock", repo).stdout == ""
    sh("dvc remote remove local", repo)


@pytest.mark.slow
@pytest.mark.alone
def test_the_lock_check_names_a_stale_lock_and_the_output_file_that_differs(repo):
    """That a clean run reproduces every hash of a committed lock is what .ci/run checks after README command 1, at the
    embedded scale and against a lock recorded on another machine; here, on outputs pulled back from a remote, the
    check's own verdicts."""
    assert sh(f"{sys.executable} -m vcarepro.tools.lockcheck stale", repo).returncode == 0
    verified = sh(f"{sys.executable} -m vcarepro.tools.lockcheck verify", repo)
    assert "outputs on disk hash as in the committed dvc.lock" in verified.stdout
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    assert {o["path"] for o in lock["stages"]["report"]["outs"]} == {"reports/results.json"}
    assert {o["path"] for o in lock["stages"]["eval_cls@deit_tiny-vca"]["outs"]} >= {
        "runs/cls/deit_tiny-vca/headline.json"
    }  # each run's DVC metric is an output of its evaluation, hashed like the others
    # a stale lock is named: a module a stage imports changes after the recording
    (repo / "src" / "vcarepro" / "core" / "io.py").write_text(
        (repo / "src" / "vcarepro" / "core" / "io.py").read_text() + "\n# edit\n"
    )
    stale = sh(f"{sys.executable} -m vcarepro.tools.lockcheck stale", repo, check=False)
    assert stale.returncode == 1 and "prepare_gen: dep src/vcarepro/core modified" in stale.stderr
    sh("git checkout src/vcarepro/core/io.py", repo)
    # the record keeps every directory output's files, so a difference names the file
    assert "written" in sh(f"{sys.executable} -m vcarepro.tools.lockcheck record", repo).stdout
    machine = json.loads((repo / "dvc.lock.machine.json").read_text())
    assert set(machine["files"]["data/gen"]) >= {"meta.json", "SHA256SUMS"}
    meta = repo / "data" / "gen" / "meta.json"
    meta.write_text(meta.read_text().replace("{", '{"edited": 1, ', 1))
    sh("dvc commit -f -q prepare_gen", repo)
    differs = sh(f"{sys.executable} -m vcarepro.tools.lockcheck verify", repo, check=False)
    assert differs.returncode == 1 and "data/gen (prepare_gen)" in differs.stderr
    assert "files: meta.json (differs)" in differs.stderr and "family/model/stepping" in differs.stderr
    sh("git checkout dvc.lock && rm dvc.lock.machine.json && dvc checkout -f -q", repo)
