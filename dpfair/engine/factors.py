"""Per-sample gradient factors: keeping them in range, and what forming their products costs.

Range. A layer's per-sample gradient ``g_i = sum_t d_t a_t^T`` is exact from its factors as long as
their squared norms are normal numbers of the dtype (:func:`all_normal`, one check for many
tensors); otherwise :func:`balance_factors` rescales each sample's factors by opposite powers
of two (exact), so that products, Gram matrices and the weighted sum stay in range wherever
``|g_i|^2`` does (see :mod:`dpfair.engine.gradients`, "Overflow").

Cost. Per-sample gradients or Gram matrices are formed a chunk of samples at a time, the chunk
sized to a memory budget that knows the device and the ``max_engine_memory`` setting
(:func:`engine_budget`, :func:`engine_memory`), and per layer by the
route of least estimated time (:func:`cheapest`: flops, elements moved and kernel launches).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


def mask_rows(t: Tensor, keep: Tensor | None) -> Tensor:
    """Zero the rows outside ``keep``, so that a non-finite sample cannot turn a sum into NaN."""
    return t if keep is None else torch.where(keep.view(-1, *([1] * (t.dim() - 1))), t, 0)


def balanced(
    a: Tensor, d: Tensor, normal: bool | None
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """:func:`balance_factors` of ``a`` and ``d``, skipped (no norms formed) when ``normal``
    says a check over the whole model passed."""
    if normal:
        return a, d, None, None
    return balance_factors(a, d, row_sq_norms(a), row_sq_norms(d))


#: A layer's per-sample norm parts: ``(norms, squares)``, tensors of shape ``(B,)`` or
#: ``(k, B)`` whose squares and whose entries, summed, give ``|g_i|^2``: most parts are norms
#: (one reduction each), squared and summed for all layers at once (:func:`square_sum`).
NormParts = tuple[list[Tensor], list[Tensor]]


def cat_parts(parts: list[Tensor], dim: int = 0) -> Tensor:
    """``torch.cat`` with no copy for one part."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def square_sum(parts: NormParts) -> Tensor:
    """``|g_i|^2`` from norm parts (:data:`NormParts`): one concatenation, one square and one
    sum for all the norms, one sum for the squares (few kernels for any number of layers)."""
    norms, squares = parts
    total = None
    if norms:
        total = cat_parts([n.view(-1, n.shape[-1]) for n in norms]).square().sum(0)
    if squares:
        summed = cat_parts([s.view(-1, s.shape[-1]) for s in squares]).sum(0)
        total = summed if total is None else total + summed
    if total is None:
        raise ValueError("square_sum needs at least one norm part")
    return total


def factor_norm_parts(a: Tensor, d: Tensor, gram: bool) -> NormParts:
    """Per-sample ``|sum_t d_t a_t^T|`` for ``a: (B, G, K, T)``, ``d: (B, G, O, T)``: the Gram
    trick ``<a^T a, d^T d>`` (``B T^2 (K + O)`` flops, a squared norm) or the norm of the
    materialised gradient (``B T K O``), one batched matmul each way (the mixed ghost norm of
    Bu et al., ICML 2023, Sec. 3)."""
    if gram:
        aa = torch.einsum("bgkt,bgks->bgts", a, a)
        dd = torch.einsum("bgot,bgos->bgts", d, d)
        return [], [torch.linalg.vecdot(aa.flatten(1), dd.flatten(1))]
    return [row_norms(torch.einsum("bgkt,bgot->bgko", a, d))], []


def row_sq_norms(t: Tensor) -> Tensor:
    """Per-sample squared norm over all but the batch axis."""
    return row_norms(t).square()


def row_norms(t: Tensor) -> Tensor:
    """Per-sample norm over all but the batch axis (one reduction, no ``B x n`` temporary as
    ``vecdot`` has)."""
    return torch.linalg.vector_norm(t if t.dim() == 2 else t.reshape(t.shape[0], -1), dim=1)


def same_dtype(tensors: list[Tensor]) -> bool:
    return all(t.dtype == tensors[0].dtype for t in tensors)


