"""Training steps: the smoke matrix's distinct runs at paper shape in their recipes' precision (part ``steps``), and
the preflight's step time and peak memory of the proxy and paper runs at the recipe's own batch (part ``cost``).

Each smoke run is resolved at the paper scale, so the recipe is the published one (fp16 with GradScaler,
tf32, ``compile``), through the preflight's steps. On a CPU the models shrink to :data:`TINY_SHAPES`,
keeping architecture and attention, so the same code paths run in seconds; nothing then is a GPU's figure.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from vcarepro.core.recipes import ClsRecipe, GenRecipe
from vcarepro.tools.gpu_check.parts import FAIL, PASS, Check, Outcome, one_line

# arch -> the shape overrides of a tiny model of it (a CPU check): the architecture's layout, a few channels
_POOLED = (9, 16, 4, 1)  # pooled tokens per stage on 64 px images (stage grids 16, 8, 4, 2)
_HIER = dict(img_size=64, depths=(1, 1, 1, 1), contrast_tokens=_POOLED)
_DEIT = dict(img_size=32, patch_size=8, depth=1, embed_dim=32, num_heads=2, contrast_tokens=4)
_DIT = dict(input_size=16, depth=1, hidden_size=32, num_heads=2)  # 16 x 16 latents: grids 8, 4 and 2
TINY_SHAPES: Dict[str, Dict[str, Any]] = {
    "deit_tiny": _DEIT,
    "deit_small": _DEIT,
    "pvt_tiny": dict(_HIER, embed_dims=(16, 16, 32, 32), num_heads=(1, 1, 2, 2)),
    "pvt_tiny_gap": dict(_HIER, embed_dims=(16, 16, 32, 32), num_heads=(1, 1, 2, 2)),
    "swin_tiny": dict(_HIER, depths=(1, 1, 2, 1), window_size=2, embed_dim=16, num_heads=(1, 1, 1, 1)),
    "cswin_tiny": dict(_HIER, embed_dim=16, num_heads=(2, 2, 2, 2)),
    "cswin_tiny_2418": dict(_HIER, embed_dim=16, num_heads=(2, 2, 2, 2)),
    **{f"dit_{size}{patch}": _DIT for size in ("s", "b", "l", "xl") for patch in (2, 4, 8)},
}
TINY_CLASSES = 10
TINY_BATCH = 2  # per device, even: the recipes that mix images need pairs
GPU_SMOKE_BATCH = 8  # the steps part checks that a step runs, in its precision; the cost part times the recipe's batch
AUTOCAST_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PAIR_SUFFIXES = ("-vca", "-mhsa")  # deit_tiny-vca beside deit_tiny-mhsa: the ratio the lab's GPU-weeks hang on


# ----------------------------------------------------------------------------- the runs


def composed(scale: str) -> Dict[str, Any]:
    """The scale's params, composed and checked as the preflight composes them (``scale=<scale>``, no override)."""
    from vcarepro.tools.preflight.cli import composed as preflight_composed

    return preflight_composed(scale, [])[1]


def distinct_key(branch: str, run) -> Tuple[str, str, str]:
    """(architecture, attention, recipe or objective): what makes two runs step different code."""
    return (run.model["arch"], run.model["attention"], run.recipe_name if branch == "cls" else run.objective)


def smoke_runs(smoke: Dict[str, Any], paper: Dict[str, Any]) -> List[Tuple[str, Any]]:
    """(branch, run) of each distinct (architecture, attention, recipe or objective) of the smoke scale, resolved at
    the paper scale: the published recipe, its precision and compile, the paper's shape."""
    from vcarepro.params.runs import cls_run, gen_run

    found: Dict[Tuple[str, str, str], Tuple[str, Any]] = {}
    for branch, resolve in (("cls", cls_run), ("gen", gen_run)):
        for name in smoke[f"{branch}_runs"]:
            run = resolve(paper, name)
            found.setdefault(distinct_key(branch, run), (branch, run))
    return list(found.values())


def compile_backend(recipe: ClsRecipe | GenRecipe, allowed: bool) -> Tuple[Optional[str], str]:
    """(the backend the step compiles with, or None; a note): the recipe's ``compile`` unless ``--no-compile``."""
    asked = recipe.compile
    if not asked or asked == "none":
        return None, "the recipe does not compile"
    if not allowed:
        return None, f"the recipe asks for torch.compile ({asked}); skipped (--no-compile)"
    return asked, f"torch.compile ({asked}), as the recipe asks"


