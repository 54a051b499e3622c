"""The pipeline's parameters.

``conf/`` is the source (Hydra: ``conf/config.yaml`` holds the paper's recipes and
run list, the ``scale`` group adapts them); ``params.yaml`` is its composition,
which DVC reads and tracks. ``dvc exp run -S scale=paper`` recomposes it through
DVC's Hydra integration; ``python -m vcarepro.config [overrides...]`` does the same
for ``dvc repro``. A test keeps the committed ``params.yaml`` equal to the default
composition.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, Sequence

import yaml
from vcarepro.errors import BadInput, MissingInput, UnknownName
from vcarepro.schema import flatten, validate  # noqa: F401  (flatten re-exported: the params code reads it here)

REPO_ROOT = Path(__file__).resolve().parents[2]


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
    """params.yaml for a stage: loaded and validated against :mod:`vcarepro.schema`.

    A bad value stops the stage before it writes anything: the schema's :class:`~vcarepro.schema.ParamsError`
    is a user error, which the stage's ``run_stage`` prints as one ``error:`` line with exit status 2.
    """
    params = load_params(path)
    validate(params, str(path))
    return params


def section(params: Dict[str, Any], name: str) -> Any:
    try:
        return params[name]
    except KeyError:
        raise UnknownName(f"params.yaml has no '{name}' section; regenerate it with `python -m vcarepro.config`.") from None


def compose(overrides: Sequence[str] = (), config_dir: str | Path = REPO_ROOT / "conf") -> Dict[str, Any]:
    """The Hydra composition of ``conf/`` with ``overrides`` (e.g. ``["scale=paper"]``), as DVC makes it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(str(Path(config_dir).resolve()), version_base=None):
        cfg = hydra_compose(config_name="config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


def write_params(overrides: Sequence[str] = (), out: str | Path = "params.yaml",
                 config_dir: str | Path = REPO_ROOT / "conf") -> None:
    """Compose and write params.yaml with DVC's own Hydra dumper, so both produce the same bytes."""
    from dvc.utils.hydra import compose_and_dump

    compose_and_dump(out, str(Path(config_dir).resolve()), None, "config", "", list(overrides))


if __name__ == "__main__":
    write_params(sys.argv[1:])
