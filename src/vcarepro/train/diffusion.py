"""DiT's diffusion objective and sampler: DDPM with a learned variance (IDDPM's hybrid loss).

As DiT's ``create_diffusion(timestep_respacing="")``: 1000 linear-beta steps, the model predicts eps and
its log-variance's interpolation v in [-1, 1] (a (B, 2C, H, W) output), and the loss is the eps MSE plus
the VLB term in bits per dimension with the mean frozen, so vb trains only the variance (plain MSE loss
type, so vb is not rescaled). The sampler is diffusers' ``DDPMScheduler`` (learned_range, no clipping, as
DiT samples); its 250 "linspace" steps equal IDDPM's respaced chain, which tests hold. The VLB term is
written here because diffusers has no training loss for learned variances.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Tuple

import torch
from diffusers import DDPMScheduler

from vcarepro.core.errors import BadInput

Model = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def mean_flat(x: torch.Tensor) -> torch.Tensor:
    """Mean over every dimension but the batch."""
    return x.mean(dim=tuple(range(1, x.dim())))


def normal_kl(mean1: torch.Tensor, logvar1: torch.Tensor, mean2: torch.Tensor, logvar2: torch.Tensor) -> torch.Tensor:
    """Elementwise KL(N(mean1, e^logvar1) || N(mean2, e^logvar2)) in nats."""
    return 0.5 * (-1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2) + (mean1 - mean2) ** 2 * torch.exp(-logvar2))


def approx_standard_normal_cdf(x: torch.Tensor) -> torch.Tensor:
    """IDDPM's tanh approximation of the standard normal CDF (kept so the loss matches DiT's)."""
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def discretized_gaussian_log_likelihood(
    x: torch.Tensor, *, means: torch.Tensor, log_scales: torch.Tensor
) -> torch.Tensor:
    """Elementwise log-probability (nats) of x under N(means, e^(2 log_scales)) discretised to
    bins of width 2/255 on [-1, 1], with the outermost bins open-ended (as for uint8 images)."""
    centered = x - means
    inv_std = torch.exp(-log_scales)
    cdf_plus = approx_standard_normal_cdf(inv_std * (centered + 1.0 / 255.0))
    cdf_min = approx_standard_normal_cdf(inv_std * (centered - 1.0 / 255.0))
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
    log_cdf_delta = torch.log((cdf_plus - cdf_min).clamp(min=1e-12))
    return torch.where(x < -0.999, log_cdf_plus, torch.where(x > 0.999, log_one_minus_cdf_min, log_cdf_delta))


def _extract(values: torch.Tensor, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """values[t] shaped (B, 1, ..., 1) in like's dtype, for broadcasting against like."""
    out = values.to(t.device)[t].to(like.dtype)
    return out.view(-1, *([1] * (like.dim() - 1)))