def tiny(run, branch: str):
    """The run with its model shrunk to :data:`TINY_SHAPES` (and a classifier's images to that size)."""
    shape = dict(TINY_SHAPES[run.model["arch"]])
    if branch == "cls":
        return dataclasses.replace(
            run, shape=shape, recipe=run.recipe.model_copy(update={"img_size": shape["img_size"]})
        )
    return dataclasses.replace(run, shape=shape)


def _builder(branch: str):
    from vcarepro.tools.bench.train_step import classification_step, generation_step

    return classification_step if branch == "cls" else generation_step


def _closure(fn) -> Dict[str, Any]:
    """The variables a closure captured (the training step's ``amp``: its autocast and GradScaler)."""
    cells = getattr(fn, "__closure__", None) or ()
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in cells)))


def _first_linear(model: torch.nn.Module) -> Optional[torch.nn.Module]:
    return next((m for m in model.modules() if isinstance(m, torch.nn.Linear)), None)


def step_row(branch: str, run, check: Check, *, batch: int, repeats: int, backend: Optional[str], note: str):
    """One run stepped: its precision seen in the activations, its scaler, its compile, the median step time."""
    from vcarepro.tools.bench.timing import measure_step

    precision = run.recipe.precision
    row: Dict[str, Any] = {
        "id": run.name,
        "branch": branch,
        "arch": run.model["arch"],
        "attention": run.model["attention"],
        "recipe": run.recipe_name if branch == "cls" else None,
        "objective": run.objective if branch == "gen" else "classification",
        "precision": precision,
        "compile": backend,
        "compile_note": note,
        "batch": batch,
    }
    if check.tiny:
        run = tiny(run, branch)
    run = dataclasses.replace(run, recipe=run.recipe.model_copy(update={"compile": backend}))
    options = {"num_classes": TINY_CLASSES if check.tiny else 1000} if branch == "cls" else {}
    seen: List[torch.dtype] = []

    def build(b: int):
        step = _builder(branch)(run, batch=b, device=str(check.device), **options)
        linear = _first_linear(step.model) if backend is None else None  # a hook would be traced into the graph
        if linear is not None:
            linear.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        return step

    def read(step) -> None:
        scaler = getattr(_closure(step._step).get("amp"), "scaler", None)
        row["autocast_dtype"] = str(seen[0]).replace("torch.", "") if seen else None
        row["grad_scaler"] = bool(scaler is not None and scaler.is_enabled())
        row["loss_scale"] = float(scaler.get_scale()) if row["grad_scaler"] else None
        row["tf32_matmul"] = tf32_matmuls() if check.device.type == "cuda" else None
        row["finite"] = all(bool(torch.isfinite(p).all()) for p in step.model.parameters())

    try:
        # the warm-up (allocations, kernel selection, a compile where asked) is timed apart; at tiny sizes there is
        # none and the one step is timed: the path, not the figure
        measured = measure_step(build, batch, check.device, repeats=repeats, warmup=0 if check.tiny else 1, after=read)
        if measured.seconds is None:
            raise MemoryError(f"out of memory at every batch down to 1 (from {batch})")
        row["batch"] = measured.batch
        if measured.warmup_seconds:
            row["first_step_s"] = measured.warmup_seconds[0]
        row["step_ms"] = 1e3 * measured.seconds
        problems = precision_problems(precision, row, check.device.type)
        if not row["finite"]:
            problems.append("a parameter is not finite after the steps")
        if measured.out_of_memory_at is not None:
            problems.append(f"out of memory at batch {measured.out_of_memory_at}; stepped at {measured.batch}")
        row["status"] = FAIL if problems else PASS
        row["reason"] = "; ".join(problems) if problems else f"{precision}, {note}"
    except Exception as err:  # noqa: BLE001 - this run's failure is its row's; the other runs still step
        row["status"], row["reason"] = FAIL, one_line(err)
    return row


def tf32_matmuls() -> Optional[bool]:
    """Whether float32 matmuls run as TF32 now: the switch MixedPrecision sets, or (PyTorch >= 2.9) the newer API's
    ``fp32_precision``, which PyTorch refuses to read beside the old one once both have been set."""
    matmul = torch.backends.cuda.matmul
    try:
        return bool(matmul.allow_tf32)
    except RuntimeError:
        precision = getattr(matmul, "fp32_precision", None)
        return None if precision is None else precision == "tf32"