def cast_float(value: Any, dtype: torch.dtype) -> Any:
    """A floating tensor in ``dtype`` (autocast's bf16 activations and output gradients are
    widened, so norms and the weighted sum are formed from the same tensors in full precision);
    anything else unchanged."""
    if isinstance(value, Tensor) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    return value


def in_dtype(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` in ``dtype`` (no call at all where it is already)."""
    return t if t.dtype == dtype else t.to(dtype)


@functools.cache
def _powers_of_two(dtype: torch.dtype, device: torch.device) -> tuple[Tensor, int]:
    """``2^j`` for ``j = -lim .. lim``, exact in ``dtype`` (``2^lim``: its largest power of 2)."""
    lim = math.frexp(torch.finfo(dtype).max)[1] - 1
    powers = [math.ldexp(1.0, j) for j in range(-lim, lim + 1)]
    return torch.tensor(powers, dtype=dtype, device=device), lim


def _exponents(t: Tensor) -> tuple[Tensor, Tensor]:
    """Per sample, the binary exponent ``e`` of the largest entry (``max |t_i|`` lies in
    ``[2^(e-1), 2^e)``) and whether the sample is all zero."""
    mantissa, exponent = torch.frexp(t.flatten(1).abs().amax(1))  # vector_norm(inf): slow on CPU
    return exponent, mantissa == 0


def all_normal(squares: list[Tensor]) -> bool:
    """Whether every entry of ``squares`` is a normal number of its dtype: neither zero,
    subnormal, infinite nor NaN. One reduction (NaN propagates through it) and one read, for
    any number of tensors of one dtype."""
    if any(sq.dtype != squares[0].dtype for sq in squares):
        return all(all_normal([sq]) for sq in squares)  # each in its own range
    flat = torch.cat(squares) if len(squares) > 1 else squares[0]
    if flat.numel() == 0:
        return True
    lo, hi = torch.stack(torch.aminmax(flat)).tolist()  # one device sync
    info = torch.finfo(flat.dtype)
    return info.tiny <= lo and hi <= info.max


def balance_factors(
    a: Tensor, d: Tensor, sq_a: Tensor, sq_d: Tensor, normal: bool | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(a, d, |a_i|^2, |d_i|^2)`` for the factors of per-sample gradients
    ``g_i = sum_t d_t a_t^T``, given their squared norms, rescaled where products could overflow.

    Unchanged when every ``|a_i|^2`` and ``|d_i|^2`` is a normal number (one check): their
    products then overflow or underflow only where ``|g_i|^2`` does. Otherwise (a huge input, a
    saturated or dead layer) ``(a_i 2^-k_i, d_i 2^k_i)`` for each sample, ``k_i`` half the gap
    between the binary exponents of the largest entries of ``a_i`` and ``d_i`` (a zero factor
    leaves the other scaled to about 1). ``g_i`` is unchanged (scaling by a power of two is
    exact) and both factors now have about the magnitude ``sqrt(max_jk |d_j a_k|)``: squared
    norms, Gram products and their products overflow or underflow only where ``|g_i|^2`` does,
    and the weighted sum's ``w_i a`` or ``w_i d`` stays near ``s / sqrt(|g_i|)`` for a weight
    ``w_i = s / |g_i|``. ``normal``: the outcome of that check if the caller made it
    already (:func:`all_normal` of ``sq_a`` and ``sq_d``, e.g. for several layers at once).
    """
    if normal is None:
        normal = all_normal([sq_a, sq_d])
    if normal:
        return a, d, sq_a, sq_d
    e_a, zero_a = _exponents(a)
    e_d, zero_d = _exponents(d)
    e_a = torch.where(zero_a, -e_d, e_a)
    e_d = torch.where(zero_d, -e_a, e_d)
    powers, lim = _powers_of_two(a.dtype, a.device)
    k = torch.div(e_a - e_d, 2, rounding_mode="floor").clamp_(-lim, lim)
    shape = (-1,) + (1,) * (a.dim() - 1)
    a, d = a * powers[lim - k].view(shape), d * powers[lim + k].view(shape)
    return a, d, row_sq_norms(a), row_sq_norms(d)


#: Bytes of per-sample intermediates one layer may hold at once on a device whose free memory
#: is not known (the CPU) when no cap is set; on a GPU a quarter of its free memory
#: (:func:`engine_budget`).
CPU_ENGINE_MEMORY = 1 << 29
#: The cap set by :func:`engine_memory` for the steps running inside it (bytes; ``None``: none).
_CAP: ContextVar[int | None] = ContextVar("engine_memory_cap", default=None)


@contextmanager
def engine_memory(cap: int | None) -> Iterator[None]:
    """Caps :func:`engine_budget` at ``cap`` bytes inside the block (``None``: no cap); the
    step sets it to half the ``max_engine_memory`` setting around its engine's passes (the
    other half is the rest of the step's, :meth:`dpfair.engine.step.PrivateStep.plan_memory`)."""
    if cap is not None and cap < 1:
        raise ValueError(f"an engine memory cap must be at least 1 byte, got {cap}")
    token = _CAP.set(cap)
    try:
        yield
    finally:
        _CAP.reset(token)


def engine_budget(device: torch.device) -> int:
    """Bytes one layer's per-sample intermediates (a chunk of per-sample gradients or Gram
    matrices, with its im2col patches) may take, and the most the layers' output gradients may
    take before the low-memory path forms norms inside the backward pass: the cap of
    :func:`engine_memory` where one is set, on a GPU at most a quarter of its free memory (one
    query per step), else :data:`CPU_ENGINE_MEMORY` on the CPU."""
    cap = _CAP.get()
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0] // 4
        return free if cap is None else min(cap, free)
    return CPU_ENGINE_MEMORY if cap is None else cap


@dataclass(frozen=True)
class _Device:
    """Rough per-device rates for :func:`cheapest`: flop/s, elements moved per second and
    seconds per kernel launch (a GPU step of small layers is launch-bound)."""

    flops: float
    elements: float
    launch: float


_RATES = {"cuda": _Device(2e13, 2.5e11, 5e-6), "cpu": _Device(3e10, 1e9, 2e-6)}


def chunks(batch: int, per_sample: int, budget: int) -> list[slice]:
    """Slices of the batch whose per-sample intermediates (``per_sample`` bytes each) fit in
    ``budget`` bytes (at least one sample per slice)."""
    step = max(1, budget // max(per_sample, 1))
    return [slice(i, min(i + step, batch)) for i in range(0, batch, step)]


@dataclass(frozen=True)
class Route:
    """One way to form a layer's per-sample squared norms, per sample: flops, elements moved,
    elements held at once, and kernel launches per chunk of samples."""

    flops: int
    moved: int
    held: int
    kernels: int


def cheapest(
    routes: dict[str, Route], b: int, itemsize: int, device: torch.device, budget: int
) -> str:
    """The route of least estimated time on ``device`` for a batch of ``b``: flops and
    elements moved per sample, and kernel launches once per chunk (each route's chunks fill
    ``budget`` bytes)."""
    rate = _RATES.get(device.type, _RATES["cuda"])

    def seconds(r: Route) -> float:
        launches = math.ceil(b / max(1, budget // max(r.held * itemsize, 1))) * r.kernels
        return b * (r.flops / rate.flops + r.moved / rate.elements) + launches * rate.launch

    return min(routes, key=lambda name: seconds(routes[name]))


def gram_route(
    b: int, t: int, d_in: int, d_out: int, itemsize: int, device: torch.device, budget: int
) -> bool:
    """Whether the ``T x T`` Gram trick beats materialising per-sample gradients for the
    squared norms of ``g_i = sum_t d_t a_t^T`` (``a``: ``T x d_in``, ``d``: ``T x d_out`` per
    sample), by :func:`cheapest`. Materialising: one batched matmul (``2 T d_in d_out`` flops)
    and the norm of its ``d_in d_out`` result; Gram: two ``T x T`` products and their inner
    product."""
    inputs = t * (d_in + d_out)
    routes = {
        "full": Route(2 * t * d_in * d_out, inputs + 2 * d_in * d_out, d_in * d_out, 3),
        "gram": Route(2 * t * t * (d_in + d_out + 1), inputs + 6 * t * t, 3 * t * t, 5),
    }
    return cheapest(routes, b, itemsize, device, budget) == "gram"
