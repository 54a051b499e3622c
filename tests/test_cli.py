"""Issue 38: one command, `vcarepro`, over the project's `python -m vcarepro.X` entry points, and `vcarepro explain`.

The console script is the installed one (`pip install -e .` puts it beside the venv's python). Its processes run
side by side (one fixture), since each pays for importing torch; `explain` and `calibrate --dry-run` also run in
this process, where torch is already loaded. Nothing trains, nothing runs `dvc repro`, nothing writes the checkout.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from helpers import ROOT, conf_copy
from vcarepro.params import explain
from vcarepro.params.config import compose
from vcarepro.params.runs import cls_recipe, cls_run, gen_run
from vcarepro.params.stage_facts import stage_definition
from vcarepro.tools import cli

ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}  # this checkout's code, whatever the venv's install points at
SCRIPT = Path(sys.executable).parent / "vcarepro"
COMMANDS = {
    "config",
    "explain",
    "preflight",
    "gpu-check",
    "calibrate",
    "cluster",
    "lockcheck",
    "bench",
    "export",
    "standins",
    "report-check",
}
HUGE = (
    "error: the command-line override `scale=huge`: scale has no option 'huge'; choose one of embedded, paper, "
    "proxy, smoke (conf/scale/*.yaml)."
)


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Each case through the installed `vcarepro` (and one `python -m` twin), all at once: name -> (cwd, result)."""
    if not SCRIPT.is_file():
        pytest.fail(
            f"{SCRIPT} is missing: install the package (`pip install -e .`) so that pyproject.toml's "
            f"[project.scripts] entry becomes the `vcarepro` command."
        )
    base = tmp_path_factory.mktemp("cli")
    cases = {
        "help": ([str(SCRIPT), "--help"], ROOT),
        "huge": ([str(SCRIPT), "config", "scale=huge"], conf_copy(base / "huge")),
        "compose": ([str(SCRIPT), "config"], conf_copy(base / "compose")),
        "missing_page": ([str(SCRIPT), "report-check", "nowhere/index.html"], base),
        "missing_page_m": ([sys.executable, "-m", "vcarepro.report.browser", "nowhere/index.html"], base),
    }
    before = {
        name: (cwd / "params.yaml").read_bytes()
        for name, (_, cwd) in cases.items()
        if (cwd / "params.yaml").is_file() and cwd != ROOT
    }
    running = {
        name: (
            cwd,
            subprocess.Popen(command, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
        )
        for name, (command, cwd) in cases.items()
    }
    done = {}
    for name, (cwd, process) in running.items():
        out, err = process.communicate(timeout=300)
        done[name] = (cwd, subprocess.CompletedProcess(process.args, process.returncode, out, err))
    done["before"] = before
    return done


def test_pyproject_declares_the_console_script():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"vcarepro": "vcarepro.tools.cli:main"}


@pytest.mark.slow
def test_help_lists_every_command_in_one_line_each(ran):
    result = ran["help"][1]
    assert result.returncode == 0, result.stderr
    listed = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^  ([a-z-]+) +(\S.*)$", result.stdout, re.MULTILINE)
        if not m.group(1).startswith("-")
    }
    assert set(listed) == COMMANDS
    assert set(cli.ORDER) == COMMANDS == set(cli.WRAPPED) | set(cli.OWN)
    assert all(len(f"  {name:<14}{text}") <= 110 for name, text in listed.items())


@pytest.mark.slow
def test_a_user_error_passes_through_with_its_sentence_and_status(ran):
    where, result = ran["huge"]
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [HUGE]
    assert (where / "params.yaml").read_bytes() == ran["before"]["huge"]  # refused: untouched


@pytest.mark.slow
def test_a_good_run_passes_through_with_status_0(ran):
    where, result = ran["compose"]
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load((where / "params.yaml").read_text()) == compose([], where / "conf")


@pytest.mark.slow
def test_a_wrapped_command_is_its_python_m_twin(ran):
    ours, theirs = ran["missing_page"][1], ran["missing_page_m"][1]
    assert (ours.returncode, ours.stdout, ours.stderr) == (theirs.returncode, theirs.stdout, theirs.stderr)
    assert ours.returncode == 2 and ours.stderr.startswith("error: nowhere/index.html does not exist")


