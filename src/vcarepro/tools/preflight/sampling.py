"""What sampling a generation run costs: the real sampler's forward passes counted on a stand-in model, one forward
pass of the trained model timed at the sampling batch, and from both the device-hours of every seed's samples."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

import torch

from vcarepro.tools.bench.timing import timed


class _CountingModel(torch.nn.Module):
    """A stand-in DiT for counting the sampler's forward passes: zeros of the real output's shape."""

    def __init__(self, out_channels: int, num_classes: int):
        super().__init__()
        self.out_channels, self.num_classes = out_channels, num_classes
        self.calls: List[int] = []

    def forward(self, x, t, y):
        self.calls.append(len(x))
        return torch.zeros(len(x), self.out_channels, *x.shape[2:])

    def forward_with_cfg(self, x, t, y, cfg_scale):
        return self.forward(x, t, y)


def sampler_passes(
    model: torch.nn.Module, objective: str, sampling: Dict[str, Any], flow_path: str, input_shape
) -> tuple[int, float]:
    """(forward passes per sampling batch, images per pass per sample), counted on the real sampler.

    Guidance doubles the images of a pass. An adaptive ODE solver's count on a stand-in is a lower bound.
    """
    from vcarepro.train.generation import generate_batches

    stub = _CountingModel(model.out_channels, model.num_classes)
    for _ in generate_batches(
        stub,
        objective,
        dict(sampling, batch_size=1),
        num_samples=1,
        num_classes=model.num_classes,
        input_shape=input_shape,
        seed=0,
        device=torch.device("cpu"),
        flow_path=flow_path,
    ):
        pass
    return len(stub.calls), sum(stub.calls) / max(len(stub.calls), 1)


@torch.no_grad()
def forward_seconds(model: torch.nn.Module, batch: int, input_shape, device: torch.device, repeats: int = 3) -> float:
    """One sampling forward pass (fp32, eval mode, as sample_gen runs it) at ``batch``: median after a warm-up."""
    was_training = model.training
    model.eval()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # sample_gen's process never switches TF32 on
    try:
        x = torch.randn(batch, *input_shape, device=device)
        t = torch.randint(0, 1000, (batch,), device=device)
        y = torch.randint(0, model.num_classes, (batch,), device=device)

        def forward():
            model(x, t, y)
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        forward()  # warm-up
        return timed(forward, repeats)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        model.train(was_training)


def sampling_cost(run, step, *, seeds: int, cap: Optional[int], device: torch.device, repeats: int) -> Dict[str, Any]:
    """The sampling of a ``gen_runs`` entry with the model of its built training ``step``: passes per sampling batch,
    one pass at the sampling batch (run at most at ``cap``, the time scaled linearly), and the device-hours of
    ``seeds`` x ``sampling.num_samples`` samples."""
    sampling, model = run.sampling, step.model
    passes, images_per_pass = sampler_passes(model, run.objective, sampling, run.recipe.flow_path, step.input_shape)
    size = sampling["batch_size"]
    run_batch = min(size, cap) if cap else size
    call_batch = max(1, round(run_batch * images_per_pass))
    seconds = forward_seconds(model, call_batch, step.input_shape, device, repeats) * size / run_batch
    batches = math.ceil(sampling["num_samples"] / size)
    return dict(
        num_samples=sampling["num_samples"],
        batch_size=size,
        batch_run=run_batch,
        passes_per_batch=passes,
        images_per_pass_per_sample=images_per_pass,
        batches=batches,
        forward_seconds=seconds,
        adaptive=run.objective == "flow" and sampling["flow_sampler"] == "ode",
        gpu_hours=seeds * batches * passes * seconds / 3600.0,
    )
