"""Clipping bias of the private gradient (Knolle et al. 2023, BAM, Sec. 4, Eq. 11).

**Opt-in and non-private**: computed from the un-noised per-sample gradients of a training
batch; every output carries ``"privacy": "non-private"``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from dpfair.diagnostics.hvp import FlatModel, LossFn
from dpfair.engine.gradients import make_engine
from dpfair.methods.dpsgd import Dpsgd

PRIVACY = "non-private"


def per_sample_gradients(model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor) -> Tensor:
    """Per-sample gradients g_i, flattened: shape ``(n, P)`` (materialised, torch.func vmap)."""
    fm = FlatModel(model, loss_fn)

    def one(theta: Tensor, xi: Tensor, yi: Tensor) -> Tensor:
        params = {**fm.unflatten(theta), **fm.buffers}
        out = functional_call(model, params, (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0)).sum()

    return vmap(grad(one), in_dims=(None, 0, 0))(fm.theta, x, y)


def batch_gradients(
    model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, C: float
) -> tuple[Tensor, Tensor]:
    """(g_B, ḡ_B): the unclipped and the clipped-at-C mean gradient of the batch ``(x, y)``,
    flattened in ``model.parameters()`` order. Both are reweighted sums of one per-sample
    gradient engine pass (the fast path where the model allows it), so nothing is materialised.
    """
    engine = make_engine(model)
    norms = engine.compute(model, loss_fn, x, y)
    b = len(x)
    clip = Dpsgd(C).rule(norms, torch.zeros_like(norms, dtype=torch.long)).weights  # min(1, C/|g|)

    def flat(weights: Tensor) -> Tensor:
        return torch.cat([g.reshape(-1) for g in engine.weighted_grad(weights)])

    return flat(torch.full_like(norms, 1.0 / b)), flat(clip / b)


def bias_report(unclipped_batch_grad: Tensor, clipped_batch_grad: Tensor) -> dict:
    """BAM's bias vector Bias(ĝ_clip, ĝ) = ḡ_clip − ĝ (Knolle et al. Eq. 11) and cos(ḡ_B, g_B).

    By Knolle et al.'s Lemma 1 the Gaussian noise adds no bias, so the clipping bias is the
    bias of the private gradient. It is zero when no per-sample norm exceeds the clipping
    bound. Returns the vector, its norm, its norm relative to ‖g_B‖ and the cosine similarity.
    Opt-in, non-private (module docstring).
    """
    g, gbar = unclipped_batch_grad.detach(), clipped_batch_grad.detach()
    bias = gbar - g
    g_norm = float(g.norm())
    return {
        "privacy": PRIVACY,
        "bias": bias,
        "bias_norm": float(bias.norm()),
        "relative_bias_norm": float(bias.norm()) / g_norm if g_norm > 0 else float("nan"),
        "cosine": float(torch.nn.functional.cosine_similarity(g, gbar, dim=0)),
        "norm_g_B": g_norm,
        "norm_gbar_B": float(gbar.norm()),
    }
