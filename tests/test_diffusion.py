"""DiT's DDPM: schedule, forward process, IDDPM's hybrid loss, and the respaced learned-variance sampler."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm
from torch.distributions import Normal, kl_divergence

from vcarepro.models.dit import create_dit
from vcarepro.train.diffusion import GaussianDiffusion

T = 1000


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def diffusion() -> GaussianDiffusion:
    return GaussianDiffusion()


def reference_schedule(betas: np.ndarray) -> dict:
    """DDPM's closed forms in float64, written from the equations, for a (possibly respaced) beta sequence."""
    acp = np.cumprod(1.0 - betas)
    acp_prev = np.append(1.0, acp[:-1])
    post_var = betas * (1.0 - acp_prev) / (1.0 - acp)
    return dict(
        betas=betas,
        acp=acp,
        acp_prev=acp_prev,
        post_var=post_var,
        post_logvar=np.log(np.append(post_var[1], post_var[1:])),  # log 0 at t = 0 replaced by the t = 1 value
        coef_x0=betas * np.sqrt(acp_prev) / (1.0 - acp),
        coef_xt=(1.0 - acp_prev) * np.sqrt(1.0 - betas) / (1.0 - acp),
    )


BASE = reference_schedule(np.linspace(1e-4, 0.02, T, dtype=np.float64))


def toy_output(x_t: torch.Tensor) -> torch.Tensor:
    """A fixed 'model' output: some eps guess and variance values inside (-1, 1)."""
    return torch.cat([0.3 * x_t + 0.1, torch.tanh(x_t) * 0.8], dim=1)


# -- schedule and forward process ------------------------------------------------------------------


def test_schedule_is_dits_linear_1000_step_schedule_without_clipping(diffusion):
    assert diffusion.num_timesteps == T
    np.testing.assert_allclose(diffusion.betas.numpy(), BASE["betas"], rtol=1e-6)
    np.testing.assert_allclose(diffusion.alphas_cumprod.numpy(), BASE["acp"], rtol=1e-5)
    config = diffusion.scheduler.config
    assert config.clip_sample is False and config.variance_type == "learned_range"
    assert config.prediction_type == "epsilon"


@pytest.mark.parametrize("t", [0, 10, 500, 999])
def test_q_sample_has_the_marginal_mean_and_variance(diffusion, t):
    x0 = torch.full((1, 1, 300, 300), 0.7)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(t))
    x_t = diffusion.q_sample(x0, torch.tensor([t]), noise)
    acp = BASE["acp"][t]
    assert x_t.mean().item() == pytest.approx(math.sqrt(acp) * 0.7, abs=4 * math.sqrt((1 - acp) / x0.numel()) + 1e-6)
    assert x_t.var().item() == pytest.approx(1 - acp, rel=0.02)


# -- the hybrid loss --------------------------------------------------------------------------------


def direct_kl_bits(x0: torch.Tensor, x_t: torch.Tensor, out: torch.Tensor, t: int) -> float:
    """KL(q(x_{t-1} | x_t, x_0) || p(x_{t-1} | x_t)) averaged over dimensions, in bits, by torch.distributions."""
    s = {k: float(v[t]) for k, v in BASE.items()}
    x0, x_t, out = x0.double(), x_t.double(), out.double()
    C = x0.shape[0]
    eps, v = out[:C], out[C:]
    q_mean = s["coef_x0"] * x0 + s["coef_xt"] * x_t
    q_std = math.exp(0.5 * s["post_logvar"])
    pred_x0 = (x_t - math.sqrt(1 - s["acp"]) * eps) / math.sqrt(s["acp"])
    p_mean = s["coef_x0"] * pred_x0 + s["coef_xt"] * x_t
    frac = (v + 1) / 2
    p_std = torch.exp(0.5 * (frac * math.log(s["betas"]) + (1 - frac) * s["post_logvar"]))
    return (kl_divergence(Normal(q_mean, q_std), Normal(p_mean, p_std)).mean() / math.log(2)).item()


def test_vb_term_is_the_posterior_kl_in_bits_per_dim_without_rescaling(diffusion):
    gen = torch.Generator().manual_seed(0)
    ts = torch.tensor([1, 10, 500, 999])
    x0 = torch.randn(4, 2, 3, 3, generator=gen)
    noise = torch.randn(x0.shape, generator=gen)
    x_t = diffusion.q_sample(x0, ts, noise)
    vb = diffusion.vb_terms_bpd(toy_output(x_t), x0, x_t, ts)
    expected = [direct_kl_bits(x0[i], x_t[i], toy_output(x_t)[i], int(t)) for i, t in enumerate(ts)]
    np.testing.assert_allclose(vb.numpy(), expected, rtol=1e-4, atol=1e-6)

    # training_losses: loss = mse(eps) + vb, batch means, with DiT's default (unrescaled) vb
    losses = diffusion.training_losses(lambda x, t, y: toy_output(x), x0, None, t=ts, noise=noise)
    mse = ((noise - toy_output(x_t)[:, :2]) ** 2).mean()
    assert losses["mse"].item() == pytest.approx(mse.item(), rel=1e-5)
    assert losses["vb"].item() == pytest.approx(float(np.mean(expected)), rel=1e-4)
    assert losses["loss"].item() == pytest.approx(losses["mse"].item() + losses["vb"].item(), rel=1e-6)