def test_importing_the_cli_imports_nothing_of_the_package_or_torch():
    """Every tool is imported when its command runs (importing vcarepro.tools.cli still runs vcarepro/__init__.py)."""
    tree = ast.parse((ROOT / "src" / "vcarepro" / "tools" / "cli.py").read_text())
    top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = [alias.name for node in top if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module or "" for node in top if isinstance(node, ast.ImportFrom) if not node.level]
    assert not [n for n in names if n.split(".")[0] in ("vcarepro", "torch", "timm", "hydra", "dvc")]
    assert not [node for node in top if isinstance(node, ast.ImportFrom) and node.level]


def test_every_wrapped_module_runs_as_main():
    import importlib.util

    for command, (module, _) in cli.WRAPPED.items():
        spec = importlib.util.find_spec(module)
        path = (
            Path(spec.submodule_search_locations[0]) / "__main__.py"
            if spec.submodule_search_locations
            else Path(spec.origin)
        )
        assert 'if __name__ == "__main__":' in path.read_text(), command


# -- explain ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded():
    return explain.explain("deit_tiny-vca", [], ROOT)


@pytest.fixture(scope="module")
def paper():
    return explain.explain("deit_tiny-vca", ["scale=paper"], ROOT)


def knob(result, group, name):
    found = [k for g in result["groups"] if g["group"] == group for k in g["knobs"] if k["knob"] == name]
    assert len(found) == 1, (group, name)
    return found[0]


def row(text, name):
    found = [line for line in text.splitlines() if line.startswith(f"  {name} ")]
    assert len(found) == 1, text
    return found[0]


def test_explain_gives_the_lr_the_run_trains_with_and_the_file_that_set_it(embedded):
    params = compose([])
    expected = cls_recipe(params, params["cls_runs"]["deit_tiny-vca"]["recipe"]).lr
    assert expected == params["cls_recipe_overrides"]["lr"] != params["cls_recipes"]["lab_deit_tiny"]["lr"]
    lr = knob(embedded, "recipe", "lr")
    assert lr["value"] == expected
    assert lr["key"] == "cls_recipe_overrides.lr" and lr["set_by"] == "conf/scale/embedded.yaml"
    assert yaml.safe_load((ROOT / "conf/scale/embedded.yaml").read_text())["cls_recipe_overrides"]["lr"] == expected
    assert lr["replaces"] == {
        "key": "cls_recipes.lab_deit_tiny.lr",
        "value": params["cls_recipes"]["lab_deit_tiny"]["lr"],
        "recipe": "lab_deit_tiny",
    }
    assert {"train_cls@deit_tiny-vca", "eval_cls@deit_tiny-vca"} <= set(lr["read_by"])
    assert "train_gen@dit_s2-vca" not in lr["read_by"]

    text = explain.render(embedded)
    line = row(text, "lr")
    assert line.split()[1] == str(expected) and "conf/scale/embedded.yaml" in line
    assert f"overrides lab_deit_tiny's {params['cls_recipes']['lab_deit_tiny']['lr']}" in line
    header = text[: text.index(line)].rsplit("\n\n", 1)[1]  # the recipe group's head names its readers
    assert "train_cls@deit_tiny-vca" in header.replace("\n    ", " ")
    assert max(len(line) for line in text.splitlines()) <= explain.WIDTH


def test_explain_at_paper_scale_gives_the_paper_recipe_and_its_file(paper):
    params = compose(["scale=paper"])
    expected = cls_recipe(params, "lab_deit_tiny").lr
    assert expected == params["cls_recipes"]["lab_deit_tiny"]["lr"]
    lr = knob(paper, "recipe", "lr")
    assert lr["value"] == expected and lr["key"] == "cls_recipes.lab_deit_tiny.lr" and "replaces" not in lr
    assert re.fullmatch(r"conf/cls_recipe/\w+\.yaml", lr["set_by"])
    assert yaml.safe_load((ROOT / lr["set_by"]).read_text())["lr"] == expected  # that file does say it
    assert "train_cls@deit_tiny-vca" in lr["read_by"]
    assert lr["set_by"] in row(explain.render(paper), "lr")
    # which path feeds its training images, in the first lines: the fast path the paper recipes augment on
    assert paper["input_path"] == "fast" and "its training images come through the fast input path" in " ".join(
        explain.render(paper).split("\n\n")[0].split()
    )


