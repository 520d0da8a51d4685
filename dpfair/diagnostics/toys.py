"""Toy experiments of the papers: Zhao's bimodal mean and Esipova's direction-vs-magnitude runs.

**Opt-in and non-private**: both use un-noised training statistics (the bimodal toy is
noise-free by default, as Zhao's Fig. 1; the Table 1 runs add no noise at all), so every
result carries ``"privacy": "non-private"``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

from dpfair.data.dataset import Split
from dpfair.diagnostics.bias import batch_gradients
from dpfair.diagnostics.hvp import LossFn
from dpfair.diagnostics.misalignment import direction_step, magnitude_step

PRIVACY = "non-private"

Variant = Literal["sgd", "clipped", "magnitude", "direction"]
VARIANTS: tuple[Variant, ...] = ("sgd", "clipped", "magnitude", "direction")


def bimodal_mean_toy(*, c_lb: float = 0.0, n: int = 1000, minority_fraction: float = 0.4,
                     spread: float = 0.0, steps: int = 3000, lr: float = 0.05,
                     sample_rate: float = 0.1, c_init: float = 1.0, tau: float = 1.0,
                     gamma: float = 0.5, eta_c: float = 0.2, sigma: float = 0.0,
                     sigma_count: float | None = None, seed: int = 0) -> dict:
    """Zhao et al.'s Fig. 1 (left): mean estimation with (bounded) adaptive clipping.

    Data: a fraction ``1 − minority_fraction`` of the n points at 0 and the rest at 1 (plus
    N(0, spread²) jitter), true mean 0.4 by default. Loss ½ Σ (x_i − μ)², per-sample descent
    direction g_i = x_i − μ_t. Each step is Zhao's Alg. 2 (normalised DP-SGD: the
    ``adaptive`` method with s = 1): Poisson-sample B_t at rate q, expected size B = qn;
    ḡ_i = g_i min(1/C_t, 1/|g_i|); μ_{t+1} = μ_t + η (Σ ḡ_i + N(0, σ²)) / B;
    b_t = #{|g_i| > τ C_t}, b̃_t = (b_t + N(0, σ_count²)) / B;
    C_{t+1} = max(C_LB, C_t exp(η_C (b̃_t − γ))).
    Defaults are Zhao's toy (non-DP: σ = 0, τ = 1, γ = 0.5) with η_C = 0.2 and C_0 = 1
    (Zhao Sec. 3.1); σ_count defaults to 10 σ. With C_LB = 0 (unbounded) C_t collapses and
    μ is driven to the majority value 0; a lower bound at least as large as the minority's
    gradient at the true mean (1 − 0.4 = 0.6) keeps μ near 0.4.

    Returns the trajectories of μ_t and C_t, the final μ and the true mean.
    """
    rng = np.random.default_rng(seed)
    n_min = int(round(minority_fraction * n))
    x = np.concatenate([np.zeros(n - n_min), np.ones(n_min)])
    x = x + spread * rng.standard_normal(n)
    sigma_count = 10 * sigma if sigma_count is None else sigma_count
    expected = sample_rate * n
    mu, c = 0.0, c_init
    mus, cs = np.empty(steps), np.empty(steps)
    for t in range(steps):
        g = x[rng.random(n) < sample_rate] - mu
        norms = np.abs(g)
        clipped = g * np.minimum(1 / c, 1 / np.maximum(norms, 1e-300))
        mu += lr * (clipped.sum() + sigma * rng.standard_normal()) / expected
        b = ((norms > tau * c).sum() + sigma_count * rng.standard_normal()) / expected
        c = max(c_lb, c * float(np.exp(eta_c * (b - gamma))))
        mus[t], cs[t] = mu, c
    return {
        "privacy": PRIVACY,
        "c_lb": c_lb,
        "mu": mus,
        "C": cs,
        "final_mu": float(mus[-1]),
        "true_mean": float(x.mean()),
    }


def variant_step(g_B: Tensor, gbar_B: Tensor, variant: Variant) -> Tensor:
    """The update vector of Esipova et al.'s Table 1 experiment (Sec. 4, App. B.4).

    ``magnitude``: (‖ḡ_B‖/‖g_B‖) g_B, magnitude error only; ``direction``: M_B g_B =
    (‖g_B‖/‖ḡ_B‖) ḡ_B, direction error only; ``sgd``: g_B and ``clipped``: ḡ_B as references.
    """
    if variant == "sgd":
        return g_B
    if variant == "clipped":
        return gbar_B
    if variant == "magnitude":
        return magnitude_step(g_B, gbar_B)
    if variant == "direction":
        return direction_step(g_B, gbar_B)
    raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")


@torch.no_grad()
def per_group_metrics(model: nn.Module, loss_fn: LossFn, split: Split) -> dict[int, dict]:
    """Accuracy (%) and mean loss per group id of ``split``."""
    out = model(split.x)
    losses = loss_fn(out, split.y)
    correct = (out.argmax(dim=1) == split.y).to(losses.dtype)
    return {
        int(k): {
            "n": int((split.g == k).sum()),
            "acc": float(100 * correct[split.g == k].mean()),
            "loss": float(losses[split.g == k].mean()),
        }
        for k in torch.unique(split.g)
    }


def _update(
    model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, variant: Variant, C0: float,
    params: list[nn.Parameter],
) -> Tensor:
    """The flat update vector of one batch (plain backward for ``sgd``: no per-sample work)."""
    if variant == "sgd":
        grads = torch.autograd.grad(loss_fn(model(x), y).mean(), params)
        return torch.cat([g.reshape(-1) for g in grads])
    return variant_step(*batch_gradients(model, loss_fn, x, y, C0), variant)


def train_direction_vs_magnitude(
    model: nn.Module,
    loss_fn: LossFn,
    train: Split,
    test: Split,
    variant: Variant,
    *,
    C0: float,
    lr: float,
    epochs: int,
    batch_size: int,
    seed: int = 0,
) -> dict:
    """Noise-free training with only one of clipping's two errors (Esipova et al. Table 1).

    Each step Poisson-samples a batch at rate batch_size/n, forms the unclipped mean gradient
    g_B and the mean ḡ_B of per-sample gradients clipped at ``C0``, and takes the plain SGD
    step θ ← θ − lr · :func:`variant_step`. Returns per-group accuracy (%) and loss on
    ``test`` at the end. Trains ``model`` in place. Opt-in, non-private (module docstring).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")
    gen = torch.Generator().manual_seed(seed)
    n = len(train)
    q = batch_size / n
    params = [p for p in model.parameters() if p.requires_grad]
    steps = int(round(epochs / q))
    for _ in range(steps):
        idx = torch.nonzero(torch.rand(n, generator=gen) < q).squeeze(1)
        if idx.numel() == 0:
            continue
        update = _update(model, loss_fn, train.x[idx], train.y[idx], variant, C0, params)
        if not bool(torch.isfinite(update).all()):
            continue
        offset = 0
        with torch.no_grad():
            for p in params:
                p -= lr * update[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
    return {
        "privacy": PRIVACY,
        "variant": variant,
        "C0": C0,
        "lr": lr,
        "epochs": epochs,
        "batch_size": batch_size,
        "steps": steps,
        "per_group": per_group_metrics(model, loss_fn, test),
    }
