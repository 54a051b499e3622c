"""``dvc exp run -S`` refuses a bad override in the project's own sentence, before any stage runs.

docs/troubleshooting.md shows the refusals. DVC loads ``hydra_plugins/vcarepro_params.py`` before it composes
conf/; it calls :func:`install`, which wraps Hydra's ``ConfigLoaderImpl.load_configuration`` for this checkout's
conf/ only. A refusal is a ``DvcException`` (one ``ERROR:`` line, no support footer). Hydra's loader is
private: where a release lacks it, :func:`install` does nothing and the stages still refuse params.yaml.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

DVC_RERUN = "run `dvc exp run` again"
DVC_OVERRIDE = "the -S override"


def install(checkout: Path) -> bool:
    """Wrap Hydra's loader for compositions of ``checkout``/conf; False where this Hydra has no such loader."""
    try:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
    except ImportError:
        return False
    conf = (Path(checkout) / "conf").resolve()
    original = getattr(ConfigLoaderImpl.load_configuration, "vcarepro_original", ConfigLoaderImpl.load_configuration)
    wrapped: Dict[Path, Any] = getattr(ConfigLoaderImpl.load_configuration, "vcarepro_confs", {})
    wrapped[conf] = True

    def load_configuration(self, config_name, overrides, run_mode, *args, **kwargs):
        from vcarepro.params.composing import OWN_COMPOSITION

        own = None if OWN_COMPOSITION else _composes(self, wrapped)
        if own is None:
            return original(self, config_name, overrides, run_mode, *args, **kwargs)
        return checked(lambda extra: original(self, config_name, extra, run_mode, *args, **kwargs), overrides, own)

    load_configuration.vcarepro_original = original
    load_configuration.vcarepro_confs = wrapped
    ConfigLoaderImpl.load_configuration = load_configuration
    return True


def _composes(loader, confs: Dict[Path, Any]) -> Optional[Path]:
    """The conf/ directory of ours that ``loader`` composes from, else None."""
    for element in getattr(getattr(loader, "config_search_path", None), "get_path", lambda: [])():
        where = element.path or ""
        if where.startswith("file://") or where.startswith("/"):  # Hydra keeps a config_dir as a plain path
            path = Path(where[len("file://") :] if where.startswith("file://") else where).resolve()
            if path in confs:
                return path
    return None


def refusal(sentence: str) -> Exception:
    """``sentence`` as the exception DVC prints as one line (a DvcException), or a plain one outside DVC."""
    try:
        from dvc.exceptions import DvcException
    except ImportError:
        from vcarepro.params.schema import ParamsError

        return ParamsError(sentence)
    return DvcException(sentence)


def checked(load, overrides: List[str], conf: Path):
    """``load(overrides)``, Hydra's composition, refused in our sentence where Hydra or the schema refuses it."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from vcarepro.params import config

    try:
        config.check_group_choices(list(overrides), conf, by_name=DVC_OVERRIDE)
        cfg = load(list(overrides))
    except config.ParamsError as err:
        raise refusal(str(err)) from None
    except (HydraException, OmegaConfBaseException) as err:
        with _aside():
            error = config._composition_error(err, list(overrides), conf, rerun=DVC_RERUN, by_name=DVC_OVERRIDE)
        raise refusal(str(error)) from None
    config.strip_reasons(cfg)  # conf/'s `why:` mappings, as vcarepro.params.config.write_params leaves them out
    _validate(cfg, overrides, conf)
    return cfg


def _validate(cfg, overrides: List[str], conf: Path) -> None:
    from omegaconf import OmegaConf

    from vcarepro.params import config
    from vcarepro.params.schema import DVC_FIX, FIX, ParamsError, validate

    # Hydra's own node holds values only a running app fills in (hydra.job.num): left out, as Hydra's compose() does
    params = {}
    for key in cfg:
        if key != "hydra":
            node = cfg[key]
            params[key] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    try:
        with _aside():
            validate(params, config._conf_source(list(overrides), conf), model_classes=False)
    except ParamsError as err:
        sentence = str(err).replace(FIX, DVC_FIX).replace("the command-line override", DVC_OVERRIDE)
        raise refusal(sentence) from None


@contextmanager
def _aside() -> Iterator[None]:
    """Hydra's global state set aside while :mod:`vcarepro.params.config` composes on its own (it initializes
    Hydra itself, which Hydra refuses inside DVC's ``initialize_config_dir``), then put back."""
    from hydra.core.global_hydra import GlobalHydra

    state = GlobalHydra.instance()
    held = state.hydra if state.is_initialized() else None
    state.clear()
    try:
        from vcarepro.params.composing import own_composition

        with own_composition():
            yield
    finally:
        state.clear()
        if held is not None:
            state.initialize(held)
