"""vca-repro: Visual-Contrast Attention and the pipeline that reproduces its paper.

``import vcarepro`` loads neither torch nor timm: the package face names only its folders, one floor each
(a module imports its own floor or lower; tests/test_imports.py reads the floors from each folder's
``FLOOR``)::

    core/         0  errors, atomic writes and digests, the numerics profile, progress lines, names of choices,
                     stopping child processes
    attention/    1  the attention layers (VCA and its family)
    data/         1  the datasets' on-disk layout and sources
    models/       2  the timm models; importing vcarepro.models registers them with timm
    train/        3  training, sampling, checkpoints, the distributed launcher
    metrics/      3  top-1, FID and its sampling protocol, complexity, intervals
    params/       4  params.yaml onto the library: compose, schema, run specs, provenance, stage facts
    calibration/  5  released checkpoints through our evaluation path
    report/       5  the report: reads files only
    tools/        6  what a user runs by hand: vcarepro (cli), preflight, cluster, lockcheck, standins, export, bench

``timm.create_model("vca_deit_tiny_patch16_224")`` works after ``import vcarepro.models``;
``vcarepro.VisualContrastAttention`` imports the layer on first use.
"""

__version__ = "0.1.0"
__all__ = ["VisualContrastAttention"]


def __getattr__(name: str):
    if name == "VisualContrastAttention":  # the layer, loaded (with torch) only when asked for
        from vcarepro.attention.vca import VisualContrastAttention

        return VisualContrastAttention
    raise AttributeError(f"module 'vcarepro' has no attribute {name!r}")
