"""SiT's flow matching: the interpolant, the velocity loss, and the ODE / SDE samplers."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from vcarepro.models.dit import create_dit
from vcarepro.train.flow import FlowMatching

SHAPE = (2, 4, 4, 4)
SPREAD = 0.05  # the toy data: N(m, SPREAD^2 I) around one point m


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def randn(seed: int, shape=SHAPE) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def path_coefficients(path: str, t: torch.Tensor):
    """alpha_t, alpha'_t, sigma_t, sigma'_t written out for the test."""
    if path == "linear":
        return t, torch.ones_like(t), 1 - t, -torch.ones_like(t)
    c, s = torch.cos(math.pi * t / 2), torch.sin(math.pi * t / 2)
    return s, math.pi / 2 * c, c, -math.pi / 2 * s


class ExactVelocity:
    """The exact marginal velocity for data N(m, SPREAD^2 I): x_t is Gaussian with mean alpha_t m and
    variance alpha_t^2 SPREAD^2 + sigma_t^2, and the flow moves the mean and rescales the spread.
    The ODE therefore maps noise z to m + SPREAD z exactly; SPREAD > 0 keeps it finite at t = 1."""

    num_classes = 3

    def __init__(self, path: str, m: torch.Tensor, learn_sigma: bool = True):
        self.path, self.m, self.learn_sigma = path, m, learn_sigma
        self.cfg_calls = []

    def mean_var(self, t):
        alpha, d_alpha, sigma, d_sigma = path_coefficients(self.path, t.view(-1, 1, 1, 1))
        var = alpha**2 * SPREAD**2 + sigma**2
        return alpha, d_alpha, var, alpha * d_alpha * SPREAD**2 + sigma * d_sigma

    def __call__(self, x, t, y):
        m = self.m.repeat(len(x) // len(self.m), 1, 1, 1)
        alpha, d_alpha, var, half_d_var = self.mean_var(t)
        v = d_alpha * m + half_d_var / var * (x - alpha * m)
        return torch.cat([v, torch.full_like(v, 7.0)], 1) if self.learn_sigma else v  # junk variance half

    def score(self, x, t):
        alpha, _, var, _ = self.mean_var(t)
        return -(x - alpha * self.m) / var

    def forward_with_cfg(self, x, t, y, cfg_scale):
        self.cfg_calls.append((len(x), y.clone(), cfg_scale))
        return self(x, t, y)


def rms(x: torch.Tensor) -> float:
    return x.pow(2).mean().sqrt().item()


# -- the interpolant and the loss -------------------------------------------------------------------


@pytest.mark.parametrize("path", ["linear", "gvp"])
def test_path_runs_from_noise_at_t0_to_data_at_t1(path):
    fm, noise, data = FlowMatching(path), randn(0), randn(1)
    x_0, _ = fm.interpolate(noise, data, torch.zeros(2))
    x_1, _ = fm.interpolate(noise, data, torch.ones(2))
    torch.testing.assert_close(x_0, noise, atol=1e-6, rtol=0)
    torch.testing.assert_close(x_1, data, atol=1e-6, rtol=0)


@pytest.mark.parametrize("path", ["linear", "gvp"])
def test_velocity_target_is_the_time_derivative_of_the_path(path):
    fm, noise, data = FlowMatching(path), randn(0).double(), randn(1).double()
    t, h = torch.tensor([0.2, 0.7], dtype=torch.float64), 1e-6
    _, u = fm.interpolate(noise, data, t)
    ahead, _ = fm.interpolate(noise, data, t + h)
    behind, _ = fm.interpolate(noise, data, t - h)
    torch.testing.assert_close(u, (ahead - behind) / (2 * h), atol=1e-6, rtol=1e-6)
    if path == "linear":
        torch.testing.assert_close(u, data - noise)


def test_loss_is_the_mean_squared_velocity_error_on_the_first_c_channels():
    fm, data, noise = FlowMatching(), randn(1), randn(0)
    t = torch.tensor([0.25, 0.9])
    model = lambda x, t, y: torch.cat([2 * x, torch.full_like(x, 1e3)], 1)  # noqa: E731  second half is ignored
    loss = fm.training_losses(model, data, None, t=t, noise=noise)["loss"]
    x_t = t.view(-1, 1, 1, 1) * data + (1 - t.view(-1, 1, 1, 1)) * noise
    assert loss.item() == pytest.approx(((2 * x_t - (data - noise)) ** 2).mean().item(), rel=1e-6)
    with pytest.raises(ValueError, match="expected 4 or 8"):
        fm.training_losses(lambda x, t, y: x[:, :3], data, None)


@pytest.mark.parametrize("train_eps, low, high", [(0.0, 0.0, 1.0), (0.1, 0.1, 0.9)])
def test_training_times_are_uniform_on_the_interval(train_eps, low, high):
    seen = []
    fm = FlowMatching(train_eps=train_eps)
    fm.training_losses(
        lambda x, t, y: seen.append(t) or x,
        torch.zeros(4096, 1, 1, 1),
        None,
        generator=torch.Generator().manual_seed(0),
    )
    t = seen[0]
    assert t.dtype == torch.float32 and t.min() >= low and t.max() <= high
    assert t.mean().item() == pytest.approx((low + high) / 2, abs=0.02)
    assert t.min() < low + 0.01 and t.max() > high - 0.01


def test_tiny_dit_loss_decreases_on_a_fixed_batch():
    torch.manual_seed(0)
    model = create_dit("dit_s2", input_size=8, hidden_size=32, depth=2, num_heads=2, num_classes=4)
    fm = FlowMatching()
    x1 = torch.randn(8, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    y = torch.arange(8) % 4

    def eval_loss() -> float:
        with torch.no_grad():
            return (
                sum(fm.training_losses(model, x1, y, torch.Generator().manual_seed(s))["loss"].item() for s in range(4))
                / 4
            )

    before = eval_loss()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0)
    gen = torch.Generator().manual_seed(2)
    for _ in range(80):  # the velocity loss has a high floor (Var(x1 - x0) = 2 at init): it falls slowly
        loss = fm.training_losses(model, x1, y, gen)["loss"]
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert eval_loss() < 0.9 * before


# -- samplers -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["linear", "gvp"])
def test_ode_with_the_exact_velocity_lands_on_the_data_and_heun_is_more_accurate(path):
    fm, m, z = FlowMatching(path), randn(0), randn(1)
    model, y = ExactVelocity(path, m), torch.tensor([0, 1])
    exact = m + SPREAD * z  # where the exact flow takes z
    errors = {}
    for method in ("euler", "heun"):
        x = fm.sample_ode(model, z, y, num_steps=50, method=method)
        errors[method] = (x - exact).abs().max().item()
        assert rms(x - m) < 2 * SPREAD  # on the data point, up to the data's own spread
    assert errors["heun"] < errors["euler"] / 4 and errors["heun"] < 1e-2


def test_score_from_velocity_is_the_exact_score_of_a_gaussian_path():
    for path in ("linear", "gvp"):
        fm, m, x = FlowMatching(path), randn(0), randn(1)
        model = ExactVelocity(path, m, learn_sigma=False)
        for t_value in (0.0, 0.3, 0.9):
            t = torch.full((2,), t_value)
            torch.testing.assert_close(
                fm.score_from_velocity(model(x, t, None), x, t), model.score(x, t), atol=1e-4, rtol=1e-4
            )


@pytest.mark.parametrize("path", ["linear", "gvp"])
def test_sde_with_the_exact_score_lands_near_the_data(path):
    fm, m, z = FlowMatching(path), randn(0), randn(1)
    x = fm.sample_sde(
        ExactVelocity(path, m), z, torch.tensor([0, 1]), num_steps=100, generator=torch.Generator().manual_seed(3)
    )
    assert rms(x - m) < SPREAD and rms(z - m) > 1  # from unit noise to within the data's spread


def test_sde_is_deterministic_given_a_generator_seed():
    fm, m, z = FlowMatching(), randn(0), randn(1)
    model, y = ExactVelocity("linear", m), torch.tensor([0, 1])

    def run(seed: int) -> torch.Tensor:
        return fm.sample_sde(model, z, y, num_steps=30, generator=torch.Generator().manual_seed(seed))

    a, b, c = run(4), run(4), run(5)
    assert torch.equal(a, b) and not torch.allclose(a, c)


def test_guidance_doubles_the_batch_with_the_null_class():
    fm, m, z = FlowMatching(), randn(0), randn(1)
    model, y = ExactVelocity("linear", m), torch.tensor([0, 2])
    x = fm.sample_ode(model, z, y, num_steps=11, cfg_scale=1.5)
    assert len(model.cfg_calls) == 10
    size, labels, scale = model.cfg_calls[0]
    assert size == 4 and labels.tolist() == [0, 2, 3, 3] and scale == 1.5
    torch.testing.assert_close(x, fm.sample_ode(model, z, y, num_steps=11))  # the toy ignores labels
    fm.sample_sde(model, z, y, num_steps=5, cfg_scale=2.0, generator=torch.Generator().manual_seed(0))
    assert model.cfg_calls[-1][2] == 2.0


def test_sde_last_step_options():
    fm, m, z = FlowMatching(), randn(0), randn(1)
    model, y = ExactVelocity("linear", m), torch.tensor([0, 1])
    for last_step in ("Mean", "Euler", "Tweedie", None):
        x = fm.sample_sde(model, z, y, num_steps=50, last_step=last_step, generator=torch.Generator().manual_seed(3))
        assert torch.isfinite(x).all() and rms(x - m) < 3 * SPREAD
    with pytest.raises(ValueError, match="sample_eps > 0"):
        fm.sample_sde(model, z, y, diffusion_form="SBDM")
    x = FlowMatching(sample_eps=1e-3).sample_sde(
        model, z, y, num_steps=50, diffusion_form="SBDM", generator=torch.Generator().manual_seed(3)
    )
    assert rms(x - m) < 3 * SPREAD


@pytest.mark.parametrize("path", ["linear", "gvp"])
def test_dopri5_follows_the_exact_flow_to_its_tolerance(path):
    fm, m, z = FlowMatching(path), randn(0), randn(1)
    x = fm.sample_ode(ExactVelocity(path, m), z, torch.tensor([0, 1]), method="dopri5")  # SiT's atol / rtol
    assert (x - (m + SPREAD * z)).abs().max().item() < 1e-2


def test_dopri5_without_torchdiffeq_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchdiffeq", None)  # as if it were not installed
    with pytest.raises(ImportError, match="torchdiffeq"):
        FlowMatching().sample_ode(ExactVelocity("linear", randn(0)), randn(1), None, method="dopri5")


def test_unknown_choices_fail_clearly():
    with pytest.raises(ValueError, match="unknown path 'vp'; choose one of 'linear', 'gvp'"):
        FlowMatching("vp")
    with pytest.raises(ValueError, match="unknown ODE method 'rk4'"):
        FlowMatching().sample_ode(ExactVelocity("linear", randn(0)), randn(1), None, method="rk4")
    with pytest.raises(ValueError, match="unknown diffusion form"):
        FlowMatching().sample_sde(ExactVelocity("linear", randn(0)), randn(1), None, diffusion_form="cosine")
