"""params.yaml is checked when a stage starts: one sentence for a bad value, and no output."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import ROOT, stage
from vcarepro.params.config import compose
from vcarepro.params.schema import ParamsError, validate


@pytest.fixture(scope="module")
def scales():
    return {"embedded": compose([]), "paper": compose(["scale=paper"])}


def test_both_scales_and_every_documented_override_validate(scales):
    for params in scales.values():
        validate(params)
    paper = copy.deepcopy(scales["paper"])
    paper["distributed"].update(nnodes="env", nproc_per_node="gpu", node_rank="env", launcher="srun")
    paper["prepare_cls"].update(subset_classes=["n01440764", "n01443537"])
    paper["cls_recipe_overrides"].update(precision="bf16", compile="inductor", clip_grad=5.0, epochs=30)
    paper["sampling"].update(flow_sampler="ode", flow_ode_method="heun")
    validate(paper)


@pytest.mark.parametrize(
    "path, value, message",
    [
        ("cls_recipe_overrides.epochs", "ten", "cls_recipe_overrides.epochs must be an integer >= 1, got 'ten'"),
        ("cls_recipe_overrides.lr", -1e-3, "cls_recipe_overrides.lr must be a number > 0, got -0.001"),
        ("cls_recipe_overrides.reprob", 1.5, "cls_recipe_overrides.reprob must be a number >= 0 and <= 1, got 1.5"),
        (
            "cls_recipe_overrides.ema_decay",
            1.0,
            "cls_recipe_overrides.ema_decay must be a number >= 0 and < 1, got 1.0",
        ),
        (
            "cls_recipe_overrides.precision",
            "fp8",
            "cls_recipe_overrides.precision must be one of fp32, tf32, bf16, fp16, got 'fp8'",
        ),
        (
            "cls_recipe_overrides.repeated_aug",
            "yes",
            "cls_recipe_overrides.repeated_aug must be true or false, got 'yes'",
        ),
        (
            "cls_recipe_overrides.lr_step",
            "step",
            "cls_recipe_overrides.lr_step must be one of epoch, update, got 'step'",
        ),
        ("cls_recipe_overrides.crop_mode", "border", "crop_mode must be one of center, squash, got 'border'"),
        ("gen_recipe.steps", 0, "gen_recipe.steps must be an integer >= 1, got 0"),
        ("gen_recipe.lr", float("nan"), "gen_recipe.lr must be a finite number, got nan"),
        ("cls_recipe_overrides.lr", float("inf"), "cls_recipe_overrides.lr must be a finite number, got inf"),
        ("cls_recipe_overrides.min_lr", -float("inf"), "cls_recipe_overrides.min_lr must be a finite number, got -inf"),
        ("cls_recipe_overrides.scale", [0.5, float("inf")], "cls_recipe_overrides.scale must be a finite number"),
        ("sampling.flow_sampler", "euler", "sampling.flow_sampler must be one of sde, ode, got 'euler'"),
        ("distributed.nnodes", "two", "distributed.nnodes must be an integer >= 1 or one of env, got 'two'"),
        ("distributed.nproc_per_node", 0, "distributed.nproc_per_node must be an integer >= 1 or one of gpu, got 0"),
        ("cls_recipe_overrides.epoch", 3, "cls_recipe_overrides.epoch is not a known parameter"),
        ("prepare_cls.other_copy", " ", "prepare_cls.other_copy must be null or a sentence: why archives without"),
        ("prepare_cls.other_copy", 5, "ImageNet's published MD5s are used, got 5"),
    ],
)
def test_a_bad_value_is_one_sentence_naming_key_value_and_fix(scales, path, value, message):
    params = copy.deepcopy(scales["embedded"])
    section, key = path.split(".")
    params[section][key] = value
    with pytest.raises(ParamsError) as err:
        validate(params)
    text = str(err.value)
    assert message in text and "python -m vcarepro.params.config" in text and "\n" not in text


@pytest.mark.parametrize(
    "branch, field, value, message",
    [
        ("cls_runs", "model", "deit_huge-vca", "cls_runs.deit_tiny-vca.model must name an entry of models"),
        ("cls_runs", "seeds", [], "cls_runs.deit_tiny-vca.seeds must be a non-empty list of distinct integers"),
        ("cls_runs", "seeds", [0, 0], "seeds must be a non-empty list of distinct integers"),
        ("gen_runs", "objective", "gan", "gen_runs.dit_s2-vca.objective must be ddpm or flow, got 'gan'"),
    ],
)
def test_runs_name_existing_models_distinct_seeds_and_known_objectives(scales, branch, field, value, message):
    params = copy.deepcopy(scales["embedded"])
    run = "deit_tiny-vca" if branch == "cls_runs" else "dit_s2-vca"
    params[branch][run][field] = value
    with pytest.raises(ParamsError, match=message.replace("[", r"\[").replace(".", r"\.")):
        validate(params)


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            {"arch": "deit_tiny", "attention": "vca", "vca": {"contrast_tokens": 16}},
            "models.deit_tiny-vca has vca (the attention's knobs now live under options:)",
        ),
        ({"arch": "deit_tiny", "attention": "linear"}, "models.deit_tiny-vca.attention must be one of mhsa, diff, vca"),
    ],
)
def test_model_entries_hold_a_known_attention_and_no_stray_keys(scales, spec, message):
    params = copy.deepcopy(scales["embedded"])
    params["models"]["deit_tiny-vca"] = spec  # an old-style entry would otherwise train the default VCA silently
    with pytest.raises(ParamsError, match=re.escape(message)):
        validate(params)


def test_a_stage_with_bad_params_exits_with_one_line_and_writes_nothing(tmp_path, scales):
    params = copy.deepcopy(scales["embedded"])
    params["prepare_cls"]["val_fraction"] = 1.5
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    result = subprocess.run(
        [sys.executable, str(ROOT / "stages" / "prepare_cls.py")], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 2  # a user error, as every other: run_stage's one `error:` line
    assert result.stderr.strip().splitlines() == [
        "error: params.yaml: prepare_cls.val_fraction must be a number > 0 and < 1, got 1.5; fix it in conf/ and run "
        "`python -m vcarepro.params.config`, or correct the -S override that set it."
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_named_recipes_are_complete_and_checked_and_runs_name_one(scales):
    params = copy.deepcopy(scales["paper"])
    params["cls_recipes"]["lab_swin_tiny"]["ema_decay"] = 1.5
    with pytest.raises(ParamsError, match=r"cls_recipes\.lab_swin_tiny\.ema_decay must be a number >= 0 and < 1"):
        validate(params)
    params = copy.deepcopy(scales["paper"])
    del params["cls_recipes"]["swin"]["crop_mode"]
    with pytest.raises(ParamsError, match=r"cls_recipes\.swin lacks crop_mode; every named recipe holds every knob"):
        validate(params)
    params = copy.deepcopy(scales["paper"])
    params["cls_runs"]["swin_tiny-vca"]["recipe"] = "lab"
    with pytest.raises(
        ParamsError,
        match=r"cls_runs\.swin_tiny-vca\.recipe must name an entry of cls_recipes "
        r"\(deit, pvt, swin, .*\), got 'lab'",
    ):
        validate(params)


def test_per_run_generation_overrides_are_checked_like_the_recipe(scales):
    params = copy.deepcopy(scales["paper"])
    params["gen_runs"]["dit_s2-vca"]["recipe"] = {"ema_decay": 1.5}
    with pytest.raises(ParamsError, match=r"gen_runs\.dit_s2-vca\.recipe\.ema_decay must be a number >= 0 and < 1"):
        validate(params)
    params["gen_runs"]["dit_s2-vca"]["recipe"] = {"epoch": 3}
    with pytest.raises(ParamsError, match=r"recipe\.epoch overrides nothing in gen_recipe"):
        validate(params)


def run_stage_on(project: Path, params: dict, script: str, *args: str):
    """``stages/<script>`` run for real in ``project`` (an empty directory) with ``params`` as its params.yaml,
    which it must leave as it was."""
    project.mkdir(parents=True, exist_ok=True)
    result = stage(project, script, *args, params=params)
    assert (project / "params.yaml").read_text() == yaml.safe_dump(params)
    return result


def only_params_left(where: Path) -> bool:
    return [str(p.relative_to(where)) for p in sorted(where.rglob("*"))] == ["project", "project/params.yaml"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "where, typo, script, run, sentence",
    [
        (
            "cls_shape",
            "embed_dimm",
            "train_cls.py",
            "deit_tiny-vca",  # the first run's model is timm's own DeiT
            "cls_shape.embed_dimm is not an argument of VisionTransformer (deit_tiny_patch16_224), the model of "
            "cls_runs.deit_tiny-mhsa (did you mean embed_dim?), which takes act_layer, attn_drop_rate, ",
        ),
        (
            "models.deit_tiny-vca.options",
            "local_convv",
            "train_cls.py",
            "deit_tiny-vca",
            "models.deit_tiny-vca.options.local_convv is not an argument of VcaVisionTransformer "
            "(vca_deit_tiny_patch16_224) with attention 'vca' (did you mean local_conv?), which takes apply_attn_drop, "
            "contrast_embed_init, contrast_tokens, local_conv, stage1, stage2, stage2_softmax, tokens_neg, "
            "tokens_pos; ",
        ),
        (
            "gen_shape",
            "hidden_sizee",
            "train_gen.py",
            "dit_s2-vca",
            "gen_shape.hidden_sizee is not an argument of DiT, the model of gen_runs.dit_s2-mhsa (did you mean "
            "hidden_size?), which takes contrast_tokens, depth, hidden_size, in_channels, input_size, mlp_ratio, "
            "num_classes, num_heads, patch_size; ",
        ),
    ],
    ids=["cls_shape", "models.options", "gen_shape"],
)
def test_a_misspelt_key_of_a_free_section_is_one_error_line_with_the_valid_names(
    tmp_path, scales, where, typo, script, run, sentence
):
    params = copy.deepcopy(scales["embedded"])
    *path, last = where.split(".")
    section = params
    for key in path + [last]:
        section = section.setdefault(key, {})
    section[typo] = 1  # today: TypeError: __init__() got an unexpected keyword argument, deep in the constructor
    result = run_stage_on(tmp_path / "project", params, script, "--run", run)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: params.yaml: "), result.stderr
    assert sentence in lines[0] and lines[0].endswith("or correct the -S override that set it.")
    assert only_params_left(tmp_path)  # nothing written before the check: no runs/, no checkpoints/


@pytest.mark.slow
@pytest.mark.parametrize("name", ["../../../evil", "a/b", "<script>", "a.b"])  # a.b: DVC reads cls_runs.a.b
def test_a_run_named_outside_the_safe_alphabet_is_refused_before_anything_is_written(tmp_path, scales, name):
    params = copy.deepcopy(scales["embedded"])
    params["cls_runs"] = {name: params["cls_runs"]["deit_tiny-vca"]}
    result = run_stage_on(tmp_path / "project", params, "train_cls.py", "--run", name)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"error: params.yaml: cls_runs has an entry named {name!r}; a name is 1 to 100 letters, digits, '_' or '-' "
        f"(starting with a letter or digit), since it becomes a directory and a DVC stage name; rename "
        f"it in conf/ and run `python -m vcarepro.params.config`."
    ]
    assert only_params_left(tmp_path)  # nothing nested under runs/, nothing beside or above the project


@pytest.mark.parametrize("section", ["models", "gen_runs", "cls_recipes", "calibrate.classifiers"])
def test_model_and_other_path_names_are_checked_too(scales, section):
    params = copy.deepcopy(scales["embedded"])
    entries = params
    for key in section.split("."):
        entries = entries[key]
    first = next(iter(entries))
    entries["../" + first] = entries.pop(first)
    with pytest.raises(ParamsError, match=re.escape(f"{section} has an entry named '../{first}'")):
        validate(params)


def test_a_models_arch_must_exist_and_the_library_refuses_an_unsafe_run_path_itself(scales):
    params = copy.deepcopy(scales["embedded"])
    params["models"]["deit_tiny-vca"]["arch"] = "deit_tiyn"
    with pytest.raises(
        ParamsError,
        match=r"models\.deit_tiny-vca\.arch must be one of .*, got 'deit_tiyn' "
        r"\(did you mean deit_tiny\?\)",
    ):
        validate(params)
    from vcarepro.core.errors import BadInput
    from vcarepro.params.runs import run_paths

    with pytest.raises(BadInput, match=r"run name '\.\./x' cannot become a directory"):
        run_paths("cls", "../x")


@pytest.mark.parametrize(
    "path, names",
    [
        ("sampling.labels", "LABEL_MODES"),
        ("sampling.flow_sampler", "FLOW_SAMPLERS"),
        ("sampling.flow_ode_method", "FLOW_ODE_METHODS"),
        ("gen_recipe.flow_path", "FLOW_PATHS"),
    ],
)
def test_a_generation_choice_is_one_of_the_names_module_list(scales, path, names):
    """The schema checks each choice against the torch-free names module's list, the one the code acts on."""
    from vcarepro.core import choices as names_module

    choices = getattr(names_module, names)
    section, key = path.split(".")
    for value in choices:
        params = copy.deepcopy(scales["embedded"])
        params[section][key] = value
        validate(params)
    params = copy.deepcopy(scales["embedded"])
    params[section][key] = "not-a-choice"
    with pytest.raises(ParamsError, match=re.escape(f"{path} must be one of {', '.join(choices)}, got 'not-a-choice'")):
        validate(params)


