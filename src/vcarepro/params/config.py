"""The pipeline's parameters.

``conf/`` is the source (Hydra: ``conf/config.yaml`` holds the paper's recipes and
run list, the ``scale`` group adapts them); ``params.yaml`` is its composition,
which DVC reads and tracks. ``dvc exp run -S scale=paper`` recomposes it through
DVC's Hydra integration; ``python -m vcarepro.params.config [overrides...]`` does the same
for ``dvc repro``. A test keeps the committed ``params.yaml`` equal to the default
composition.

Bad input is refused where it enters, as one sentence with exit status 2 and ``params.yaml`` left as it was: an
unknown option of a config group (``scale=huge``), an override of a key the composition lacks, and whatever the
schema refuses (:func:`vcarepro.params.schema.validate`: an unknown or missing key, a bad value, an unsafe run name),
naming the file in conf/ (or the command-line override) that set it. The stages check the same schema on the
``params.yaml`` that ``dvc exp run -S`` composes (:func:`stage_params`).
"""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import yaml

from vcarepro.core.errors import USER_ERROR_STATUS, BadInput, MissingInput, UnknownName, UserError
from vcarepro.params.composing import own_composition
from vcarepro.params.schema import ParamsError, flatten, validate  # noqa: F401  (flatten re-exported: the params code reads it here)

REPO_ROOT = Path(__file__).resolve().parents[3]


def load_params(path: str | Path = "params.yaml") -> Dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise MissingInput(f"{path} not found; run the stage from the repository root, where params.yaml lives.")
    with path.open() as f:
        params = yaml.safe_load(f) or {}
    if not isinstance(params, dict):
        raise BadInput(f"{path} must hold a mapping of parameter sections, not {type(params).__name__}.")
    return params


def stage_params(path: str | Path = "params.yaml") -> Dict[str, Any]:
    """params.yaml for a stage: loaded and validated against :mod:`vcarepro.params.schema`.

    A bad value stops the stage before it writes anything: the schema's :class:`~vcarepro.params.schema.ParamsError`
    is a user error, which the stage's ``run_stage`` prints as one ``error:`` line with exit status 2.
    """
    params = load_params(path)
    validate(params, _stage_source(str(path), params))
    return params


def section(params: Dict[str, Any], name: str) -> Any:
    try:
        return params[name]
    except KeyError:
        raise UnknownName(
            f"params.yaml has no '{name}' section; regenerate it with `python -m vcarepro.params.config`."
        ) from None


REASONS = "why"  # a mapping beside the knobs it explains, in any conf/ mapping: {knob: reason}; never in params.yaml


def strip_reasons(cfg: Any) -> Any:
    """``cfg`` (Hydra's composition, an OmegaConf node) without its ``why:`` mappings, in place.

    conf/ keeps the reason for a value as data beside it (``why: {lr: "..."}`` next to ``lr:``) for ``vcarepro
    explain``, which reads it from the file that set the value. params.yaml never holds one: DVC would record the
    text among a stage's params, and a reworded reason would re-run the stage. Both writers of params.yaml strip
    them: :func:`write_params` and, inside ``dvc exp run``, :mod:`vcarepro.params.dvc_compose`.
    """
    from omegaconf import DictConfig, ListConfig, open_dict

    if isinstance(cfg, DictConfig):
        for key in list(cfg.keys()):
            if key == "hydra":
                continue
            node = cfg._get_node(key)
            if key == REASONS and isinstance(node, DictConfig):
                with open_dict(cfg):
                    del cfg[key]
            elif isinstance(node, (DictConfig, ListConfig)):
                strip_reasons(node)
    elif isinstance(cfg, ListConfig):
        for index in range(len(cfg)):
            node = cfg._get_node(index)
            if isinstance(node, (DictConfig, ListConfig)):
                strip_reasons(node)
    return cfg