@pytest.mark.parametrize("which", ["embedded", "paper"])
def test_every_knob_is_what_its_key_holds_and_the_whole_run_is_there(which, request):
    result = request.getfixturevalue(which)
    params = compose(["scale=paper"] if which == "paper" else [])
    run = cls_run(params, "deit_tiny-vca")
    knobs = [k for g in result["groups"] for k in g["knobs"]]
    for k in knobs:
        value = params
        for part in k["key"].split("."):
            value = value[part]
        assert value == k["value"], k["key"]
        assert k["read_by"], k["key"]
    groups = {g["group"]: {k["knob"]: k["value"] for k in g["knobs"]} for g in result["groups"]}
    recipe = run.recipe.model_dump()
    applied = {k: v for k, v in recipe.items() if k not in result["unapplied"]}
    assert groups["recipe"] == applied and set(result["unapplied"]) < set(recipe)
    if which == "paper":  # every paper recipe augments and mixes: nothing is left out
        assert result["unapplied"] == {}
    assert groups["model"] == {"arch": run.model["arch"], "attention": run.model["attention"], "options": {}}
    assert groups["numerics"] == params["numerics"]
    assert list(groups)[:5] == ["run", "model", "recipe", "shape", "numerics"]
    # every stage reads numerics; each stage of the run declares what its knobs say it reads
    assert all(set(k["read_by"]) == set(result["every_stage"]) for k in knobs if k["group"] == "numerics")
    assert result["stages"] == ["train_cls@deit_tiny-vca", "eval_cls@deit_tiny-vca"]
    declared = stage_definition("train_cls@deit_tiny-vca", ROOT)[1]
    assert "cls_recipe_overrides" in declared and "distributed.seed_processes" in declared


def test_explain_gives_the_reason_beside_a_value_and_leaves_out_what_the_run_never_applies(embedded):
    """The reason is the `why:` beside the value in the file that set it (data, not a comment), and a knob the
    training never reads (auto_augment under train_augment: false) is not listed among the knobs."""
    lr = knob(embedded, "recipe", "lr")
    reasons = yaml.safe_load((ROOT / "conf/scale/embedded.yaml").read_text())["cls_recipe_overrides"]["why"]
    assert lr["why"] == " ".join(reasons["lr"].split()) and "still climbing" in lr["why"]
    assert "why" not in knob(embedded, "recipe", "opt")  # the lab's own value: nothing to explain
    assert "auto_augment" not in {k["knob"] for k in knob_group(embedded, "recipe")}
    assert embedded["unapplied"]["auto_augment"].startswith("train_augment is false")
    text = explain.render(embedded)
    assert "why: " + lr["why"][:30] in " ".join(text.split())
    assert not [line for line in text.splitlines() if line.startswith("  auto_augment ")]
    assert "not applied by this run (train_augment is false" in text and "auto_augment" in text.split("not applied")[1]
    assert embedded["input_path"] == "pil" and "through the PIL input path" in " ".join(text.split("\n\n")[0].split())
    # a command-line override has no reason of its own: the file's is not shown for it
    assert "why" not in knob(explain.explain("deit_tiny-vca", ["cls_recipe_overrides.lr=0.1"], ROOT), "recipe", "lr")


@pytest.mark.slow
@pytest.mark.parametrize("scale", ["embedded", "smoke", "proxy", "paper"])
def test_every_recipe_knob_a_scale_changes_carries_its_reason(scale):
    """At every scale, each recipe knob whose value departs from the run's named recipe (classification) or from
    conf/config.yaml's gen_recipe (generation), and that the run applies, shows a reason in explain."""
    params = compose([f"scale={scale}"])
    cls = {}
    for name, entry in params["cls_runs"].items():
        cls.setdefault(entry["recipe"], name)  # one run per recipe: the knobs are the recipe's
    missing = []
    for name in [*cls.values(), next(iter(params["gen_runs"]))]:
        result = explain.explain(name, [f"scale={scale}"], ROOT)
        for k in knob_group(result, "recipe"):
            if result["branch"] == "cls":  # departs from the named recipe (a recipe's own values are the recipe)
                departs = k.get("replaces") and k["replaces"]["value"] != k["value"]
            else:  # departs from conf/config.yaml's gen_recipe
                departs = k.get("over") and k["over"]["file"] == "conf/config.yaml"
            if departs and not k.get("why"):
                missing.append(f"{name}: {k['key']} = {k['value']!r} ({k['set_by']})")
    assert not missing, "no `why:` beside:\n" + "\n".join(missing)


