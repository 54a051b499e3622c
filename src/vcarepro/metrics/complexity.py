"""Parameters, FLOPs and throughput of a model, measured rather than quoted.

FLOPs are counted under the math SDPA backend: the fused CPU kernels are invisible to ``FlopCounterMode``,
which would silently drop every attention product. ``macs`` (half the counter's FLOPs) is what the paper's
tables call FLOPs. FFTs, unseen by the counter, add 5 n log2 n flops per complex transform of n points.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Optional

import torch
import torch.nn as nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


@dataclass(frozen=True)
class FlopCount:
    flops: int  # as torch's counter reports: 2 per multiply-accumulate
    by_operator: Dict[str, int]

    @property
    def macs(self) -> int:
        return self.flops // 2


def count_flops(fn: Callable[[], object]) -> FlopCount:
    """FLOPs of one call of ``fn`` (forward only unless ``fn`` runs backward), math SDPA kernel.

    torch's counter ignores FFTs; Circulant Attention's are counted at the usual 5 n log2 n
    flops per complex transform (``attention.circulant.flop_counter_mapping``).
    """
    from vcarepro.attention.circulant import flop_counter_mapping

    counter = FlopCounterMode(display=False, custom_mapping=flop_counter_mapping())
    with sdpa_kernel(SDPBackend.MATH), counter:
        fn()
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return FlopCount(flops=int(counter.get_total_flops()), by_operator=by_op)


@contextmanager
def inference(model: nn.Module) -> Iterator[None]:
    """Eval mode and no grad for the block; the model's own mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def model_flops(model: nn.Module, input_shape, device: Optional[torch.device] = None) -> FlopCount:
    """Forward FLOPs of ``model`` on one input of ``input_shape`` (batch included)."""
    device = device or next(model.parameters()).device
    x = torch.zeros(input_shape, device=device)
    with inference(model):
        return count_flops(lambda: model(x))


def throughput(
    model: nn.Module, input_shape, *, warmup: int = 2, iters: int = 5, device: Optional[torch.device] = None
) -> float:
    """Inference images per second at ``input_shape`` (batch first), eval mode, no grad."""
    device = device or next(model.parameters()).device
    x = torch.randn(input_shape, device=device)
    with inference(model):
        for _ in range(warmup):
            model(x)
        _sync(device)
        start = time.perf_counter()
        for _ in range(iters):
            model(x)
        _sync(device)
        elapsed = time.perf_counter() - start
    return input_shape[0] * iters / elapsed


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def classifier_complexity(
    arch: str,
    attention: str,
    options: Optional[dict] = None,
    *,
    img_size: int = 224,
    num_classes: int = 1000,
    throughput_batch: int = 0,
) -> Dict[str, float]:
    """Parameters (M), GMACs and, if ``throughput_batch`` > 0, inference images/s of one classifier."""
    from vcarepro.models import create_classifier

    model = create_classifier(arch, attention, img_size=img_size, num_classes=num_classes, **(options or {}))
    figures = {
        "params_m": count_parameters(model) / 1e6,
        "gmacs": model_flops(model, (1, 3, img_size, img_size)).macs / 1e9,
    }
    if throughput_batch > 0:
        figures["throughput_img_s"] = throughput(model, (throughput_batch, 3, img_size, img_size))
    return figures


def generator_complexity(
    arch: str,
    attention: str,
    options: Optional[dict] = None,
    *,
    latent_size: int = 32,
    latent_channels: int = 4,
    num_classes: int = 1000,
    throughput_batch: int = 0,
) -> Dict[str, float]:
    """Parameters (M), GMACs of one denoiser call and, if asked, samples/s of that call, for a DiT/SiT backbone."""
    from vcarepro.models.dit import create_dit

    model = create_dit(
        arch,
        attention,
        input_size=latent_size,
        in_channels=latent_channels,
        num_classes=num_classes,
        attention_options=options,
    )
    model.eval()

    def call(batch: int):
        x = torch.zeros(batch, latent_channels, latent_size, latent_size)
        t = torch.full((batch,), 500, dtype=torch.long)
        y = torch.zeros(batch, dtype=torch.long)
        return lambda: model(x, t, y)

    with torch.no_grad():
        # trainable parameters: DiT keeps its fixed sin-cos pos_embed as a frozen Parameter, which
        # the DiT paper's 32.87M (S/2) / 130.3M (B/2) do not count
        figures = {
            "params_m": count_parameters(model, trainable_only=True) / 1e6,
            "gmacs": count_flops(call(1)).macs / 1e9,
        }
        if throughput_batch > 0:
            fn = call(throughput_batch)
            fn()
            start = time.perf_counter()
            for _ in range(3):
                fn()
            figures["throughput_img_s"] = 3 * throughput_batch / (time.perf_counter() - start)
    return figures


def model_complexity(spec: Dict[str, object], settings: Dict[str, object]) -> Dict[str, float]:
    """Complexity of a params.yaml model spec at the paper's shape given by ``settings`` (params ``complexity``)."""
    arch, attention, options = spec["arch"], spec["attention"], spec.get("options") or None
    if str(arch).startswith("dit_"):
        return generator_complexity(
            arch,
            attention,
            options,
            latent_size=settings["gen_latent_size"],
            latent_channels=settings["gen_latent_channels"],
            num_classes=settings["gen_num_classes"],
            throughput_batch=settings["throughput_batch"],
        )
    return classifier_complexity(
        arch,
        attention,
        options,
        img_size=settings["cls_img_size"],
        num_classes=settings["cls_num_classes"],
        throughput_batch=settings["throughput_batch"],
    )