def conf_reasons(tree: Any) -> Dict[Tuple[str, ...], Tuple[str, Any]]:
    """Every ``why:`` of a conf file's ``tree`` (as :func:`_conf_files` gives it): the key path it explains ->
    (the reason on one line, the value the file sets beside it). ``vcarepro explain`` and the report read these."""
    found: Dict[Tuple[str, ...], Tuple[str, Any]] = {}

    def walk(node: Any, path: Tuple[str, ...]) -> None:
        if not isinstance(node, dict):
            return
        reasons = node.get(REASONS)
        for key, text in (reasons if isinstance(reasons, dict) else {}).items():
            if isinstance(text, str) and text.strip() and key in node:
                found[(*path, str(key))] = (" ".join(text.split()), node[key])
        for key, sub in node.items():
            if key != REASONS:
                walk(sub, (*path, str(key)))

    walk(tree, ())
    return found


def reason(tree: Any, path: Tuple[Any, ...]) -> Optional[str]:
    """The ``why:`` a conf file's ``tree`` holds beside ``path``, else None."""
    held = conf_reasons(tree).get(tuple(path))
    return held[0] if held else None


def _hydra_config(overrides: Sequence[str], config_dir: str | Path):
    """Hydra's composition of ``config_dir`` (interpolations resolved); a Hydra error is one :class:`ParamsError`."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    config_dir = Path(config_dir).resolve()
    check_group_choices(list(overrides), config_dir)
    try:
        with own_composition(), initialize_config_dir(str(config_dir), version_base=None):
            cfg = hydra_compose(config_name="config", overrides=list(overrides))
        OmegaConf.resolve(strip_reasons(cfg))
    except (HydraException, OmegaConfBaseException) as err:
        raise _composition_error(err, list(overrides), config_dir) from None
    return cfg


def project_root() -> Path:
    """Where conf/ and dvc.yaml are read: the working directory where it has conf/ (as DVC composes), else this
    code's checkout."""
    return Path.cwd() if Path("conf").is_dir() else REPO_ROOT


def compose(overrides: Sequence[str] = (), config_dir: str | Path = REPO_ROOT / "conf") -> Dict[str, Any]:
    """The Hydra composition of ``conf/`` with ``overrides`` (e.g. ``["scale=paper"]``), as DVC makes it."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(_hydra_config(overrides, config_dir), resolve=True)


def write_params(
    overrides: Sequence[str] = (), out: str | Path = "params.yaml", config_dir: str | Path = REPO_ROOT / "conf"
) -> None:
    """Compose, validate, and only then write params.yaml (atomically).

    The bytes are those of DVC's own Hydra dumper (``dvc.utils.hydra.compose_and_dump``: ``OmegaConf.to_yaml``
    of the resolved composition), so ``dvc exp run -S`` and this command write the same file. A refusal is a
    :class:`ParamsError` naming the key and the file in conf/ or the override that set it; ``out`` is untouched.
    """
    from omegaconf import OmegaConf

    from vcarepro.core.io import write_bytes

    cfg = _hydra_config(overrides, config_dir)
    validate(OmegaConf.to_container(cfg), _conf_source(list(overrides), Path(config_dir).resolve()))
    write_bytes(out, OmegaConf.to_yaml(cfg).encode("utf-8"))


# ----------------------------------------------------------------------------- where a key came from

_ABSENT = object()


def _lookup(tree: Any, path: Tuple[Any, ...]) -> Any:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return _ABSENT
        tree = tree[key]
    return tree


def _parse(overrides: Sequence[str]) -> list:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(list(overrides))


def _is_group(override, config_dir: Path) -> bool:
    return (config_dir / override.key_or_group).is_dir()


def _conf_files(overrides: Sequence[str], config_dir: Path) -> List[Tuple[str, Dict[str, Any]]]:
    """Each conf file of the composition, in Hydra's merge order, as (its name, what it sets at its package)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    with initialize_config_dir(str(config_dir), version_base=None):
        loader = GlobalHydra.instance().config_loader()
        defaults = loader.compute_defaults_list("config", list(overrides), RunMode.RUN).defaults
    files = []
    for entry in defaults:
        path = config_dir / f"{entry.config_path}.yaml"
        if entry.config_path is None or entry.config_path.startswith("hydra/") or not path.is_file():
            continue
        tree = yaml.safe_load(path.read_text()) or {}
        tree.pop("defaults", None)
        for part in reversed((entry.package or "").split(".") if entry.package else []):
            tree = {part: tree}
        files.append((f"{config_dir.name}/{entry.config_path}.yaml", tree))
    return files