def test_every_reason_in_conf_stands_beside_a_knob_of_its_own_file():
    """A `why:` mapping names keys of the mapping it sits in (a misspelt or orphaned reason explains nothing)."""
    bad = []

    def walk(tree, where):
        if isinstance(tree, dict):
            reasons = tree.get("why")
            if isinstance(reasons, dict):
                for key, text in reasons.items():
                    if key not in tree or key == "why":
                        bad.append(f"{where}why.{key}: no sibling {key}")
                    if not isinstance(text, str) or not text.strip():
                        bad.append(f"{where}why.{key}: not a sentence")
            for key, sub in tree.items():
                if key != "why":
                    walk(sub, f"{where}{key}.")

    files = sorted((ROOT / "conf").rglob("*.yaml"))
    for path in files:
        walk(yaml.safe_load(path.read_text()) or {}, f"{path.relative_to(ROOT)}: ")
    assert not bad, "\n".join(bad)
    assert sum("why:" in path.read_text() for path in files) >= 3  # the scales hold reasons


def test_params_yaml_holds_no_reason():
    """Reasons stay in conf/: params.yaml (what DVC records per stage) would re-run a stage for a reworded one."""
    for stack in [[yaml.safe_load((ROOT / "params.yaml").read_text())], [compose(["scale=smoke"])]]:
        while stack:
            tree = stack.pop()
            if isinstance(tree, dict):
                assert "why" not in tree
                stack.extend(tree.values())


def test_explain_names_a_command_line_override():
    result = explain.explain("deit_tiny-vca", ["cls_recipe_overrides.lr=0.1"], ROOT)
    lr = knob(result, "recipe", "lr")
    assert lr["value"] == 0.1 and lr["override"] == "cls_recipe_overrides.lr=0.1"
    assert lr["set_by"] == "command line `cls_recipe_overrides.lr=0.1`"
    assert lr["file"] == "conf/scale/embedded.yaml"  # what it overrode


def test_explain_a_generation_run():
    params = compose([])
    result = explain.explain("dit_s2-vca", [], ROOT)
    run = gen_run(params, "dit_s2-vca")
    assert {k["knob"]: k["value"] for k in knob_group(result, "recipe")} == run.recipe.model_dump(exclude_unset=True)
    assert knob(result, "model", "options.contrast_tokens")["value"] == run.model["options"]["contrast_tokens"]
    assert "sample_gen@dit_s2-vca" in knob(result, "recipe", "learn_sigma")["read_by"]
    assert "sample_gen@dit_s2-vca" not in knob(result, "recipe", "lr")["read_by"]
    assert {g["group"] for g in result["groups"]} >= {"run", "model", "recipe", "shape", "numerics", "sampling"}


def knob_group(result, group):
    return next(g["knobs"] for g in result["groups"] if g["group"] == group)


def test_explain_main_prints_json_and_refuses_an_unknown_run_in_one_sentence(monkeypatch, capsys):
    import json

    monkeypatch.chdir(ROOT)
    assert explain.main(["deit_tiny-vca", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["run"] == "deit_tiny-vca" and printed["scale"] == "embedded"
    assert explain.main(["deit_tiny-vcx"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("error: no run 'deit_tiny-vcx'"), err
    assert "did you mean deit_tiny-vca" in lines[0]
    assert explain.main(["deit_small-vca"]) == 2  # a run of the paper scale only
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "add scale=paper" in err[0]


# -- calibrate ---------------------------------------------------------------------------------------------------------


def test_calibrate_composes_the_selection_and_runs_the_stages_it_needs(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert cli.main(["calibrate", "--dry-run", "deit_tiny", "dit_xl2_cfg15"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "python -m vcarepro.params.config scale=paper 'calibrate.checkpoints=[deit_tiny,dit_xl2_cfg15]'",
        "dvc repro calibrate_cls calibrate_gen",
    ]
    assert cli.main(["calibrate", "--dry-run", "deit_tny"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'deit_tny'" in err[0] and "deit_tiny" in err[0]


def test_config_help_is_its_own_usage_and_writes_nothing(tmp_path, monkeypatch, capsys):
    from vcarepro.params import config

    monkeypatch.chdir(tmp_path)
    assert config.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "usage: vcarepro config [KEY=VALUE | +KEY=VALUE | GROUP=OPTION ...]\n\n``conf/`` is the source"
    )
    assert not (tmp_path / "params.yaml").exists()