def test_a_run_objective_outside_the_names_module_list_fails(scales):
    from vcarepro.core.choices import OBJECTIVES

    params = copy.deepcopy(scales["embedded"])
    params["gen_runs"]["dit_s2-vca"]["objective"] = "gan"
    with pytest.raises(ParamsError, match=f"objective must be {' or '.join(OBJECTIVES)}, got 'gan'"):
        validate(params)


def test_a_calibration_digest_is_a_full_sha256_or_a_publishers_prefix_of_8_or_more_hex_digits():
    """The lengths calibration.check_digest takes: caught when params are read, not when the stage reaches it."""
    from vcarepro.params.config import compose

    params = compose([])
    for good in ("a1311bcf", "a" * 64, None):
        params["calibrate"]["classifiers"]["deit_tiny"]["sha256"] = good
        validate(params)
    for bad in ("a131", "a" * 65, "A1311BCF", "a1311bcg"):
        params["calibrate"]["classifiers"]["deit_tiny"]["sha256"] = bad
        with pytest.raises(ParamsError, match="sha256 must be null or a hexadecimal sha256 \\(64 digits\\)"):
            validate(params)


def test_every_mapping_of_params_is_a_strict_pydantic_model_that_forbids_unknown_keys_and_infinities():
    """Types, ranges and choices are pydantic's: no section coerces ("1" for 1, true for 1), none takes a key it does
    not declare, none takes NaN or an infinity; each value's field says, in its description, the words a refusal uses
    (the names a run or a model entry gives are checked against other sections instead)."""
    import typing

    from pydantic import BaseModel

    from vcarepro.params import schema

    def models_in(annotation):
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield annotation
        for arg in typing.get_args(annotation):
            yield from models_in(arg)

    seen, todo = set(), [schema.Params]
    while todo:
        model = todo.pop()
        seen.add(model)
        config = model.model_config
        assert (config["extra"], config["strict"], config["allow_inf_nan"]) == ("forbid", True, False), model
        for name, field in model.model_fields.items():
            nested = set(models_in(field.annotation))
            todo += nested - seen
            mapping = dict in {typing.get_origin(a) for a in (field.annotation, *typing.get_args(field.annotation))}
            if not nested and not mapping and field.annotation is not typing.Any:
                assert field.description, (model.__name__, name)
    assert {m.__name__ for m in seen} >= {"Params", "Cluster", "ClsRecipe", "GenRun", "CalibrationGenerator"}