class GaussianDiffusion:
    """DDPM with DiT's settings: ``training_losses`` for training, ``sample`` for generation.

    Models are called as ``model(x_t, t, y)`` with integer timesteps in [0, num_timesteps)
    and must return (B, 2C, H, W): eps, then the variance interpolation value.
    ``sample`` leaves the model's train/eval mode alone: put it in eval mode first,
    or label dropout will act during sampling.
    """

    def __init__(self, num_timesteps: int = 1000, beta_start: float = 1e-4, beta_end: float = 0.02) -> None:
        self.num_timesteps = num_timesteps
        self.scheduler = self._make_scheduler(num_timesteps, beta_start, beta_end)

        # The loss needs the posterior in float64, as IDDPM computes it: 1 - alpha_bar at
        # t = 0 is 1e-4, where float32 would cost three digits of the log-variance.
        betas = self.scheduler.betas.double()
        alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
        alphas_cumprod_prev = torch.cat([torch.ones(1, dtype=torch.float64), alphas_cumprod[:-1]])
        self.betas = betas
        self.alphas_cumprod = alphas_cumprod
        self.sqrt_alphas_cumprod = alphas_cumprod.sqrt()
        self.sqrt_one_minus_alphas_cumprod = (1.0 - alphas_cumprod).sqrt()
        self.sqrt_recip_alphas_cumprod = (1.0 / alphas_cumprod).sqrt()
        self.sqrt_recipm1_alphas_cumprod = (1.0 / alphas_cumprod - 1.0).sqrt()
        self.posterior_variance = betas * (1.0 - alphas_cumprod_prev) / (1.0 - alphas_cumprod)
        # The posterior variance is 0 at t = 0; IDDPM clips its log to the t = 1 value there.
        self.posterior_log_variance_clipped = torch.log(
            torch.cat([self.posterior_variance[1:2], self.posterior_variance[1:]])
        )
        self.posterior_mean_coef1 = betas * alphas_cumprod_prev.sqrt() / (1.0 - alphas_cumprod)
        self.posterior_mean_coef2 = (1.0 - alphas_cumprod_prev) * (1.0 - betas).sqrt() / (1.0 - alphas_cumprod)
        self.log_betas = betas.log()

    @staticmethod
    def _make_scheduler(num_timesteps: int, beta_start: float, beta_end: float) -> DDPMScheduler:
        # diffusers' defaults (clip_sample=True, fixed_small, "leading" spacing) are not DiT's.
        return DDPMScheduler(
            num_train_timesteps=num_timesteps,
            beta_start=beta_start,
            beta_end=beta_end,
            beta_schedule="linear",
            variance_type="learned_range",
            clip_sample=False,
            prediction_type="epsilon",
            timestep_spacing="linspace",
        )

    # -- the forward process and its posterior ----------------------------------------

    def q_sample(self, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """A draw of x_t ~ q(x_t | x_0) = N(sqrt(alpha_bar_t) x_0, (1 - alpha_bar_t) I)."""
        return (
            _extract(self.sqrt_alphas_cumprod, t, x0) * x0 + _extract(self.sqrt_one_minus_alphas_cumprod, t, x0) * noise
        )

    def q_posterior(self, x0: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Mean and clipped log-variance of q(x_{t-1} | x_t, x_0)."""
        mean = _extract(self.posterior_mean_coef1, t, x_t) * x0 + _extract(self.posterior_mean_coef2, t, x_t) * x_t
        return mean, _extract(self.posterior_log_variance_clipped, t, x_t)

    def p_mean_log_variance(self, model_output: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor):
        """Mean and log-variance of p(x_{t-1} | x_t) from a (B, 2C, ...) eps + variance output."""
        eps, var_values = self._split(model_output, x_t)
        frac = (var_values + 1) / 2
        log_variance = frac * _extract(self.log_betas, t, x_t) + (1 - frac) * _extract(
            self.posterior_log_variance_clipped, t, x_t
        )
        pred_x0 = (
            _extract(self.sqrt_recip_alphas_cumprod, t, x_t) * x_t
            - _extract(self.sqrt_recipm1_alphas_cumprod, t, x_t) * eps
        )
        mean, _ = self.q_posterior(pred_x0, x_t, t)
        return mean, log_variance

    @staticmethod
    def _split(model_output: torch.Tensor, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        C = x.shape[1]
        if model_output.shape != (x.shape[0], 2 * C, *x.shape[2:]):
            raise BadInput(
                f"the model must return eps and the learned variance, shape {(x.shape[0], 2 * C, *x.shape[2:])}, "
                f"got {tuple(model_output.shape)}; build it with learn_sigma=True."
            )
        return model_output[:, :C], model_output[:, C:]

    # -- training ---------------------------------------------------------------------------

    def vb_terms_bpd(
        self, model_output: torch.Tensor, x0: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor
    ) -> torch.Tensor:
        """Per-sample VLB term in bits per dimension: the KL for t > 0, the decoder NLL at t = 0."""
        true_mean, true_log_variance = self.q_posterior(x0, x_t, t)
        mean, log_variance = self.p_mean_log_variance(model_output, x_t, t)
        kl = mean_flat(normal_kl(true_mean, true_log_variance, mean, log_variance)) / math.log(2.0)
        decoder_nll = -mean_flat(
            discretized_gaussian_log_likelihood(x0, means=mean, log_scales=0.5 * log_variance)
        ) / math.log(2.0)
        return torch.where(t == 0, decoder_nll, kl)

    def training_losses(
        self,
        model: Model,
        x0: torch.Tensor,
        y: torch.Tensor,
        generator: Optional[torch.Generator] = None,
        *,
        t: Optional[torch.Tensor] = None,
        noise: Optional[torch.Tensor] = None,
    ) -> Dict[str, torch.Tensor]:
        """DiT's loss on a batch of clean latents x0: dict(loss, mse, vb), each a batch mean.

        ``t`` and ``noise`` default to t ~ U{0..T-1} and eps ~ N(0, I) drawn from ``generator``.
        """
        B = x0.shape[0]
        if t is None:
            t = torch.randint(0, self.num_timesteps, (B,), generator=generator, device=x0.device)
        if noise is None:
            noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
        x_t = self.q_sample(x0, t, noise)
        model_output = model(x_t, t, y)
        eps, var_values = self._split(model_output, x_t)
        # The VLB trains only the variance: the mean it sees is frozen (stop-gradient).
        frozen = torch.cat([eps.detach(), var_values], dim=1)
        vb = self.vb_terms_bpd(frozen, x0, x_t, t)
        mse = mean_flat((noise - eps) ** 2)
        return {"loss": (mse + vb).mean(), "mse": mse.mean(), "vb": vb.mean()}

    # -- sampling ---------------------------------------------------------------------------

    def sampling_scheduler(self, num_steps: int, device: Optional[torch.device] = None) -> DDPMScheduler:
        """A fresh scheduler over ``num_steps`` respaced steps (a sampler owns its own state)."""
        scheduler = DDPMScheduler.from_config(self.scheduler.config)
        scheduler.set_timesteps(num_steps, device=device)
        return scheduler

    @torch.no_grad()
    def sample(
        self,
        model: Model,
        noise: torch.Tensor,
        y: torch.Tensor,
        num_steps: int = 250,
        cfg_scale: float = 1.0,
        generator: Optional[torch.Generator] = None,
    ) -> torch.Tensor:
        """Ancestral sampling with the learned variance over ``num_steps`` respaced steps, from x_T = noise.

        With ``cfg_scale != 1`` the batch is doubled with the null class (label
        ``model.num_classes``) and ``model.forward_with_cfg`` guides it, as DiT's sample.py does.
        """
        scheduler = self.sampling_scheduler(num_steps, device=noise.device)
        B = noise.shape[0]
        guided = cfg_scale != 1.0
        if guided:
            if not hasattr(model, "forward_with_cfg"):
                raise BadInput("cfg_scale != 1 needs a model with forward_with_cfg (and a null class).")
            y = torch.cat([y, torch.full_like(y, model.num_classes)])
        x = noise
        for t in scheduler.timesteps:
            t_batch = torch.full((B,), int(t), device=x.device, dtype=torch.long)
            if guided:
                out = model.forward_with_cfg(torch.cat([x, x]), torch.cat([t_batch, t_batch]), y, cfg_scale)[:B]
            else:
                out = model(x, t_batch, y)
            self._split(out, x)  # shape check: the scheduler would silently ignore a C-channel output's variance
            x = scheduler.step(out, t, x, generator=generator).prev_sample
        return x


__all__ = [
    "GaussianDiffusion",
    "approx_standard_normal_cdf",
    "discretized_gaussian_log_likelihood",
    "mean_flat",
    "normal_kl",
]