def precision_problems(precision: str, row: Dict[str, Any], device_type: str) -> List[str]:
    """What the step showed that its recipe's precision rules out: the activations' dtype, the scaler, TF32."""
    problems = []
    want = str(AUTOCAST_DTYPES[precision]).replace("torch.", "")
    if row.get("autocast_dtype") not in (None, want):
        problems.append(f"precision {precision} but the first linear layer computed in {row['autocast_dtype']}")
    if row.get("grad_scaler") != (precision == "fp16"):
        problems.append(f"precision {precision} but the GradScaler is {'on' if row.get('grad_scaler') else 'off'}")
    if device_type == "cuda" and precision in ("fp32", "tf32") and row.get("tf32_matmul") != (precision == "tf32"):
        problems.append(f"precision {precision} but TF32 matmuls are {'on' if row.get('tf32_matmul') else 'off'}")
    return problems


def steps_part(check: Check, outcome: Outcome) -> None:
    """Every distinct run of the smoke matrix, one warm-up and a few timed steps each, in its recipe's precision."""
    smoke, paper = composed("smoke"), composed("paper")
    runs = smoke_runs(smoke, paper)
    batch = check.options.get("smoke_batch") or (TINY_BATCH if check.tiny else GPU_SMOKE_BATCH)
    repeats = 1 if check.tiny else 3
    compiled = 0
    for done, (branch, run) in enumerate(runs):
        if check.out_of_time(outcome, done, len(runs), "runs"):
            return
        backend, note = compile_backend(run.recipe, check.compile)
        compiled += backend is not None
        check.log(f"steps: {run.name} ({run.recipe.precision})")
        outcome.rows.append(step_row(branch, run, check, batch=batch, repeats=repeats, backend=backend, note=note))
    precisions = sorted({r["precision"] for r in outcome.rows})
    outcome.summary = f"{len(outcome.rows)} distinct runs stepped at batch {batch} in {', '.join(precisions)}"
    outcome.data["compiled_by_recipe"] = compiled
    probe = compile_probe(check, outcome, runs, batch) if not compiled else None
    if probe is not None:
        outcome.rows.append(probe)


def compile_probe(check: Check, outcome: Outcome, runs, batch: int) -> Optional[Dict[str, Any]]:
    """No recipe compiles: one VCA classifier stepped under ``torch.compile`` (inductor) all the same, so a recipe
    that sets ``compile: inductor`` is known to work here. Not on a CPU (minutes of C++ compiling), nor with
    ``--no-compile``, nor with under a minute left."""
    why = None
    if not check.compile:
        why = "--no-compile"
    elif check.tiny:
        why = "tiny sizes (a CPU): inductor's C++ compile takes minutes"
    elif check.left() < 60:
        why = f"{max(check.left(), 0):.0f} s left of the share"
    if why:
        outcome.data["compile_probe"] = f"skipped: {why}"
        return None
    branch, run = next(((b, r) for b, r in runs if b == "cls" and r.model["attention"] == "vca"), runs[0])
    row = step_row(
        branch, run, check, batch=batch, repeats=2, backend="inductor", note="torch.compile (inductor): a probe"
    )
    row["id"] = f"{run.name} + torch.compile"
    row["probe"] = True
    outcome.data["compile_probe"] = f"{row['id']}: {row['status']}"
    return row


# ----------------------------------------------------------------------------- the preflight's cost


def _pairs(rows: Sequence[Dict[str, Any]]) -> Dict[str, float]:
    """``"<scale> <base>"`` -> step time with VCA / with MHSA, for each pair of runs measured at the same scale."""
    by = {(r["scale"], r["run"]): r for r in rows if r.get("step_ms")}
    ratios = {}
    for (scale, name), row in by.items():
        if name.endswith(PAIR_SUFFIXES[0]):
            base = name[: -len(PAIR_SUFFIXES[0])]
            twin = by.get((scale, base + PAIR_SUFFIXES[1]))
            if twin:
                ratios[f"{scale} {base}"] = row["step_ms"] / twin["step_ms"]
    return ratios