def test_vb_at_t0_is_the_discretised_gaussian_decoder_nll(diffusion):
    gen = torch.Generator().manual_seed(1)
    x0 = torch.rand(2, 2, 4, 4, generator=gen) * 1.8 - 0.9  # inside [-1, 1], away from the open-ended edge bins
    noise = torch.randn(x0.shape, generator=gen)
    t = torch.zeros(2, dtype=torch.long)
    x_t = diffusion.q_sample(x0, t, noise)
    out = toy_output(x_t)
    vb = diffusion.vb_terms_bpd(out, x0, x_t, t)
    # p(x_0 | x_1): mean from the eps guess, log-variance between the clipped posterior value and log beta_0
    s = {k: float(v[0]) for k, v in BASE.items()}
    xt, eps, v = x_t.double().numpy(), out[:, :2].double().numpy(), out[:, 2:].double().numpy()
    pred_x0 = (xt - math.sqrt(1 - s["acp"]) * eps) / math.sqrt(s["acp"])
    mean = s["coef_x0"] * pred_x0 + s["coef_xt"] * xt
    frac = (v + 1) / 2
    std = np.exp(0.5 * (frac * math.log(s["betas"]) + (1 - frac) * s["post_logvar"]))
    x = x0.double().numpy()
    prob = norm.cdf((x + 1 / 255 - mean) / std) - norm.cdf((x - 1 / 255 - mean) / std)
    nll_bits = -np.log(prob).reshape(2, -1).mean(1) / math.log(2)
    # IDDPM uses a tanh approximation of the normal CDF (error ~1e-3), hence the tolerance
    np.testing.assert_allclose(vb.numpy(), nll_bits, rtol=1e-2)


def test_vb_trains_only_the_variance(diffusion):
    eps_out = torch.zeros(2, 2, 3, 3, requires_grad=True)
    var_out = torch.zeros(2, 2, 3, 3, requires_grad=True)
    x0 = torch.randn(2, 2, 3, 3, generator=torch.Generator().manual_seed(3))
    losses = diffusion.training_losses(
        lambda x, t, y: torch.cat([eps_out, var_out], 1), x0, None, t=torch.tensor([5, 700])
    )
    losses["vb"].backward(retain_graph=True)
    assert not eps_out.grad.any() and var_out.grad.abs().sum() > 0  # the stop-gradient on the mean
    losses["mse"].backward()
    assert eps_out.grad.abs().sum() > 0


def test_training_losses_draw_t_uniformly_over_all_steps(diffusion):
    seen = []
    x0 = torch.zeros(4096, 1, 1, 1)
    diffusion.training_losses(
        lambda x, t, y: seen.append(t) or torch.zeros(len(x), 2, 1, 1),
        x0,
        None,
        generator=torch.Generator().manual_seed(0),
    )
    t = seen[0]
    assert t.dtype == torch.long and t.min() >= 0 and t.max() <= T - 1
    assert t.float().mean().item() == pytest.approx((T - 1) / 2, rel=0.05) and t.min() < 5 and t.max() > T - 5


def test_a_model_without_learned_variance_is_rejected(diffusion):
    with pytest.raises(ValueError, match="learn_sigma=True"):
        diffusion.training_losses(lambda x, t, y: x, torch.zeros(2, 4, 2, 2), None)


def test_tiny_dit_loss_is_finite_and_decreases_on_a_fixed_batch(diffusion):
    torch.manual_seed(0)
    model = create_dit("dit_s2", input_size=8, hidden_size=32, depth=2, num_heads=2, num_classes=4)
    x0 = torch.randn(8, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    y = torch.arange(8) % 4

    def eval_loss() -> float:
        with torch.no_grad():
            return np.mean(
                [
                    diffusion.training_losses(model, x0, y, torch.Generator().manual_seed(s))["loss"].item()
                    for s in range(4)
                ]
            )

    before = eval_loss()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0)
    gen = torch.Generator().manual_seed(2)
    for _ in range(40):
        loss = diffusion.training_losses(model, x0, y, gen)["loss"]
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = eval_loss()
    assert np.isfinite(after) and after < 0.8 * before


# -- the sampler ----------------------------------------------------------------------------------


