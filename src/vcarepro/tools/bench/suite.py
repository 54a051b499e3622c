"""The benchmarks beyond one attention layer and the input path (:mod:`vcarepro.tools.bench.loader`): whole
models, activation memory, training-loop overhead and DVC's no-op time. Each returns plain rows; ``__main__`` prints
them and writes one JSON. Ratios are taken within one run: these machines are noisy.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence

import torch
import torch.nn as nn
from timm.layers import Attention

from vcarepro.attention import VisualContrastAttention
from vcarepro.tools.bench.timing import time_ms


def bench_models(
    img_sizes: Sequence[int] = (224, 448, 896), *, batch: int = 1, min_run_time: float = 1.0
) -> List[Dict[str, float]]:
    """Forward time of timm's DeiT-T against VCA-DeiT-T (49 contrast tokens) at growing image sizes."""
    import timm

    import vcarepro.models  # noqa: F401  (registers the VCA models with timm)

    rows = []
    for size in img_sizes:
        for name in ("deit_tiny_patch16_224", "vca_deit_tiny_patch16_224"):
            model = timm.create_model(name, img_size=size).eval()
            x = torch.randn(batch, 3, size, size)

            def forward(model=model, x=x):
                with torch.no_grad():
                    model(x)

            rows.append(
                {
                    "img_size": size,
                    "tokens": (size // 16) ** 2 + 1,
                    "model": name,
                    "forward_ms": time_ms(forward, min_run_time),
                }
            )
    return rows


def saved_activation_bytes(layer: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the tensors autograd keeps for the backward pass of one forward: the activation memory.

    The layer's own parameters, which autograd also keeps, are not activations and are
    left out; each distinct tensor storage is counted once.
    """
    params = {p.data_ptr() for p in layer.parameters()}
    seen = set()
    total = 0

    def pack(t: torch.Tensor):
        nonlocal total
        key = (t.data_ptr(), t.numel(), t.dtype)
        if t.data_ptr() not in params and key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x.requires_grad_())
    return total


def bench_attention_memory(
    sides: Sequence[int] = (14, 28, 56), *, dim: int = 192, heads: int = 3, batch: int = 8, contrast_tokens: int = 49
) -> List[Dict[str, float]]:
    """Activation memory of one attention layer against token count, MHSA (timm, fused) vs VCA.

    Counted from what autograd saves, so it is the same on any device. The math
    fallback of scaled_dot_product_attention on CPU saves its N x N maps; flash and
    memory-efficient kernels on GPUs save far less for MHSA, so on a GPU the gap is
    smaller than counted here.
    """
    rows = []
    for side in sides:
        layers = {
            "mhsa": Attention(dim, heads, qkv_bias=True),
            "vca": VisualContrastAttention(
                dim, heads, grid_size=side, num_prefix_tokens=0, contrast_tokens=contrast_tokens, qkv_bias=True
            ),
        }
        for name, layer in layers.items():
            x = torch.randn(batch, side * side, dim)
            rows.append({"tokens": side * side, "layer": name, "saved_mib": saved_activation_bytes(layer, x) / 2**20})
    return rows


def bench_train_loop(steps: int = 20, batch: int = 64) -> Dict[str, float]:
    """Images/s of our classification loop against a plain timm loop: same model, data, batch and device.

    Both read the same prepared digits through the same DataLoader settings (16 px,
    the embedded DeiT-T shape); ours adds the recipe's scheduler, EMA, logging and
    checkpointing. The plain loop is forward, loss, backward, AdamW step.
    """
    from timm.optim import create_optimizer_v2

    from vcarepro.data.embedded import export_digits
    from vcarepro.data.folders import ManifestDataset
    from vcarepro.params.config import compose
    from vcarepro.params.runs import cls_run
    from vcarepro.train.classification import ClassifierSpec, build_transforms, make_loader, train_classifier
    from vcarepro.train.distributed import DistInfo

    params = compose([])
    recipe = cls_run(params, "deit_tiny-mhsa").recipe.model_copy(
        update=dict(batch_size=batch, epochs=1000, eval_every=10**6, ema_decay=0.99)
    )
    info = DistInfo(0, 1, 0, torch.device("cpu"))
    spec = ClassifierSpec("deit_tiny", "mhsa", {}, params["cls_shape"])
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "cls"
        export_digits(root, val_fraction=0.2, seed=0)
        # ours, minus a final evaluation: steps x batch images
        started = time.perf_counter()
        train_classifier(
            spec=spec,
            recipe=recipe.model_copy(update={"epochs": 10**6}),
            data_root=root,
            seed=0,
            out_dir=Path(tmp) / "out",
            ckpt_dir=Path(tmp) / "ckpt",
            info=info,
            max_steps=steps,
            fingerprint="bench",
        )
        ours = time.perf_counter() - started
        # plain: the same model, data and optimizer, nothing else
        torch.manual_seed(0)
        model = spec.create(num_classes=10)
        optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
        loader = make_loader(
            ManifestDataset(root, "train", build_transforms(recipe, training=True)), recipe, info, training=True, seed=0
        )
        started, done = time.perf_counter(), 0
        while done < steps:
            for images, targets in loader:
                loss = nn.functional.cross_entropy(model(images), targets)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                done += 1
                if done == steps:
                    break
        plain = time.perf_counter() - started
    return {
        "steps": steps,
        "batch": batch,
        "ours_images_per_s": steps * batch / ours,
        "plain_images_per_s": steps * batch / plain,
        "overhead": ours / plain - 1.0,
    }


def bench_dvc_noop(repo: str | Path = ".") -> Dict[str, float]:
    """Seconds of `dvc status` and `dvc repro` when everything is up to date (run after a full `dvc repro`)."""
    dvc = shutil.which("dvc")
    if dvc is None:
        return {}
    pending = subprocess.run([dvc, "status", "--json"], cwd=repo, capture_output=True, text=True)
    if pending.returncode != 0 or pending.stdout.strip() not in ("{}", ""):
        return {"skipped": "the pipeline is not up to date; run `dvc repro` first, then the benchmark"}
    out = {}
    for command in ("status", "repro"):
        started = time.perf_counter()
        subprocess.run([dvc, command], cwd=repo, capture_output=True, check=True)
        out[f"dvc_{command}_s"] = time.perf_counter() - started
    return out
