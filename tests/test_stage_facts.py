"""What a run depends on is read from its stage in dvc.yaml, once: any change that makes DVC re-run a training
stage trains afresh, and what dvc.lock records beside the weights is what produced them (issue 36).

Seen before: `python -m vcarepro.params.config numerics.cpu=native`, then `dvc repro train_cls@deit_tiny-mhsa`, resumed
the portable profile's finished checkpoint ("already trained") and recorded its weights beside `cpu: native`,
because the checkpoint's fingerprint was a third, hand-kept list of what a run depends on.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml

from helpers import ROOT, copied_project, sh
from vcarepro.params.stage_facts import stage_definition, stage_facts
from vcarepro.train.checkpoint import resumable_checkpoint, save_checkpoint, what_changed

RUN = "deit_tiny-mhsa"
STAGE = f"train_cls@{RUN}"


def test_the_definition_read_outside_dvc_is_the_one_dvc_resolves_for_every_stage():
    """The bare-directory reading of dvc.yaml (foreach, ${key}, ${item.*}) gives DVC's own deps and params."""
    from dvc.dependency.param import ParamsDependency
    from dvc.dvcfile import ProjectFile
    from dvc.repo import Repo
    from dvc.stage.loader import StageLoader

    with Repo(str(ROOT)) as repo:
        pipeline = ProjectFile(repo, str(ROOT / "dvc.yaml"))
        loader = StageLoader(pipeline, pipeline.contents)
        names = list(loader)
        assert len(names) > 40 and STAGE in names
        for name in names:
            stage = loader[name]
            dvc_deps = [d.def_path for d in stage.deps if not isinstance(d, ParamsDependency)]
            dvc_params = [p for d in stage.deps if isinstance(d, ParamsDependency) for p in d.params]
            assert stage_definition(name, ROOT) == (dvc_deps, dvc_params), name


def test_inside_a_dvc_project_the_facts_are_dvcs_own_hashes():
    facts = stage_facts(STAGE, ROOT)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert facts["stage"] == STAGE
    assert facts["params"]["numerics"] == params["numerics"]
    assert facts["params"][f"cls_runs.{RUN}"] == params["cls_runs"][RUN]
    assert set(facts["params"]) == {
        "numerics",
        f"cls_runs.{RUN}",
        f"models.{RUN}",
        "cls_shape",
        "cls_recipes.deit",
        "cls_recipe_overrides",
        "distributed.seed_processes",
    }
    import hashlib

    assert (
        facts["deps"]["stages/train_cls.py"] == hashlib.md5((ROOT / "stages/train_cls.py").read_bytes()).hexdigest()
    )  # DVC's md5, as dvc.lock has it
    assert facts["deps"]["src/vcarepro/core"].endswith(".dir") and facts["deps"]["src/vcarepro/train"].endswith(".dir")


@pytest.fixture
def bare(tmp_path):
    """A directory with params.yaml and a prepared-looking data/cls, and no DVC project: stage scripts run by hand."""
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "data" / "cls").mkdir(parents=True)
    (tmp_path / "data" / "cls" / "manifest.csv").write_text("split,path,label\n")
    return tmp_path


def _edit_params(root: Path, edit) -> None:
    params = yaml.safe_load((root / "params.yaml").read_text())
    edit(params)
    (root / "params.yaml").write_text(yaml.safe_dump(params))


@pytest.mark.parametrize(
    "edit, named",
    [
        (lambda p: p["numerics"].update(cpu="native"), "numerics"),
        (lambda p: p["distributed"].update(seed_processes=1), "distributed.seed_processes"),
        (lambda p: p["models"][RUN].update(attention="vca"), f"models.{RUN}"),
        (lambda p: p["cls_recipes"]["deit"].update(lr=1e-3), "cls_recipes.deit"),
    ],
)
def test_every_declared_param_is_a_fact_and_an_undeclared_one_is_not(bare, edit, named):
    before = stage_facts(STAGE, bare)
    _edit_params(bare, lambda p: p["report"].update(reproduce_tolerance_top1=9.0))  # not a dep of train_cls
    assert stage_facts(STAGE, bare) == before
    _edit_params(bare, edit)
    after = stage_facts(STAGE, bare)
    assert [k for k in after["params"] if after["params"][k] != before["params"][k]] == [named]
    assert after["deps"] == before["deps"]


def test_every_declared_dependency_is_a_fact_by_its_content(bare, tmp_path_factory, monkeypatch):
    # a checkout where README command 1 has run: its data/cls must not stand in for the scratch folder's
    checkout = tmp_path_factory.mktemp("checkout")
    for name in ("dvc.yaml", "stages", "src"):
        (checkout / name).symlink_to(ROOT / name)
    (checkout / "data" / "cls").mkdir(parents=True)
    (checkout / "data" / "cls" / "manifest.csv").write_text("split,path,label\n")
    monkeypatch.setattr("vcarepro.params.stage_facts.REPO_ROOT", checkout)
    before = stage_facts(STAGE, bare)
    assert before["deps"]["data/cls"].endswith(".dir") and before["deps"]["stages/train_cls.py"]
    (bare / "data" / "cls" / "manifest.csv").write_text("split,path,label\ntrain,a.png,0\n")
    after = stage_facts(STAGE, bare)
    assert [k for k in after["deps"] if after["deps"][k] != before["deps"][k]] == ["data/cls"]
    shutil.rmtree(bare / "data" / "cls")
    assert stage_facts(STAGE, bare)["deps"]["data/cls"] is None