def cost_part(check: Check, outcome: Outcome) -> None:
    """The preflight's measurement of the proxy runs (one GPU) and of the same runs at the paper scale (its node's
    devices): the median of the timed steps after a warm-up and the peak memory, at the recipe's per-device batch,
    nothing scaled (a capped batch only at tiny sizes)."""
    from vcarepro.params.runs import cls_run, gen_run
    from vcarepro.tools.bench.timing import GIB, device_memory, throw_away_step
    from vcarepro.tools.preflight.branches import classification, generation, run_cost
    from vcarepro.tools.preflight.sizing import dataset, expected_classes

    proxy = composed("proxy")
    names = [*proxy["cls_runs"], *proxy["gen_runs"]]
    plan = [("proxy", proxy, 1), ("paper", composed("paper"), check.options.get("paper_devices") or 8)]
    memory = device_memory(check.device)
    repeats = check.options.get("steps") or (1 if check.tiny else 5)
    cap = TINY_BATCH if check.tiny else None
    total = len(names) * len(plan)
    for scale, params, devices in plan:
        cls = [tiny_if(check, "cls", cls_run(params, n)) for n in names if n in params["cls_runs"]]
        gen = [tiny_if(check, "gen", gen_run(params, n)) for n in names if n in params["gen_runs"]]
        branches = [
            classification(cls, dataset("cls", params, scale), num_classes=_classes(check, expected_classes(params))),
            dataclasses.replace(generation(gen, dataset("gen", params, scale)), samples=False),
        ]
        for branch in branches:
            if branch.runs and not check.tiny:  # the first step's one-time costs, not the first run's
                throw_away_step(branch.step, branch.runs[0], check.device)
            for run in branch.runs:
                if check.out_of_time(outcome, len(outcome.rows), total, "runs"):
                    return
                check.log(f"cost: {scale} {run.name}")
                row: Dict[str, Any] = {"id": f"{scale} {run.name}", "scale": scale, "run": run.name}
                try:
                    cost = run_cost(
                        branch, run, devices=devices, cap=cap, device=check.device, memory=memory, repeats=repeats
                    )
                    row.update(
                        model=cost.model,
                        recipe=cost.recipe,
                        precision=cost.precision,
                        devices=devices,
                        recipe_batch=cost.recipe_batch,
                        batch=cost.batch_run,
                        accum_steps=cost.accum_steps,
                        step_ms=_median_ms(cost.step_seconds_measured),
                        step_ms_each=[1e3 * s for s in cost.step_seconds_measured],
                        images_per_s=cost.batch_run / _median_ms(cost.step_seconds_measured) * 1e3
                        if cost.step_seconds_measured
                        else None,
                        peak_gib=None if cost.peak_bytes_measured is None else cost.peak_bytes_measured / GIB,
                        fits=cost.fits,
                        out_of_memory_at=cost.out_of_memory_at,
                    )
                    row["status"], row["reason"] = _cost_verdict(row, check.tiny, cost.problems)
                except Exception as err:  # noqa: BLE001 - this run's failure is its row's
                    row["status"], row["reason"] = FAIL, one_line(err)
                outcome.rows.append(row)
    ratios = _pairs(outcome.rows)
    outcome.data["vca_over_mhsa_step_time"] = ratios
    outcome.summary = f"{len(outcome.rows)} runs timed" + (
        "; VCA / MHSA step time: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()) if ratios else ""
    )


def _median_ms(seconds: Sequence[float]) -> Optional[float]:
    """The median of the timed steps at the batch that ran, in ms (a micro-step where the recipe accumulates)."""
    return 1e3 * statistics.median(seconds) if seconds else None


def tiny_if(check: Check, branch: str, run):
    return tiny(run, branch) if check.tiny else run


def _classes(check: Check, classes: int) -> int:
    return TINY_CLASSES if check.tiny else classes


def _cost_verdict(row: Dict[str, Any], tiny_sizes: bool, problems: List[str]) -> Tuple[str, str]:
    if row["batch"] is None:
        return FAIL, problems[0] if problems else "the run was sized, not stepped"
    if row["step_ms"] is None or not math.isfinite(row["step_ms"]):
        return FAIL, f"no step ran (out of memory at batch {row['out_of_memory_at']})"
    if row["out_of_memory_at"] is not None:
        return FAIL, (
            f"the recipe's per-device batch {row['recipe_batch']} ran out of memory at {row['out_of_memory_at']}; "
            f"measured at {row['batch']}"
        )
    if not tiny_sizes and row["batch"] != row["recipe_batch"]:
        return FAIL, f"measured at batch {row['batch']}, not the recipe's {row['recipe_batch']}"
    where = "capped batch, tiny model" if tiny_sizes else "the recipe's per-device batch"
    return PASS, f"{row['step_ms']:.1f} ms a step at {where} ({row['batch']})" + (
        f"; sizing: {problems[0]}" if problems else ""
    )
