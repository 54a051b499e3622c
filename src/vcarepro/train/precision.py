"""Numeric precision and compilation of a training step, from the recipe.

``precision`` is ``fp32``, ``tf32``, ``bf16`` or ``fp16`` (docs/paper-scale.md says what each sets); it applies
on whatever device the stage runs on, so a recipe says exactly what ran. ``compile`` is ``null`` or a
``torch.compile`` backend name.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Optional

import torch
import torch.nn as nn

from vcarepro.core.errors import BadInput

DTYPES = {"fp32": None, "tf32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class MixedPrecision:
    """Autocast context and gradient scaler for one ``precision`` on one device.

    The scaler is enabled only for fp16; disabled, ``scale`` / ``unscale_`` / ``step``
    pass through, so the training loop is written once for all three precisions.
    """

    def __init__(self, precision: str, device: torch.device):
        if precision not in DTYPES:
            raise BadInput(f"precision={precision!r} is unknown; use one of {', '.join(DTYPES)}.")
        self.precision = precision
        self.device = device
        self.dtype = DTYPES[precision]
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        if device.type == "cuda" and precision in ("fp32", "tf32"):  # process-wide switches; CPUs have no TF32
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"

    def autocast(self):
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def state_dict(self):
        return self.scaler.state_dict()

    def load_state_dict(self, state) -> None:
        if state:
            self.scaler.load_state_dict(state)


def slow_precision_note(precision: str, device: torch.device, knob: str) -> Optional[str]:
    """A sentence when ``precision`` is reduced on a CPU, where autocast is slower than fp32, else None.

    Measured on 2 CPU cores: DeiT-T at batch 8 took 20.3 s a step under fp16 autocast against 1.7 s in fp32.
    The recipe's precision is kept (it is what the run claims); ``knob`` is the override that changes it.
    """
    if device.type != "cpu" or precision not in ("fp16", "bf16"):
        return None
    return (
        f"precision={precision} autocast on a CPU runs about 12x slower than fp32 (DeiT-T, batch 8); "
        f"the recipe's precision is kept, set {knob}=fp32 for speed."
    )


def maybe_compile(module: nn.Module, backend: Optional[str]) -> nn.Module:
    """``torch.compile(module, backend=backend)``, or ``module`` itself when ``backend`` is null.

    The caller keeps the uncompiled module for state dicts (a compiled wrapper prefixes
    every key with ``_orig_mod.``).
    """
    if not backend or backend == "none":  # "none": how an override switches a recipe's compile off
        return module
    return torch.compile(module, backend=backend)