def iddpm_respaced_steps(num_steps: int) -> list:
    """The steps IDDPM's space_timesteps(1000, str(num_steps)) keeps: evenly strided, rounded, ends included."""
    stride = (T - 1) / (num_steps - 1)
    steps, position = [], 0.0
    for _ in range(num_steps):
        steps.append(round(position))
        position += stride
    return steps


def test_sampler_walks_iddpms_250_respaced_steps(diffusion):
    scheduler = diffusion.sampling_scheduler(250)
    kept = iddpm_respaced_steps(250)
    assert kept[:3] == [0, 4, 8] and kept[-1] == 999
    assert scheduler.timesteps.tolist() == kept[::-1]


def test_a_sampler_step_is_iddpms_respaced_learned_variance_step(diffusion):
    """diffusers' learned_range step on the respaced chain == IDDPM's SpacedDiffusion.p_sample (clip off)."""
    kept = iddpm_respaced_steps(250)
    acp = BASE["acp"][kept]
    spaced = reference_schedule(1.0 - acp / np.append(1.0, acp[:-1]))  # SpacedDiffusion's new betas
    scheduler = diffusion.sampling_scheduler(250)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, 4, generator=gen)
    out = torch.cat([torch.randn(2, 3, 4, 4, generator=gen), torch.rand(2, 3, 4, 4, generator=gen) * 2 - 1], 1)
    for i in (249, 180, 60, 1, 0):  # index into the respaced chain
        t = kept[i]
        step_gen = torch.Generator().manual_seed(10 + i)
        noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(10 + i))
        got = scheduler.step(out, scheduler.timesteps[249 - i], x, generator=step_gen).prev_sample.double()
        s = {k: float(v[i]) for k, v in spaced.items()}
        xd, eps, v = x.double(), out[:, :3].double(), out[:, 3:].double()
        pred_x0 = (xd - math.sqrt(1 - s["acp"]) * eps) / math.sqrt(s["acp"])
        mean = s["coef_x0"] * pred_x0 + s["coef_xt"] * xd
        frac = (v + 1) / 2
        log_var = frac * math.log(s["betas"]) + (1 - frac) * s["post_logvar"]
        expected = mean + (i != 0) * torch.exp(0.5 * log_var) * noise.double()
        assert t == int(scheduler.timesteps[249 - i])
        # float32 in diffusers against float64 here
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


class ExactEps:
    """A 'model' that knows the data is the single point x_star: it returns the true eps and a variance value."""

    num_classes = 3

    def __init__(self, diffusion: GaussianDiffusion, x_star: torch.Tensor, variance_value: float = -1.0):
        self.acp, self.x_star, self.v = diffusion.alphas_cumprod, x_star, variance_value
        self.cfg_calls = []

    def __call__(self, x, t, y):
        acp = self.acp[t].float().view(-1, 1, 1, 1)
        x_star = self.x_star.repeat(len(x) // len(self.x_star), 1, 1, 1)  # a cfg batch is doubled
        eps = (x - acp.sqrt() * x_star) / (1 - acp).sqrt()
        return torch.cat([eps, torch.full_like(x, self.v)], 1)

    def forward_with_cfg(self, x, t, y, cfg_scale):
        self.cfg_calls.append((len(x), y.clone(), cfg_scale))
        return self(x, t, y)


def test_sampling_with_the_exact_eps_recovers_the_data_point(diffusion):
    x_star = torch.randn(2, 4, 4, 4, generator=torch.Generator().manual_seed(0))
    noise = torch.randn(2, 4, 4, 4, generator=torch.Generator().manual_seed(1))
    model = ExactEps(diffusion, x_star, variance_value=0.5)
    y = torch.tensor([0, 2])
    out = diffusion.sample(model, noise, y, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(out, x_star, atol=1e-4, rtol=1e-4)
    assert not model.cfg_calls

    guided = diffusion.sample(model, noise, y, num_steps=25, cfg_scale=4.0, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(guided, x_star, atol=1e-4, rtol=1e-4)
    size, labels, scale = model.cfg_calls[0]
    assert len(model.cfg_calls) == 25 and size == 4 and scale == 4.0
    assert labels.tolist() == [0, 2, 3, 3]  # the batch doubled with the null class


def test_sampling_is_deterministic_given_a_generator_seed(diffusion):
    # eps = 0 is wrong for Gaussian data, so the injected noise shows in the sample
    # (with the exact eps every path would end at the data point whatever the seed)
    model = lambda x, t, y: torch.cat([torch.zeros_like(x), torch.ones_like(x)], 1)  # noqa: E731
    noise = torch.randn(2, 4, 4, 4, generator=torch.Generator().manual_seed(1))
    y = torch.zeros(2, dtype=torch.long)

    def run(seed: int) -> torch.Tensor:
        return diffusion.sample(model, noise, y, num_steps=20, generator=torch.Generator().manual_seed(seed))

    a, b, c = run(5), run(5), run(6)
    assert torch.equal(a, b) and not torch.allclose(a, c)
