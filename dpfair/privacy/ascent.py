"""Per-sample ascended gradients for BAM (Knolle et al., Alg. 2 line 4):
``g_i = grad l_i(theta + lam u_i)``, ``u_i = grad l_i(theta) / |grad l_i(theta)|`` (the global
norm over every trainable parameter).

* :class:`AscentMaterialized` -- the reference: ``vmap`` of two ``grad`` calls per sample.
* :class:`AscentGhost` -- the fast path for models whose trainable layers all have a shift
  rule (:data:`ASCENT_LAYERS`: Linear, Conv2d, Embedding, LayerNorm, GroupNorm). A Linear's
  per-sample gradient is low rank in factored form, ``grad_W l_i = sum_t d_t a_t^T`` and
  ``grad_b l_i = sum_t d_t`` (``a`` its input, ``d`` its output gradient, ``t`` over
  positions), so sample ``i``'s ascended layer applied to an input ``x_t`` is
  ``W x_t + b + s_i sum_s d_s (a_s . x_t + 1)``, ``s_i = lam / |g_i|``: the shared layer plus a
  per-sample correction (a ``T x T`` product on sequences). A convolution's correction
  ``s_i (G_i * x + sum_p d_p)`` needs its per-sample kernels ``G_i`` (``B`` times its weight,
  formed once per step) and one grouped convolution; an embedding's is a per-(sample, token)
  row sum of ``s_i d``; a norm layer's ``s_i (x_hat gw_i + gb_i)`` uses its small per-sample
  affine gradients. Pass 1 is the ghost-clipping pass at ``theta``
  (:class:`dpfair.privacy.gradients.GhostClipping`: the factors and ``|g_i|``); pass 2 runs it
  again with forward hooks adding the corrections (later layers see the ascended activations,
  as they must), so its ghost norms and weighted sum are those of the ascended gradients.
  Cost: about two DP-SGD steps, and for a convolution its per-sample kernels.

Both clamp ``|g_i|`` to the smallest normal number before dividing (a zero gradient moves
nothing), and a sample with a non-finite norm gets a non-finite ascended norm (weight 0 in the
rule); samples never mix, so such a sample leaves every other one unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpfair.privacy.conv_factors import padded_input
from dpfair.privacy.factors import balanced
from dpfair.privacy.gradients import (
    GhostClipping,
    LossFn,
    Materialized,
    PerSampleFn,
    fast_path_obstacle,
    global_norm,
    plan_layers,
)
from dpfair.privacy.layer_grads import (
    EmbeddingGrads,
    layer_factors,
    norm_layer_grads,
)


def gram_is_cheaper(t: int, d_in: int, d_out: int) -> bool:
    """Gram trick (``B T^2 (d_in + d_out)`` flops) vs materialising (``B T d_in d_out``)."""
    return t * (d_in + d_out) < d_in * d_out


def ascent_scale(lam: float, norm: Tensor) -> Tensor:
    """``lam / |g_i|``, the norm clamped below to the smallest normal number (both paths)."""
    return lam / norm.clamp(min=torch.finfo(norm.dtype).tiny)


class AscentMaterialized(Materialized):
    """Materialised per-sample gradients taken after a per-sample SAM ascent of radius ``lam``."""

    def __init__(self, lam: float) -> None:
        super().__init__()
        self.lam = lam

    def per_sample_fn(self, grad_value: PerSampleFn) -> PerSampleFn:
        def ascended(p: dict[str, Tensor], xi: Tensor, yi: Tensor) -> tuple[dict, Tensor]:
            g, loss = grad_value(p, xi, yi)
            scale = ascent_scale(self.lam, global_norm(list(g.values())))
            g_at, _ = grad_value({n: p[n] + scale * g[n] for n in p}, xi, yi)
            return g_at, loss

        return ascended


#: Layers :class:`AscentGhost` shifts per sample in its second pass.
ASCENT_LAYERS: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Conv2d, nn.Embedding, nn.LayerNorm, nn.GroupNorm
)


def ghost_ascent_obstacle(model: nn.Module) -> str | None:
    """Why :class:`AscentGhost` cannot serve ``model``, or ``None`` when every module owning
    trainable parameters is one of :data:`ASCENT_LAYERS` with parameters of its own."""
    shared = fast_path_obstacle(model)
    if shared is not None:
        return shared
    plan = plan_layers(model)
    names = {id(m): n or "model" for n, m in model.named_modules()}
    others = [names[id(m)] for m in plan.fast if not isinstance(m, ASCENT_LAYERS)]
    others += [name for name, _, _ in plan.slow]
    if others:
        return (
            f"{', '.join(others)} {'is' if len(others) == 1 else 'are'} not among the layers "
            f"the fast ascent shifts per sample ({', '.join(t.__name__ for t in ASCENT_LAYERS)})"
        )
    return None


def _positions(calls: list[Tensor], b: int) -> Tensor:
    """A layer's per-call tensors ``(B, ..., k)`` as one ``(B, T, k)``, the calls' positions
    concatenated (a view for one call)."""
    flat = [t.reshape(b, -1, t.shape[-1]) for t in calls]
    return flat[0] if len(flat) == 1 else torch.cat(flat, 1)


class _Shift:
    """Forward hook adding sample ``i``'s ascent ``s_i`` (its share of ``lam u_i``) to a layer's
    output. ``still`` (``s_i = 0``: an infinite norm; ``None`` when there is none) gets no shift
    at all, as ``theta + 0 g_i`` is ``theta`` there (never ``0 * inf``)."""

    def __init__(self, scale: Tensor, still: Tensor | None) -> None:
        self.dtype, self.still = scale.dtype, still

    def shift(self, x: Tensor, shape: torch.Size) -> Tensor:
        """The change of the layer's output (of ``shape``, or broadcast to it) on its input
        ``x`` (floating inputs in the parameters' dtype)."""
        raise NotImplementedError

    def __call__(self, module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        x = args[0]
        with torch.autocast(x.device.type, enabled=False):  # the shift in full precision
            shift = self.shift(x.to(self.dtype) if x.is_floating_point() else x, output.shape)
        if self.still is not None:
            shift = torch.where(self.still.view(-1, *([1] * (shift.dim() - 1))), 0, shift)
        return output + shift.to(output.dtype)


class _LinearShift(_Shift):
    """A Linear's ascent on ``x_t``: ``s_i sum_s d_s (a_s . x_t + 1)`` over the positions ``s``
    of its pass-1 calls. The weight's factors are balanced first
    (:func:`dpfair.privacy.layer_grads.balance_factors`) and ``s_i`` scales the output-gradient
    factor: a huge input with a zero output gradient, or a zero gradient
    (``s_i = lam / tiny``), then gives ``0 * finite`` and moves nothing, as on the materialised
    path."""

    def __init__(
        self, module: nn.Linear, calls: list[tuple[Tensor, Tensor]], scale: Tensor,
        still: Tensor | None, normal: bool | None = None,
    ) -> None:
        super().__init__(scale, still)
        b, scale = len(scale), scale.view(-1, 1, 1)
        d = _positions([d for _, d in calls], b)  # (B, T, d_out)
        self.a = self.sd = None
        if module.weight.requires_grad:
            a = _positions([a for a, _ in calls], b)  # (B, T, d_in)
            self.a, d_w, _, _ = balanced(a, d, normal)
            self.sd = scale * d_w
        self.sb = None  # s_i sum_s d_s: the bias's shift, the same at every position
        if module.bias is not None and module.bias.requires_grad:
            self.sb = (scale * d).sum(1)

    def shift(self, x: Tensor, shape: torch.Size) -> Tensor:
        b = x.shape[0]
        if self.a is None or self.sd is None:  # bias only
            return self.sb.view(b, *([1] * (len(shape) - 2)), -1)  # type: ignore[union-attr]
        x = x.reshape(b, -1, x.shape[-1])  # (B, T', d_in)
        if self.a.shape[1] == 1 and x.shape[1] == 1:  # one position: elementwise
            coeff = torch.linalg.vecdot(x, self.a)  # (B, 1)
            if self.sb is None:
                return (coeff * self.sd[:, 0]).view(shape)
            return torch.addcmul(self.sb, coeff, self.sd[:, 0]).view(shape)
        shift = torch.bmm(torch.bmm(x, self.a.transpose(1, 2)), self.sd)  # T' x T per sample
        return (shift if self.sb is None else shift + self.sb.unsqueeze(1)).view(shape)


class _ConvShift(_Shift):
    """A convolution's ascent: ``s_i (G_i * x + sum_p d_p)``, ``G_i`` sample ``i``'s weight
    gradient ``sum_p d_p patch_p^T`` over pass 1's output positions ``p``. Like the engine's
    norms (the mixed rule), per layer whichever is cheaper: the ``B`` kernels ``G_i``
    materialised once (one grouped ``conv2d_weight`` per call) and applied by one grouped
    convolution with ``B x groups`` groups, or, where there are few positions, the Gram form
    ``s_i sum_p d_p (patch_p . patch'_q)`` of im2col patches (factors balanced as for a Linear).
    """

    def __init__(
        self, module: nn.Conv2d, calls: list[tuple[Tensor, Tensor]], scale: Tensor,
        still: Tensor | None, normal: bool | None = None,
    ) -> None:
        super().__init__(scale, still)
        self.module, b = module, len(scale)
        c_out, c_in_g, kh, kw = module.weight.shape
        positions = sum(d.shape[-1] * d.shape[-2] for _, d in calls)
        self.gram = gram_is_cheaper(positions, c_in_g * kh * kw, c_out // module.groups)
        self.kernels = None  # (B c_out, c_in / groups, kh, kw): s_i G_i
        self.factors = None  # Gram form: patches (B, T, G, c_in_g kh kw), s_i d (B, T, G, c_out_g)
        if module.weight.requires_grad and self.gram:
            factors = [layer_factors(module, a, d) for a, d in calls]
            a, d = (torch.cat(t, 1) for t in zip(*factors, strict=True))  # calls are positions
            a, d, _, _ = balanced(a, d, normal)
            self.factors = (a, scale.view(-1, 1, 1, 1) * d)
        elif module.weight.requires_grad:
            grads = [
                torch.nn.grad.conv2d_weight(
                    padded_input(module, a).flatten(0, 1).unsqueeze(0), (b * c_out, c_in_g, kh, kw),
                    d.flatten(0, 1).unsqueeze(0), stride=module.stride, padding=0,
                    dilation=module.dilation, groups=b * module.groups,
                )
                for a, d in calls
            ]
            self.kernels = scale.repeat_interleave(c_out).view(-1, 1, 1, 1) * sum(grads)
        self.sb = None  # s_i sum_p d_p: the bias's shift
        if module.bias is not None and module.bias.requires_grad:
            self.sb = scale.view(-1, 1) * sum(d.sum((2, 3)) for _, d in calls)

    def shift(self, x: Tensor, shape: torch.Size) -> Tensor:
        m, b = self.module, x.shape[0]
        shift: Tensor | None = None
        if self.factors is not None:
            a, sd = self.factors
            patches, _ = layer_factors(m, x, x.new_empty(shape))  # (B, T', G, c_in_g kh kw)
            coeff = torch.einsum("bqgi,bpgi->bgqp", patches, a)
            shift = torch.einsum("bgqp,bpgo->bgoq", coeff, sd).reshape(shape)
        elif self.kernels is not None:
            out = torch.nn.functional.conv2d(
                padded_input(m, x).flatten(0, 1).unsqueeze(0), self.kernels, stride=m.stride,
                dilation=m.dilation, groups=b * m.groups,
            )
            shift = out.view(b, m.out_channels, *out.shape[-2:])
        if self.sb is None:
            assert shift is not None
            return shift
        bias = self.sb.view(b, -1, 1, 1)
        return bias if shift is None else shift + bias


class _NormShift(_Shift):
    """A LayerNorm's or GroupNorm's ascent: ``s_i (x_hat gw_i + gb_i)``, ``x_hat`` the input
    normalised without the affine part and ``gw_i``, ``gb_i`` sample ``i``'s gradients of the
    affine weight and bias (small: the size of those parameters)."""

    def __init__(
        self, module: nn.LayerNorm | nn.GroupNorm, calls: list[tuple[Tensor, Tensor]],
        scale: Tensor, still: Tensor | None,
    ) -> None:
        super().__init__(scale, still)
        self.module = module
        per_call = [norm_layer_grads(module, a, d).grads for a, d in calls]
        self.grads = {  # s_i times the per-sample gradient, per affine parameter
            name: scale.view(-1, *([1] * p.dim())) * sum(c[p] for c in per_call)
            for name, p in (("weight", module.weight), ("bias", module.bias))
            if p is not None and p.requires_grad
        }

    def shift(self, x: Tensor, shape: torch.Size) -> Tensor:
        m, b = self.module, x.shape[0]
        if isinstance(m, nn.LayerNorm):
            inner = len(m.normalized_shape)
            view = (b, *([1] * (x.dim() - 1 - inner)), *m.normalized_shape)
            normalised = F.layer_norm(x, m.normalized_shape, eps=m.eps)
        else:
            view = (b, m.num_channels, *([1] * (x.dim() - 2)))
            normalised = F.group_norm(x, m.num_groups, eps=m.eps)
        shift = self.grads["bias"].view(view) if "bias" in self.grads else x.new_zeros(())
        if "weight" in self.grads:
            shift = shift + normalised * self.grads["weight"].view(view)
        return shift.expand(shape)


class _EmbeddingShift(_Shift):
    """An embedding's ascent: row ``k`` of sample ``i``'s weight moves by
    ``s_i sum_{t: id_t = k} d_t`` (pass 1's positions), so a position holding token ``k`` is
    shifted by that row sum: one sorted lookup of (sample, token) keys, never a ``V x d``
    matrix per sample. Positions holding ``padding_idx`` have no gradient, so no shift."""

    def __init__(
        self, module: nn.Embedding, calls: list[tuple[Tensor, Tensor]], scale: Tensor,
        still: Tensor | None,
    ) -> None:
        super().__init__(scale, still)
        grads = EmbeddingGrads(module, calls)  # ids (B, T), d (B, T, dim), padding zeroed
        b, t = grads.ids.shape
        self.v = module.num_embeddings
        keys = (torch.arange(b, device=grads.ids.device).unsqueeze(1) * self.v + grads.ids)
        self.keys, inverse = torch.unique(keys.flatten(), return_inverse=True)
        rows = grads.d.new_zeros(len(self.keys), grads.d.shape[-1])
        rows.index_add_(0, inverse, grads.d.reshape(b * t, -1))
        self.rows = scale[self.keys // self.v].unsqueeze(1) * rows

    def shift(self, x: Tensor, shape: torch.Size) -> Tensor:
        b = x.shape[0]
        keys = (torch.arange(b, device=x.device).view(-1, *([1] * (x.dim() - 1))) * self.v + x)
        keys = keys.flatten()
        at = torch.searchsorted(self.keys, keys).clamp(max=len(self.keys) - 1)
        found = (self.keys[at] == keys).unsqueeze(1)
        return torch.where(found, self.rows[at], 0).view(shape)


def _shift(
    module: nn.Module, calls: list[tuple[Tensor, Tensor]], scale: Tensor, still: Tensor | None,
    normal: bool | None,
) -> _Shift:
    """The forward hook shifting ``module``'s output by each sample's ascent; ``normal``: pass
    1's overflow check of all weight factors passed, so they need no rescaling."""
    if isinstance(module, nn.Linear):
        return _LinearShift(module, calls, scale, still, normal)
    if isinstance(module, nn.Conv2d):
        return _ConvShift(module, calls, scale, still, normal)
    if isinstance(module, nn.Embedding):
        return _EmbeddingShift(module, calls, scale, still)
    assert isinstance(module, nn.LayerNorm | nn.GroupNorm)
    return _NormShift(module, calls, scale, still)


class AscentGhost(GhostClipping):
    """BAM's ascended per-sample gradients on the fast path (module docstring); the model's
    trainable layers must all be :data:`ASCENT_LAYERS` (:func:`ghost_ascent_obstacle`). A model
    with a layer run without the batch axis is served whole by :class:`AscentMaterialized`."""

    keeps_calls = True

    def __init__(self, lam: float, clone_outputs: bool = False) -> None:
        super().__init__(clone_outputs)
        self.lam = lam

    def _whole_engine(self) -> Materialized:
        return AscentMaterialized(self.lam)

    def compute(
        self, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, groups: Tensor | None = None
    ) -> Tensor:
        norms = super().compute(model, loss_fn, x, y, groups)  # pass 1, at theta
        if self._whole_model() is not None or self.lam == 0:
            self._calls = {}
            return norms
        losses, scale = self.losses, ascent_scale(self.lam, norms)
        still = scale == 0
        still = still if bool(still.any()) else None
        with torch.autocast(x.device.type, enabled=False):  # as the engine forms its norms
            normal = self._normal or None  # pass 1's check of every weight factor
            shifts = [
                (m, _shift(m, calls, scale, still, normal)) for m, calls in self._calls.items()
            ]
        self._layers, self._calls = [], {}  # pass 1's state: the shifts hold what they need
        hooks = [m.register_forward_hook(shift) for m, shift in shifts]
        try:
            norms = super().compute(model, loss_fn, x, y, groups)  # pass 2, ascended
        finally:
            for h in hooks:
                h.remove()
        self._calls = {}
        self.losses = losses  # the loss at theta, as the materialised path reports
        return norms