def test_an_unknown_stage_or_run_is_one_sentence(bare):
    from vcarepro.core.errors import BadInput

    with pytest.raises(BadInput, match="has no stage 'train_clss'; name one of check_params, smoke_inputs, "):
        stage_facts("train_clss@x", bare)
    with pytest.raises(BadInput, match=r"train_cls@nope is not one of train_cls's entries .*\(\$\{cls_runs\}\)"):
        stage_facts("train_cls@nope", bare)


def test_a_checkpoint_of_other_facts_is_passed_over_naming_what_changed(tmp_path):
    facts = stage_facts(STAGE, ROOT)
    mine = {"facts": facts, "seed": 0, "max_steps": None}
    save_checkpoint(tmp_path / "last.pt", {"model": {"w": torch.zeros(2)}, "fingerprint": mine})
    said = []
    assert resumable_checkpoint(tmp_path, mine, 0, said.append)["fingerprint"] == mine and said == []
    native = {
        **facts,
        "params": {**facts["params"], "numerics": {**facts["params"]["numerics"], "cpu": "native"}},
        "deps": {**facts["deps"], "src/vcarepro/core/numerics.py": "0" * 32},
    }
    assert resumable_checkpoint(tmp_path, {**mine, "facts": native}, 0, said.append) is None
    assert said == [
        f"seed 0: {tmp_path / 'last.pt'} was written under other facts ({STAGE}'s params numerics; "
        f"deps src/vcarepro/core/numerics.py); starting afresh"
    ]
    assert what_changed(mine, {**mine, "max_steps": 3}) == f"{STAGE}'s max_steps None -> 3"


# -- the real thing: python -m vcarepro.params.config, then dvc repro, in a DVC project --------------------------------

# One run, one seed, two epochs of a one-block DeiT: seconds a training.
SHRINK = [
    f"cls_runs.{RUN}.seeds=[0]",
    "cls_shape.depth=1",
    "cls_shape.embed_dim=32",
    "cls_recipe_overrides.epochs=2",
    "cls_recipe_overrides.batch_size=256",
]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """This checkout's tracked files (no outputs) in a new git + DVC repository, params from the real config."""
    repo = copied_project(tmp_path_factory.mktemp("facts") / "repo")
    sh("git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm facts", repo)
    return repo


def configure(project: Path, *overrides: str) -> None:
    sh(f"python -m vcarepro.params.config {' '.join(repr(o) for o in [*SHRINK, *overrides])}", project)


def repro(project: Path, flags: str = "") -> str:
    result = sh(f"dvc repro {flags} {STAGE}", project)
    return result.stdout + result.stderr


def trained_under(project: Path) -> dict:
    """The facts stored in the checkpoint the run's weights came from."""
    state = torch.load(project / "checkpoints" / "cls" / RUN / "seed_0" / "last.pt", weights_only=True)
    return state["fingerprint"]["facts"]


def recorded(project: Path) -> dict:
    return yaml.safe_load((project / "dvc.lock").read_text())["stages"][STAGE]


@pytest.mark.slow
def test_each_change_dvc_reruns_a_training_stage_for_trains_afresh(project):
    configure(project)
    first = repro(project)
    assert "starting afresh" not in first and "already trained" not in first
    assert trained_under(project)["params"]["numerics"]["cpu"] == "portable"

    # the same facts: a forced re-run resumes the finished checkpoint (nothing to train again)
    again = repro(project, "-f -s")
    assert "seed 0: already trained (2 of 2 epochs in checkpoints/cls/" in again, again[-3000:]

    # 1. the numerics profile (a declared param): trained afresh under native, and dvc.lock records native
    configure(project, "numerics.cpu=native")
    native = repro(project)
    assert f"was written under other facts ({STAGE}'s params numerics); starting afresh" in native, native[-3000:]
    assert "already trained" not in native
    assert trained_under(project)["params"]["numerics"]["cpu"] == "native"
    lock = recorded(project)
    assert [p for p in lock["params"]["params.yaml"] if p == "numerics"] == ["numerics"]
    assert lock["params"]["params.yaml"]["numerics"]["cpu"] == "native"

    # 2. declared code (core/, one folder dep): an edit to a file in it trains afresh, naming the dependency
    numerics = project / "src" / "vcarepro" / "core" / "numerics.py"
    numerics.write_text(numerics.read_text() + "\n# an edit DVC sees\n")
    edited = repro(project)
    assert f"({STAGE}'s deps src/vcarepro/core); starting afresh" in edited, edited[-3000:]

    # 3. a declared param of another section (distributed.seed_processes), which the old fingerprint left out
    configure(project, "numerics.cpu=native", "distributed.seed_processes=1")
    other = repro(project)
    assert f"({STAGE}'s params distributed.seed_processes); starting afresh" in other, other[-3000:]
    assert trained_under(project)["params"]["distributed.seed_processes"] == 1
    assert (
        trained_under(project)["deps"]["src/vcarepro/core"]
        == {d["path"]: d["md5"] for d in recorded(project)["deps"]}["src/vcarepro/core"]
    )
    assert "changed" not in sh(f"dvc status {STAGE}", project).stdout  # the lock holds what produced the weights
