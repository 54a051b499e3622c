"""Issue 36: bad params are refused where they enter, in one sentence, and nothing is written.

`python -m vcarepro.params.config` refuses a misspelt or missing key, an unsafe run name and an unknown option of a
config group with exit status 2 and one `error:` line naming the key, the conf file (or command-line override)
that set it and the nearest valid key, and leaves params.yaml byte for byte as it was. A stage refuses the same
key in a params.yaml that `dvc exp run -S` composed, before it writes anything. Seen before on main: exit 0 and
a params.yaml holding both `seeds: [0]` and `sedes: [0, 1, 2]`, DVC's "Could not find 'item.model'", DVC's
"Parameters ... are missing", and a 57-line Hydra traceback.

The real processes run side by side (one fixture), since each pays for importing torch.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import yaml

from helpers import ROOT, conf_copy
from vcarepro.core.errors import USER_ERROR_STATUS
from vcarepro.params.config import compose, main

ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}


# (an edit of conf/, the overrides, the one line expected on stderr)
CASES = {
    "sedes": (
        ("conf/scale/embedded.yaml", "deit_tiny-mhsa: {seeds: [0, 1, 2]}", "deit_tiny-mhsa: {sedes: [0, 1, 2]}"),
        [],
        "error: conf/scale/embedded.yaml: cls_runs.deit_tiny-mhsa.sedes is not a key of a cls_runs entry "
        "(did you mean seeds?), which holds model, recipe, seeds; fix it in conf/ and run "
        "`python -m vcarepro.params.config`, or correct the -S override that set it.",
    ),
    "modle": (
        ("conf/config.yaml", "deit_tiny-vca: {model: deit_tiny-vca,", "deit_tiny-vca: {modle: deit_tiny-vca,"),
        [],
        "error: conf/config.yaml: cls_runs.deit_tiny-vca.modle is not a key of a cls_runs entry (did you "
        "mean model?), which holds model, recipe, seeds; fix it in conf/ and run `python -m vcarepro.params.config`, "
        "or correct the -S override that set it.",
    ),
    "evil": (
        ("conf/runs/sit.yaml", "  sit_s2-vca:", '  "../evil":'),
        [],
        "error: conf/runs/sit.yaml: gen_runs has an entry named '../evil'; a name is 1 to 100 letters, digits, "
        "'_' or '-' (starting with a letter or digit), since it becomes a directory and a DVC stage name; "
        "rename it in conf/ and run `python -m vcarepro.params.config`.",
    ),
    "huge": (
        None,
        ["scale=huge"],
        "error: the command-line override `scale=huge`: scale has no option 'huge'; choose one of embedded, "
        "paper, proxy, smoke (conf/scale/*.yaml).",
    ),
    "outside conf/": (
        None,
        ["scale=../../params"],
        "error: the command-line override `scale=../../params`: scale has no option '../../params'; choose one of "
        "embedded, paper, proxy, smoke (conf/scale/*.yaml).",
    ),
}


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """Each case through the real `python -m vcarepro.params.config`, and one real stage, all at once."""
    base = tmp_path_factory.mktemp("refusal")
    running = {}
    for name, (edit, overrides, _) in CASES.items():
        where = conf_copy(base / name, edit)
        running[name] = (
            where,
            subprocess.Popen(
                [sys.executable, "-m", "vcarepro.params.config", *overrides],
                cwd=where,
                env=ENV,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
    # the same misspelling in a params.yaml that `dvc exp run -S +cls_runs.deit_tiny-mhsa.sedes=...` could leave
    stage_dir = base / "stage" / "project"
    stage_dir.mkdir(parents=True)
    params = copy.deepcopy(compose([]))
    params["cls_runs"]["deit_tiny-mhsa"]["sedes"] = [0, 1, 2]
    (stage_dir / "params.yaml").write_text(yaml.safe_dump(params))
    running["stage"] = (
        stage_dir,
        subprocess.Popen(
            [sys.executable, str(ROOT / "stages" / "train_cls.py"), "--run", "deit_tiny-mhsa"],
            cwd=stage_dir,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
    )
    results = {}
    for name, (where, process) in running.items():
        out, err = process.communicate(timeout=300)
        results[name] = (where, process.returncode, out, err)
    return results


@pytest.mark.parametrize("case", list(CASES))
def test_the_config_command_refuses_in_one_sentence_and_writes_nothing(refused, case):
    where, status, out, err = refused[case]
    assert status == USER_ERROR_STATUS, err
    assert err.splitlines() == [CASES[case][2]] and out == ""
    assert (where / "params.yaml").read_bytes() == (ROOT / "params.yaml").read_bytes()
    assert sorted(p.name for p in where.iterdir()) == ["conf", "params.yaml"]  # no temporary file left either


def test_a_stage_refuses_the_misspelt_key_dvc_exp_run_could_compose_before_writing_anything(refused):
    where, status, out, err = refused["stage"]
    assert status == USER_ERROR_STATUS, err
    assert err.splitlines() == [
        "error: params.yaml: cls_runs.deit_tiny-mhsa.sedes is not a key of a cls_runs entry (did you mean "
        "seeds?), which holds model, recipe, seeds; fix it in conf/ and run `python -m vcarepro.params.config`, "
        "or correct the -S override that set it."
    ]
    assert sorted(str(p.relative_to(where.parent)) for p in where.parent.rglob("*")) == [
        "project",
        "project/params.yaml",
    ]


# In-process (the same main() the command runs): the other refusals, each naming key, source and nearest key.
@pytest.mark.parametrize(
    "edit, overrides, line",
    [
        (
            (
                "conf/runs/ablations.yaml",
                "{model: dit_s2-vca-stage1_only, objective: ddpm, seeds: [0]}",
                "{model: dit_s2-vca-stage1_only, seeds: [0]}",
            ),
            [],
            "error: conf/runs/ablations.yaml: gen_runs.dit_s2-vca-stage1_only.objective is missing; a gen_runs "
            "entry holds model, objective, seeds (and recipe); ",
        ),
        (
            None,
            ["distributed.seed_process=2"],
            "error: the command-line override `distributed.seed_process=2`: distributed.seed_process is not a key "
            "of the composition of conf/ (did you mean distributed.seed_processes?); ",
        ),
        (
            None,
            ["+cls_runs.deit_tiny-mhsa.sedes=[0]"],
            "error: the command-line override `+cls_runs.deit_tiny-mhsa.sedes=[0]`: cls_runs.deit_tiny-mhsa.sedes "
            "is not a key of a cls_runs entry (did you mean seeds?)",
        ),
        (
            None,
            ["cls_recipe@cls_recipes.deit=labb"],
            "error: the command-line override `cls_recipe@cls_recipes.deit=labb`: cls_recipe has no option 'labb' "
            "(did you mean lab?); choose one of cswin, deit, lab, ",
        ),
        (
            ("conf/config.yaml", "  - family: none", "  - family: nnoe"),
            [],
            "error: conf/config.yaml: family has no option 'nnoe' (did you mean none?); choose one of all, none ",
        ),
        (
            ("conf/scale/embedded.yaml", "\n  epochs: 15", "\n  epoch: 15"),
            [],
            "error: conf/scale/embedded.yaml: cls_recipe_overrides.epoch is not a known parameter (did you mean "
            "epochs?); ",
        ),
        (
            ("conf/config.yaml", "\n  rdzv_timeout: 600", "\n  rdzv_timeuot: 600"),
            [],
            "error: conf/config.yaml: distributed.rdzv_timeuot is not a known parameter (did you mean "
            "distributed.rdzv_timeout?); ",
        ),
        (
            ("conf/scale/embedded.yaml", "\nprepare_cls:", "\nprepare_cl:"),
            [],
            "error: conf/scale/embedded.yaml: prepare_cl is not a known section (did you mean prepare_cls?); ",
        ),
        (
            (
                "conf/family/all.yaml",
                "deit_tiny-agent: {model: deit_tiny-agent,",
                "deit_tiny-agent: {modl: deit_tiny-agent,",
            ),
            ["family=all"],
            "error: conf/family/all.yaml: cls_runs.deit_tiny-agent.modl is not a key of a cls_runs entry "
            "(did you mean model?)",
        ),
        (None, ["a b=1"], "error: the command-line override `a b=1` is not Hydra's override syntax"),
    ],
    ids=[
        "missing",
        "override-typo",
        "override-add",
        "group-option",
        "default-option",
        "recipe-knob",
        "section-key",
        "section",
        "family",
        "syntax",
    ],
)
def test_each_refusal_names_the_key_its_source_and_the_nearest_valid_key(
    tmp_path, monkeypatch, capsys, edit, overrides, line
):
    where = conf_copy(tmp_path / "project", edit)
    monkeypatch.chdir(where)
    assert main(overrides) == USER_ERROR_STATUS
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(line), err
    assert (where / "params.yaml").read_bytes() == (ROOT / "params.yaml").read_bytes()


@pytest.mark.slow
def test_a_hand_edit_of_params_yaml_is_checked_on_every_dvc_repro_and_reruns_only_what_it_changed(tmp_path):
    """A section no stage reads, misspelt by hand, must not pass as "up to date": the researcher would believe the
    learning rate changed. check_params reads the whole file, and every stage depends on its output."""
    from helpers import micro_params, reproduced_repo, sh

    repo = reproduced_repo(tmp_path / "repo", micro_params(), targets="smoke_inputs")
    lock = (repo / "dvc.lock").read_bytes()

    def edited(edit):
        params = yaml.safe_load((repo / "params.yaml").read_text())
        edit(params)
        (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    edited(lambda p: p.update(cls_recipe_overides={"lr": 1}))
    said = sh("dvc repro smoke_inputs", repo, check=False)
    assert said.returncode != 0
    errors = [line for line in said.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: params.yaml: cls_recipe_overides is not a known section (did you mean cls_recipe_overrides?); "
        "fix it in conf/ and run `python -m vcarepro.params.config`, or correct the -S override that set it."
    ]
    assert "Traceback" not in said.stdout + said.stderr and "Running stage 'smoke_inputs'" not in said.stdout
    assert (repo / "dvc.lock").read_bytes() == lock and not (repo / "data" / "params.checked").exists()

    edited(lambda p: (p.pop("cls_recipe_overides"), p["report"].update(reproduce_tolerance_top1=9.0)))
    ran = sh("dvc repro smoke_inputs", repo).stdout
    assert "Running stage 'check_params'" in ran and "Running stage 'smoke_inputs'" not in ran
    edited(lambda p: p["smoke"].update(seed=1))
    ran = sh("dvc repro smoke_inputs", repo).stdout
    assert "Running stage 'check_params'" in ran and "Running stage 'smoke_inputs'" in ran