def _locate(
    files: List[Tuple[str, Dict[str, Any]]], path: Tuple[Any, ...], params: Dict[str, Any], same_value: bool
) -> Optional[str]:
    """The file that set ``path``: the last to hold it (with the value params holds, if ``same_value``), else,
    for a key that is missing, the first to hold its entry."""
    value = _lookup(params, path)
    for name, tree in reversed(files):
        held = _lookup(tree, path)
        if held is not _ABSENT and (not same_value or value is _ABSENT or held == value):
            return name
    if value is _ABSENT:
        for cut in range(len(path) - 1, 1, -1):
            for name, tree in files:
                if _lookup(tree, path[:cut]) is not _ABSENT:
                    return name
    return None


def _conf_source(overrides: List[str], config_dir: Path) -> Callable[[Tuple[Any, ...]], str]:
    """For :func:`vcarepro.params.schema.validate`: the command-line override, else the conf file, that set a key."""

    def source(path: Tuple[Any, ...]) -> str:
        for override in reversed(_parse(overrides)):
            if override.is_delete() or _is_group(override, config_dir):
                continue
            keys = tuple(override.key_or_group.split("."))
            if keys == path[: len(keys)] or path == keys[: len(path)]:
                return f"the command-line override `{override.input_line}`"
        params = compose(overrides, config_dir)
        return (
            _locate(_conf_files(overrides, config_dir), path, params, same_value=False)
            or f"the composition of {config_dir.name}/"
        )

    return source


def _stage_source(name: str, params: Dict[str, Any]) -> Callable[[Tuple[Any, ...]], str]:
    """For a stage: ``name`` (params.yaml), and the conf file that sets the key to the value params.yaml holds,
    where one does (``dvc exp run -S`` composes params.yaml from conf/ and the overrides, which it does not keep)."""

    def source(path: Tuple[Any, ...]) -> str:
        try:
            config_dir = REPO_ROOT / "conf"
            scale = params.get("scale")
            groups = [f"scale={scale}"] if (config_dir / "scale" / f"{scale}.yaml").is_file() else []
            found = _locate(_conf_files([*groups, "family=all"], config_dir), path, params, same_value=True)
        except Exception:  # naming the file is a courtesy: never let it hide the refusal itself
            found = None
        return f"{name} (as {found} sets it)" if found else name

    return source


CONFIG_RERUN = "run `python -m vcarepro.params.config` again"  # the fix's last step where this module composes