@pytest.mark.parametrize(
    "path, value, message",
    [
        # a mapping where a number goes was passed over before (a mapping flattened to no key at all)
        (("cluster", "nodes"), {}, "cluster.nodes must be an integer >= 1, got {}"),
        (("cls_recipe_overrides", "lr"), {"x": 1}, "cls_recipe_overrides.lr must be a number > 0, got {'x': 1}"),
        # a section, a named recipe or a run that is not a mapping: said so, where a traceback or "not a known
        # parameter" came before
        (("numerics",), 5, "numerics must be a mapping holding cpu, gpu, threads, got 5"),
        (("cls_recipes", "deit"), 1, "cls_recipes.deit must be a mapping holding img_size, epochs, "),
        (("cls_runs", "deit_tiny-vca"), [0], "cls_runs.deit_tiny-vca must be a mapping holding model, recipe, seeds"),
        (("cls_runs",), 5, "cls_runs must be a mapping, got 5"),  # a traceback (int is not iterable) before
        # a string where a number goes is not read as one (strict)
        (("sampling", "num_samples"), "8", "sampling.num_samples must be an integer >= 1, got '8'"),
    ],
)
def test_a_value_of_the_wrong_kind_is_one_sentence_however_deep(scales, path, value, message):
    params = copy.deepcopy(scales["embedded"])
    node = params
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ParamsError) as err:
        validate(params)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
