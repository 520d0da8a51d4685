"""Per-group excessive-risk terms of clipping and noise (Esipova et al. 2023, Sec. 4, App. A-B).

**Opt-in and non-private.** These diagnostics use exact, un-noised training-set statistics
(full-data group gradients, Hessians, the unclipped batch gradient): every output carries
``"privacy": "non-private"`` and a run that logs them must be tagged
``dpfair.diagnostics=non-private``. :func:`dpfair.training.train` never
computes them (its callbacks see neither the model nor a batch's gradients): call
:func:`misalignment_report` from your own loop, with the batch's clipped and unclipped mean
gradients from :func:`dpfair.diagnostics.bias.batch_gradients`, every 50-200 steps as the
paper does (App. B.3).

Notation (the paper's): η learning rate, g_B / ḡ_B the unclipped / clipped mean gradient of a
batch B, g_{D_a} the exact mean gradient over all of group a's training samples, H_ℓ^a the mean
Hessian over group a, M_B the orthogonal map with M_B g_B colinear with ḡ_B and of norm ‖g_B‖,
so that M_B g_B = ‖g_B‖ ḡ_B / ‖ḡ_B‖, and r_B = ‖ḡ_B‖ / ‖g_B‖.

The expectations E[·] over batches in Props. 1-3 are estimated by the mean over the batches
handed in (one batch: the per-iteration value, as the paper plots it). Hessian terms use
Hessian-vector products and Hutchinson's trace estimator (App. B.3); ``hvp.py`` holds them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from dpfair.data.dataset import Split
from dpfair.diagnostics.hvp import (
    FlatModel,
    LossFn,
    hutchinson_trace,
    max_eigenvalue,
    mean_gradient,
    quadratic_forms,
)

PRIVACY = "non-private"


def _cos(u: Tensor, v: Tensor) -> Tensor:
    """Cosine of the angle between u and v (rows of v broadcast); 0 where a norm is 0."""
    denom = u.norm() * v.norm(dim=-1)
    return torch.where(denom > 0, (v @ u) / denom.clamp_min(1e-300), torch.zeros_like(denom))


def direction_step(g_B: Tensor, gbar_B: Tensor) -> Tensor:
    """M_B g_B = ‖g_B‖ ḡ_B / ‖ḡ_B‖: the clipped direction at the unclipped norm (Sec. 4)."""
    return g_B.norm(dim=-1, keepdim=True) * gbar_B / gbar_B.norm(dim=-1, keepdim=True)


def magnitude_step(g_B: Tensor, gbar_B: Tensor) -> Tensor:
    """(‖ḡ_B‖ / ‖g_B‖) g_B: the unclipped direction at the clipped norm (Sec. 4, Table 1)."""
    return gbar_B.norm(dim=-1, keepdim=True) / g_B.norm(dim=-1, keepdim=True) * g_B


def clipping_terms(
    g_Da: Tensor, g_B: Tensor, gbar_B: Tensor, q_g: Tensor, q_gbar: Tensor, lr: float
) -> dict[str, float]:
    """R_a^mag, R_a^dir (Prop. 2; R^dir in the form of Eq. 5) and R_a^clip (Prop. 1).

    ``g_B``, ``gbar_B``: shape ``(m, P)`` for m batches; ``q_g[j] = g_B^T H_ℓ^a g_B`` and
    ``q_gbar[j] = ḡ_B^T H_ℓ^a ḡ_B`` for batch j. With r = ‖ḡ_B‖/‖g_B‖ and
    (M_B g_B)^T H (M_B g_B) = ḡ_B^T H ḡ_B / r², Prop. 2 reads

        R^mag = η ⟨g_{D_a}, E[(1 − r) g_B]⟩ + η²/2 E[(r² − 1) g_B^T H g_B]
        R^dir = η ⟨g_{D_a}, E[r (g_B − M_B g_B)]⟩
                + η²/2 E[r² ((M_B g_B)^T H (M_B g_B) − g_B^T H g_B)]
        R^clip = η ⟨g_{D_a}, E[g_B − ḡ_B]⟩ + η²/2 (E[ḡ_B^T H ḡ_B] − E[g_B^T H g_B]) = R^mag + R^dir.
    """
    r = gbar_B.norm(dim=1) / g_B.norm(dim=1)
    u = direction_step(g_B, gbar_B)
    q_u = q_gbar / r**2
    mag_first = lr * (g_B @ g_Da * (1 - r)).mean()
    mag_second = lr**2 / 2 * ((r**2 - 1) * q_g).mean()
    dir_first = lr * (((g_B - u) @ g_Da) * r).mean()
    dir_second = lr**2 / 2 * (r**2 * (q_u - q_g)).mean()
    clip = lr * ((g_B - gbar_B) @ g_Da).mean() + lr**2 / 2 * (q_gbar - q_g).mean()
    return {
        "R_mag": float(mag_first + mag_second),
        "R_mag_inner_product_term": float(mag_first),
        "R_mag_hessian_term": float(mag_second),
        "R_dir": float(dir_first + dir_second),
        "R_dir_inner_product_term": float(dir_first),
        "R_dir_hessian_term": float(dir_second),
        "R_clip": float(clip),
    }


def noise_term(trace_H: float, lr: float, C0: float, sigma: float) -> float:
    """R_a^noise = η²/2 Tr(H_ℓ^a) C0² σ² (Prop. 1; Esipova et al. App. B.7).

    This is the paper's formula. Under Alg. 1 the noise N(0, σ²C0²I) is divided by the batch
    size |B| before the step, so the second-order loss increase it causes is this value / |B|²;
    the paper (and its code) report it without that factor, and so does this function.
    """
    return lr**2 / 2 * trace_H * C0**2 * sigma**2


def prop3(
    g_Da: Tensor, g_Db: Tensor, g_B: Tensor, gbar_B: Tensor, lr: float
) -> dict[str, float | bool]:
    """Both sides of Prop. 3's sufficient condition for R_a^dir > R_b^dir (Eq. 4 = Eq. 6 = 13).

    With X_k = E[‖ḡ_B‖ (cos θ_B^k − cos θ̄_B^k)], θ_B^k = ∠(g_{D_k}, g_B), θ̄_B^k = ∠(g_{D_k}, ḡ_B):

        lhs = X_a,   rhs = (‖g_{D_b}‖ / ‖g_{D_a}‖) X_b + E[‖ḡ_B‖²] / ‖g_{D_a}‖,

    and the lower bound it comes from (Eq. 12, which assumes η ≤ 1/max_k λ_k):
    R_a^dir − R_b^dir ≥ η (‖g_{D_a}‖ X_a − ‖g_{D_b}‖ X_b − E[‖ḡ_B‖²]).
    """
    norm_gbar = gbar_B.norm(dim=1)
    x = {
        k: (norm_gbar * (_cos(g, g_B) - _cos(g, gbar_B))).mean()
        for k, g in (("a", g_Da), ("b", g_Db))
    }
    sq = (norm_gbar**2).mean()
    na, nb = g_Da.norm(), g_Db.norm()
    lhs = x["a"]
    rhs = nb / na * x["b"] + sq / na
    return {
        "prop3_lhs": float(lhs),
        "prop3_rhs": float(rhs),
        "prop3_holds": bool(lhs > rhs),
        "X_a": float(x["a"]),
        "X_b": float(x["b"]),
        "R_dir_gap_lower_bound": float(lr * (na * x["a"] - nb * x["b"] - sq)),
    }


def prop3_lambda_bound(
    X_a: float, X_b: float, norm_g_Da: float, norm_g_Db: float,
    mean_sq_norm_gbar: float, lambda_a: float, lambda_b: float, lr: float,
) -> float:
    """Eq. 11, which needs λ_a, λ_b but not η ≤ 1/max_k λ_k:

    R_a^dir − R_b^dir ≥ η (‖g_{D_a}‖ X_a − ‖g_{D_b}‖ X_b) − η²/2 (λ_a + λ_b) E[‖ḡ_B‖²].
    """
    return lr * (norm_g_Da * X_a - norm_g_Db * X_b) - lr**2 / 2 * (
        lambda_a + lambda_b
    ) * mean_sq_norm_gbar


def tran_bound(
    g_Da: Tensor, g_Db: Tensor, g_B: Tensor, gbar_B: Tensor, lr: float
) -> float:
    """Norm-only lower bound on R_a^clip − R_b^clip in the manner of Tran et al. (2021a).

    Esipova et al. (Sec. 4, Sec. 6.3, Fig. 5) describe Tran et al.'s bound (proof of their
    Thm. 3) as turning every term of R^clip into group-gradient norms with x^T y ≥ −‖x‖ ‖y‖,
    which loses the direction information; they do not restate it. Tran et al.'s text was not
    available here, so this is that construction applied to R_a^clip − R_b^clip of Prop. 1
    with η ≤ 1/max_k λ_k (as in Eq. 12): both inner products ⟨g_{D_k}, g_B − ḡ_B⟩ are bounded
    by −‖g_{D_k}‖ ‖g_B − ḡ_B‖ and the Hessian terms, for PSD H, by −λ_a‖g_B‖² and −λ_b‖ḡ_B‖²:

        R_a^clip − R_b^clip ≥ −η (‖g_{D_a}‖ + ‖g_{D_b}‖) E‖g_B − ḡ_B‖ − η/2 E[‖g_B‖² + ‖ḡ_B‖²].

    It is never positive, as Esipova et al. observe of Tran's bound in Fig. 5. Check it
    against Tran et al. before citing numbers from it.
    """
    diff = (g_B - gbar_B).norm(dim=1).mean()
    sq = (g_B.norm(dim=1) ** 2 + gbar_B.norm(dim=1) ** 2).mean()
    return float(-lr * (g_Da.norm() + g_Db.norm()) * diff - lr / 2 * sq)


def _as_batches(t: Tensor, n_params: int, name: str) -> Tensor:
    t = t.detach()
    t = t.unsqueeze(0) if t.dim() == 1 else t
    if t.dim() != 2 or t.shape[1] != n_params:
        raise ValueError(f"{name} must have shape (P,) or (m, P) with P = {n_params}")
    if bool((t.norm(dim=1) == 0).any()):
        raise ValueError(f"{name} has a zero batch gradient: its direction is undefined")
    return t


def misalignment_report(
    model: nn.Module,
    loss_fn: LossFn,
    split: Split,
    groups: Sequence[int],
    clipped_batch_grad: Tensor,
    unclipped_batch_grad: Tensor,
    lr: float,
    C0: float,
    sigma: float,
    *,
    n_probes: int = 100,
    power_iters: int = 20,
    chunk_size: int = 1024,
    seed: int = 0,
) -> dict:
    """R_a^mag, R_a^dir, R_a^clip, R_a^noise per group and Prop. 3 / Tran bounds per group pair.

    ``split`` is the training split; group a's terms use all its samples (``split.g == a``):
    the exact g_{D_a} (App. B.3: "we use the exact g_D and g_{D_a}") and H_ℓ^a through
    Hessian-vector products. ``clipped_batch_grad`` ḡ_B and ``unclipped_batch_grad`` g_B are
    the mean clipped / unclipped per-sample gradients of the current batch (shape ``(P,)``) or
    of m batches (``(m, P)``, rows paired), flattened in ``model.parameters()`` order among
    trainable parameters. Tr(H_ℓ^a) is Hutchinson's estimate with ``n_probes`` Rademacher
    probes (App. B.3 uses 100); ``R_noise_se`` is its standard error. With ``power_iters > 0``
    the top Hessian eigenvalue λ_a is estimated, giving Eq. 11's bound and the check of
    Prop. 3's assumption η ≤ 1/max_k λ_k (App. B.6).

    Opt-in, non-private (module docstring): the result carries ``"privacy": "non-private"``.
    """
    fm = FlatModel(model, loss_fn)
    n_params = fm.theta.numel()
    g_B = _as_batches(unclipped_batch_grad, n_params, "unclipped_batch_grad").to(fm.theta.dtype)
    gbar_B = _as_batches(clipped_batch_grad, n_params, "clipped_batch_grad").to(fm.theta.dtype)
    if g_B.shape != gbar_B.shape:
        raise ValueError("clipped and unclipped batch gradients must have the same shape")

    per_group: dict[int, dict] = {}
    g_D: dict[int, Tensor] = {}
    for a in groups:
        mask = split.g == a
        x, y = split.x[mask].to(fm.theta.dtype), split.y[mask]
        if x.shape[0] == 0:
            raise ValueError(f"group {a} has no samples in the split")
        g_D[a] = mean_gradient(fm, x, y, chunk_size)
        q = quadratic_forms(fm, x, y, [*g_B, *gbar_B], chunk_size)
        terms = clipping_terms(g_D[a], g_B, gbar_B, q[: len(g_B)], q[len(g_B) :], lr)
        trace, trace_se = hutchinson_trace(fm, x, y, n_probes, seed, chunk_size)
        per_group[a] = {
            "n": int(x.shape[0]),
            "norm_g_D": float(g_D[a].norm()),
            "cos_g_D_g_B": float(_cos(g_D[a], g_B).mean()),
            "cos_g_D_gbar_B": float(_cos(g_D[a], gbar_B).mean()),
            **terms,
            "trace_H": trace,
            "trace_H_se": trace_se,
            "R_noise": noise_term(trace, lr, C0, sigma),
            "R_noise_se": noise_term(trace_se, lr, C0, sigma),
        }
        if power_iters > 0:
            per_group[a]["lambda_max"] = max_eigenvalue(fm, x, y, power_iters, seed, chunk_size)

    mean_sq_gbar = float((gbar_B.norm(dim=1) ** 2).mean())
    pairs = []
    for a, b in itertools.permutations(groups, 2):
        pa, pb = per_group[a], per_group[b]
        row = {
            "a": a,
            "b": b,
            **prop3(g_D[a], g_D[b], g_B, gbar_B, lr),
            "R_dir_gap": pa["R_dir"] - pb["R_dir"],
            "R_clip_gap": pa["R_clip"] - pb["R_clip"],
            "tran_R_clip_gap_lower_bound": tran_bound(g_D[a], g_D[b], g_B, gbar_B, lr),
        }
        if power_iters > 0:
            row["R_dir_gap_lower_bound_eq11"] = prop3_lambda_bound(
                row["X_a"], row["X_b"], pa["norm_g_D"], pb["norm_g_D"],
                mean_sq_gbar, pa["lambda_max"], pb["lambda_max"], lr,
            )
        pairs.append(row)

    report = {
        "privacy": PRIVACY,
        "lr": lr,
        "C0": C0,
        "sigma": sigma,
        "n_batches": int(g_B.shape[0]),
        "norm_g_B": float(g_B.norm(dim=1).mean()),
        "norm_gbar_B": float(gbar_B.norm(dim=1).mean()),
        "cos_g_B_gbar_B": float(torch.nn.functional.cosine_similarity(g_B, gbar_B).mean()),
        "groups": per_group,
        "pairs": pairs,
    }
    if power_iters > 0:
        lam = max(abs(p["lambda_max"]) for p in per_group.values())
        report["lr_assumption_holds"] = bool(lam == 0 or lr <= 1 / lam)
    return report

