"""SiT's objective and samplers: flow matching with velocity prediction (Ma et al., 2024).

Conventions of willisma/SiT ``transport/``: t runs from noise (0) to data (1), x_t = alpha_t x1 + sigma_t x0,
    "linear": alpha_t = t,             sigma_t = 1 - t          (SiT's default path)
    "gvp":    alpha_t = sin(pi t / 2), sigma_t = cos(pi t / 2)
the model predicts u_t = alpha'_t x1 + sigma'_t x0 and the loss is its mean squared error. A learn_sigma
backbone's second C channels are dropped, as SiT's model does. train_eps = sample_eps = 0, as SiT's
``create_transport`` sets for velocity prediction on these paths (its CLI's 1e-5 / 1e-3 apply elsewhere).
``sample_ode`` (Euler, Heun, or dopri5 through torchdiffeq) and ``sample_sde`` (Euler-Maruyama, then one
noiseless "Mean" step of 0.04) default to SiT's sample_ddp.py settings, those of its reported FIDs.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Tuple

import torch

from vcarepro.core.choices import FLOW_ODE_METHODS, FLOW_PATHS
from vcarepro.core.errors import BadInput

Model = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

PATHS = FLOW_PATHS
ODE_METHODS = FLOW_ODE_METHODS
DIFFUSION_FORMS = ("sigma", "SBDM", "constant", "linear", "decreasing", "increasing-decreasing")
LAST_STEPS = ("Mean", "Euler", "Tweedie", None)


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise BadInput(f"unknown {name} {value!r}; choose one of {', '.join(map(repr, choices))}.")


def _like(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(B,) times shaped (B, 1, ..., 1) against x."""
    return t.view(-1, *([1] * (x.dim() - 1))).to(x.dtype)