def _composition_error(
    err: Exception,
    overrides: List[str],
    config_dir: Path,
    *,
    rerun: str = CONFIG_RERUN,
    by_name: str = "the command-line override",
) -> ParamsError:
    """Hydra's (or OmegaConf's) refusal of a composition as one sentence naming the override or file and the fix.

    ``rerun`` is the command that composes again and ``by_name`` what an override is called where it was given
    (:mod:`vcarepro.params.dvc_compose` passes DVC's: ``dvc exp run`` and ``-S``)."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    conf = config_dir.name
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if isinstance(err, OverrideParseException):
        bad = next((o for o in overrides if not _parses(o)), " ".join(overrides))
        return ParamsError(
            f"{by_name} `{bad}` is not Hydra's override syntax (key=value, "
            f"+key=value to add a key, group=option); fix it and {rerun}."
        )
    if isinstance(err, MissingConfigException) and err.options is not None and err.missing_cfg_file:
        group, _, option = err.missing_cfg_file.rpartition("/")
        by = next((o.input_line for o in _parse(overrides) if o.key_or_group == group), None)
        parent = re.match(r"In '([^']+)'", str(err))
        where = f"{by_name} `{by}`" if by else f"{conf}/{parent.group(1)}.yaml" if parent else f"{conf}/"
        return _no_option(where, group, option, list(err.options), conf)
    cause = err.__cause__
    full_key = getattr(cause, "full_key", None)
    if isinstance(err, ConfigCompositionException) and full_key and str(err).startswith("Could not override"):
        by = next((o.input_line for o in _parse(overrides) if o.key_or_group == full_key), full_key)
        groups = [o.input_line for o in _parse(overrides) if _is_group(o, config_dir)]
        close = _nearest_key(full_key, list(flatten(compose(groups, config_dir))))
        return ParamsError(
            f"{by_name} `{by}`: {full_key} is not a key of the composition of {conf}/"
            + (f" (did you mean {close[0]}?)" if close else "")
            + "; fix its spelling (a new entry of a free section such as cls_runs takes a leading +) "
            f"and {rerun}."
        )
    parent = re.match(r"In '([^']+)': (.*)", first_line)
    where, what = (f"{conf}/{parent.group(1)}.yaml", parent.group(2)) if parent else (f"{conf}/", first_line)
    return ParamsError(f"{where} cannot be composed: {what.rstrip('.')}; fix it and {rerun}.")


def _no_option(where: str, group: str, option: str, options: List[str], conf: str) -> ParamsError:
    close = difflib.get_close_matches(option, options, n=1)
    return ParamsError(
        f"{where}: {group} has no option {option!r}"
        + (f" (did you mean {close[0]}?)" if close else "")
        + f"; choose one of {', '.join(options)} ({conf}/{group}/*.yaml)."
    )


def check_group_choices(overrides: List[str], config_dir: Path, by_name: str = "the command-line override") -> None:
    """Refuse an override that picks a config group's option by anything but one of its files' names: Hydra would
    follow ``scale=../../params`` to a file outside conf/ and record it as the default."""
    from hydra.errors import OverrideParseException

    try:
        parsed = _parse(overrides)
    except OverrideParseException:  # Hydra names a syntax error itself, in the composition that follows
        return
    for override in parsed:
        folder = config_dir / override.key_or_group
        value = override.value()
        if override.is_delete() or not folder.is_dir() or value is None:
            continue
        options = sorted(f.stem for f in folder.glob("*.yaml"))
        for option in value if isinstance(value, list) else [value]:
            if str(option) not in options:
                where = f"{by_name} `{override.input_line}`"
                raise _no_option(where, override.key_or_group, str(option), options, config_dir.name)


def _nearest_key(full_key: str, valid: List[str]) -> List[str]:
    """The valid key nearest ``full_key``: among its siblings by name, else one whose last part is near its last
    part (a whole dotted key compared with difflib would match a long shared prefix, not the misspelt name)."""
    parent, _, leaf = full_key.rpartition(".")
    siblings = [key for key in valid if key.rpartition(".")[0] == parent]
    close = difflib.get_close_matches(full_key, siblings, n=1)
    if close:
        return close
    leaves = difflib.get_close_matches(leaf, sorted({key.rpartition(".")[2] for key in valid}), n=1, cutoff=0.8)
    near = [key for key in valid if leaves and key.rpartition(".")[2] == leaves[0]]
    return difflib.get_close_matches(full_key, near, n=1, cutoff=0.0)


def _parses(override: str) -> bool:
    from hydra.errors import OverrideParseException

    try:
        _parse([override])
    except OverrideParseException:
        return False
    return True


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m vcarepro.params.config [overrides...]``: write params.yaml, or refuse with one ``error:`` line and 2.

    Run from the repository root, as DVC composes: the conf/ there (the package's own where there is none).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print("usage: vcarepro config [KEY=VALUE | +KEY=VALUE | GROUP=OPTION ...]\n\n" + __doc__.split("\n\n", 1)[1])
        return 0
    try:
        write_params(argv, config_dir=project_root() / "conf")
    except UserError as err:  # the stages' convention (vcarepro.core.errors.run_stage)
        print(f"error: {err}", file=sys.stderr, flush=True)
        return USER_ERROR_STATUS
    return 0


if __name__ == "__main__":
    sys.exit(main())