class FlowMatching:
    """SiT's transport with velocity prediction: ``training_losses``, ``sample_ode``, ``sample_sde``.

    Models are called as ``model(x_t, t, y)`` with float t in [0, 1]. Samplers leave the
    model's train/eval mode alone: put it in eval mode first.
    """

    def __init__(self, path: str = "linear", train_eps: float = 0.0, sample_eps: float = 0.0) -> None:
        _check_choice("path", path, PATHS)
        for name, eps in (("train_eps", train_eps), ("sample_eps", sample_eps)):
            if not 0.0 <= eps < 0.5:
                raise BadInput(f"{name}={eps} must lie in [0, 0.5).")
        self.path = path
        self.train_eps = train_eps
        self.sample_eps = sample_eps

    # -- the path ---------------------------------------------------------------------------

    def coefficients(self, t: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """alpha_t, alpha'_t, sigma_t, sigma'_t (data and noise coefficients and their derivatives)."""
        if self.path == "linear":
            return t, torch.ones_like(t), 1 - t, -torch.ones_like(t)
        half_pi = math.pi / 2
        return (
            torch.sin(half_pi * t),
            half_pi * torch.cos(half_pi * t),
            torch.cos(half_pi * t),
            -half_pi * torch.sin(half_pi * t),
        )

    def interpolate(self, x0: torch.Tensor, x1: torch.Tensor, t: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """x_t and the target velocity u_t for noise x0, data x1 and (B,) times t."""
        alpha, d_alpha, sigma, d_sigma = self.coefficients(_like(t, x1))
        return alpha * x1 + sigma * x0, d_alpha * x1 + d_sigma * x0

    def score_from_velocity(self, velocity: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """grad log p_t(x) from the marginal velocity (exact for a Gaussian path)."""
        alpha, d_alpha, sigma, d_sigma = self.coefficients(_like(t, x))
        ratio = alpha / d_alpha
        variance = sigma**2 - ratio * d_sigma * sigma
        return (ratio * velocity - x) / variance

    # -- training ---------------------------------------------------------------------------

    def training_losses(
        self,
        model: Model,
        x1: torch.Tensor,
        y: torch.Tensor,
        generator: Optional[torch.Generator] = None,
        *,
        t: Optional[torch.Tensor] = None,
        noise: Optional[torch.Tensor] = None,
    ) -> Dict[str, torch.Tensor]:
        """SiT's velocity loss on a batch of clean latents x1: dict(loss) as a batch mean.

        ``t`` and ``noise`` default to t ~ U(train_eps, 1 - train_eps) and x0 ~ N(0, I).
        """
        B = x1.shape[0]
        if t is None:
            t = torch.rand(B, generator=generator, device=x1.device, dtype=x1.dtype)
            t = t * (1 - 2 * self.train_eps) + self.train_eps
        if noise is None:
            noise = torch.randn(x1.shape, generator=generator, device=x1.device, dtype=x1.dtype)
        x_t, u_t = self.interpolate(noise, x1, t)
        v = self._velocity_channels(model(x_t, t, y), x1)
        return {"loss": ((v - u_t) ** 2).mean()}

    @staticmethod
    def _velocity_channels(model_output: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        C = x.shape[1]
        if model_output.shape[1] == 2 * C:  # learn_sigma backbone: SiT keeps the first half
            return model_output[:, :C]
        if model_output.shape[1] != C:
            raise BadInput(
                f"the model returned {model_output.shape[1]} channels for a {C}-channel input; expected {C} or {2 * C}."
            )
        return model_output

    # -- sampling ---------------------------------------------------------------------------

    def velocity(self, model: Model, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, cfg_scale: float = 1.0):
        """The model's velocity at (x, t); with cfg_scale != 1 a doubled batch with the null class
        (label ``model.num_classes``) goes through ``model.forward_with_cfg``, as in SiT's sample.py."""
        if cfg_scale == 1.0:
            return self._velocity_channels(model(x, t, y), x)
        if not hasattr(model, "forward_with_cfg"):
            raise BadInput("cfg_scale != 1 needs a model with forward_with_cfg (and a null class).")
        B = x.shape[0]
        y2 = torch.cat([y, torch.full_like(y, model.num_classes)])
        out = model.forward_with_cfg(torch.cat([x, x]), torch.cat([t, t]), y2, cfg_scale)
        return self._velocity_channels(out[:B], x)

    @torch.no_grad()
    def sample_ode(
        self,
        model: Model,
        noise: torch.Tensor,
        y: torch.Tensor,
        num_steps: int = 250,
        method: str = "euler",
        cfg_scale: float = 1.0,
        atol: float = 1e-6,
        rtol: float = 1e-3,
    ) -> torch.Tensor:
        """Integrate dx/dt = v(x, t) from noise at t = sample_eps to 1 - sample_eps.

        ``num_steps`` counts time points, as SiT's ``linspace(t0, t1, num_steps)`` does:
        the fixed-grid methods take num_steps - 1 steps. dopri5 is adaptive (torchdiffeq)
        with ``atol`` / ``rtol``, SiT's ODE default.
        """
        _check_choice("ODE method", method, ODE_METHODS)
        if num_steps < 2:
            raise BadInput(f"num_steps={num_steps}: the time grid needs at least 2 points.")
        times = torch.linspace(
            self.sample_eps, 1 - self.sample_eps, num_steps, device=noise.device, dtype=torch.float64
        ).to(noise.dtype)
        B = noise.shape[0]

        def drift(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return self.velocity(model, x, t.expand(B), y, cfg_scale)

        if method == "dopri5":
            try:
                from torchdiffeq import odeint
            except ImportError:
                raise ImportError(
                    "method='dopri5' needs torchdiffeq (pip install torchdiffeq); or use method='euler' / 'heun'."
                ) from None
            return odeint(lambda t, x: drift(x, t), noise, times, method="dopri5", atol=atol, rtol=rtol)[-1]

        x = noise
        for t_cur, t_next in zip(times[:-1], times[1:]):
            dt = t_next - t_cur
            d_cur = drift(x, t_cur)
            if method == "euler":
                x = x + dt * d_cur
            else:  # Heun: trapezoid of the slopes at both ends of the Euler predictor
                x = x + 0.5 * dt * (d_cur + drift(x + dt * d_cur, t_next))
        return x

    def diffusion_coefficient(self, t: torch.Tensor, form: str = "sigma", norm: float = 1.0) -> torch.Tensor:
        """D(t) of SiT's SDE; the noise injected per step has variance 2 D(t) dt."""
        _check_choice("diffusion form", form, DIFFUSION_FORMS)
        if form == "sigma":
            return norm * self.coefficients(t)[2]
        if form == "SBDM":  # the score-based-diffusion-model choice: D = sigma^2 alpha'/alpha - sigma sigma'
            alpha, d_alpha, sigma, d_sigma = self.coefficients(t)
            return norm * (d_alpha / alpha * sigma**2 - sigma * d_sigma)
        if form == "constant":
            return torch.full_like(t, norm)
        if form == "linear":
            return norm * (1 - t)
        if form == "decreasing":
            return 0.25 * (norm * torch.cos(math.pi * t) + 1) ** 2
        return norm * torch.sin(math.pi * t) ** 2

    @torch.no_grad()
    def sample_sde(
        self,
        model: Model,
        noise: torch.Tensor,
        y: torch.Tensor,
        num_steps: int = 250,
        cfg_scale: float = 1.0,
        generator: Optional[torch.Generator] = None,
        diffusion_form: str = "sigma",
        diffusion_norm: float = 1.0,
        last_step: Optional[str] = "Mean",
        last_step_size: float = 0.04,
    ) -> torch.Tensor:
        """SiT's Euler-Maruyama sampler: num_steps - 1 stochastic steps, then the last step."""
        _check_choice("diffusion form", diffusion_form, DIFFUSION_FORMS)
        _check_choice("last step", last_step, LAST_STEPS)
        if num_steps < 2:
            raise BadInput(f"num_steps={num_steps}: the time grid needs at least 2 points.")
        if last_step is None:
            last_step_size = 0.0
        # SBDM's D(t) is singular at t = 0, so only that form starts at sample_eps.
        if diffusion_form == "SBDM" and self.sample_eps <= 0:
            raise BadInput("diffusion_form='SBDM' is singular at t=0; build FlowMatching with sample_eps > 0.")
        t0 = self.sample_eps if diffusion_form == "SBDM" else 0.0
        t1 = 1.0 - last_step_size if last_step_size > 0 else 1.0 - self.sample_eps
        times = torch.linspace(t0, t1, num_steps, dtype=torch.float64)
        dt = float(times[1] - times[0])
        B = noise.shape[0]

        def drift_and_diffusion(x: torch.Tensor, t: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            t_batch = torch.full((B,), t, device=x.device, dtype=x.dtype)
            v = self.velocity(model, x, t_batch, y, cfg_scale)
            D = self.diffusion_coefficient(_like(t_batch, x), diffusion_form, diffusion_norm)
            return v, D, self.score_from_velocity(v, x, t_batch)

        x = noise
        for t in times[:-1].tolist():
            v, D, score = drift_and_diffusion(x, t)
            dw = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype) * math.sqrt(dt)
            x = x + (v + D * score) * dt + torch.sqrt(2 * D) * dw

        if last_step is None:
            return x
        v, D, score = drift_and_diffusion(x, t1)
        if last_step == "Mean":  # the drift step without its noise
            return x + (v + D * score) * last_step_size
        if last_step == "Euler":  # a probability-flow step
            return x + v * last_step_size
        # Tweedie: the posterior mean of the data given x_t
        alpha, _, sigma, _ = self.coefficients(torch.full_like(x[:1], t1))
        return x / alpha + sigma**2 / alpha * score


__all__ = ["DIFFUSION_FORMS", "FlowMatching", "LAST_STEPS", "ODE_METHODS", "PATHS"]
