"""Per-sample ascended gradients for BAM (Knolle et al., Alg. 2 line 4), and DP-SAT's shared
ascent (:class:`SharedAscent`). BAM:
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
  (:class:`dpfair.engine.gradients.GhostClipping`: the factors and ``|g_i|``); pass 2 runs it
  again with forward hooks adding the corrections (later layers see the ascended activations,
  as they must), so its ghost norms and weighted sum are those of the ascended gradients. The
  corrections reuse pass 1's per-layer state: its balanced factors, bias sums, a norm layer's
  per-sample gradients and a convolution's per-sample kernels where its norms formed them.
  Cost: about two DP-SGD steps. Every layer from the first trainable one on sees shifted
  inputs, so pass 2's forward and backward are needed whole.

Both clamp ``|g_i|`` to the smallest normal number before dividing (a zero gradient moves
nothing), and a sample with a non-finite norm gets a non-finite ascended norm (weight 0 in the
rule); samples never mix, so such a sample leaves every other one unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpfair.engine.conv_factors import padded_input
from dpfair.engine.gradients import (
    GhostClipping,
    LossFn,
    Materialized,
    PerSampleFn,
    PerSampleGradients,
    fast_path_obstacle,
    global_norm,
    plan_layers,
    trainable_parameters,
)
from dpfair.engine.layer_grads import (
    ConvGrads,
    DenseGrads,
    EmbeddingGrads,
    LayerGrads,
    PerSampleLayer,
    SequenceGrads,
    layer_factors,
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


class _Shift:
    """Forward hook adding sample ``i``'s ascent ``s_i`` (its share of ``lam u_i``) to a layer's
    output, built from pass 1's per-layer factors (the layer's
    :data:`dpfair.engine.layer_grads.LayerGrads`: nothing is formed twice). ``still``
    (``s_i = 0``: an infinite norm; ``None`` when there is none) gets no shift at all, as
    ``theta + 0 g_i`` is ``theta`` there (never ``0 * inf``)."""

    def __init__(self, scale: Tensor, still: Tensor | None) -> None:
        self.scale, self.dtype, self.still = scale, scale.dtype, still

    def shift(self, x: Tensor, shape: torch.Size) -> Tensor:
        """The change of the layer's output (of ``shape``, or broadcast to it) on its input
        ``x`` (floating inputs in the parameters' dtype)."""
        raise NotImplementedError

    def shifted(self, x: Tensor, output: Tensor) -> Tensor:
        """The layer's output on ``x`` at each sample's ascended parameters."""
        shift = self.shift(x, output.shape)
        if self.still is not None:
            shift = torch.where(self.still.view(-1, *([1] * (shift.dim() - 1))), 0, shift)
        return output + shift.to(output.dtype)

    def __call__(self, module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        x = args[0]
        with torch.autocast(x.device.type, enabled=False):  # the shift in full precision
            return self.shifted(x.to(self.dtype) if x.is_floating_point() else x, output)


class _LinearShift(_Shift):
    """A Linear's ascent on ``x_t``: ``s_i sum_s d_s (a_s . x_t + 1)`` over the positions ``s``
    of its pass-1 calls, from pass 1's balanced weight factors
    (:func:`dpfair.engine.factors.balance_factors`) with ``s_i`` on the output-gradient factor:
    a huge input with a zero output gradient, or a zero gradient (``s_i = lam / tiny``), then
    gives ``0 * finite`` and moves nothing, as on the materialised path."""

    def __init__(
        self, layer: DenseGrads | SequenceGrads, scale: Tensor, still: Tensor | None
    ) -> None:
        super().__init__(scale, still)
        b = len(scale)
        if isinstance(layer, DenseGrads):  # one position
            weight, a, d_w = layer.weight is not None, layer.a_w, layer.d_w
            bias = layer.d if layer.bias is not None else None
        else:
            weight, bias = layer.a is not None, layer.bias_grad
            a, d_w = layer.a, layer.d
        self.a = None if not weight else a.reshape(b, -1, a.shape[-1])  # (B, T, d_in)
        self.d_w = None if not weight else d_w.reshape(b, -1, d_w.shape[-1])  # (B, T, d_out)
        self.bias = None if bias is None else bias.reshape(b, -1)  # sum_s d_s
        # one position, factors not rescaled: the bias's and the weight's shifts share s_i d_i
        self.joint = isinstance(layer, DenseGrads) and weight and bias is not None and (
            layer.d_w is layer.d)

    def shift(self, x: Tensor, shape: torch.Size) -> Tensor:
        b, s = x.shape[0], self.scale.view(-1, 1)
        sb = None if self.bias is None else s * self.bias
        if self.a is None or self.d_w is None:  # bias only
            return sb.view(b, *([1] * (len(shape) - 2)), -1)  # type: ignore[union-attr]
        x = x.reshape(b, -1, x.shape[-1])  # (B, T', d_in)
        sd = s.unsqueeze(2) * self.d_w  # s_i on the output-gradient factor first
        if self.a.shape[1] == 1 and x.shape[1] == 1:  # one position: elementwise
            coeff = torch.linalg.vecdot(x, self.a)  # (B, 1)
            if sb is None:
                return (coeff * sd[:, 0]).view(shape)
            return torch.addcmul(sb, coeff, sd[:, 0]).view(shape)
        shift = torch.bmm(torch.bmm(x, self.a.transpose(1, 2)), sd)  # T' x T per sample
        return (shift if sb is None else shift + sb.unsqueeze(1)).view(shape)

    def shifted(self, x: Tensor, output: Tensor) -> Tensor:
        """With one position and unscaled factors: ``out + s_i d_i + (a_i . x) s_i d_i``."""
        if not self.joint or self.still is not None or output.dtype != self.dtype:
            return super().shifted(x, output)
        assert self.a is not None and self.d_w is not None
        sd = self.scale.unsqueeze(1) * self.d_w[:, 0]
        return torch.addcmul(output + sd, sd, torch.linalg.vecdot(x, self.a[:, 0]).unsqueeze(1))


class _ConvShift(_Shift):
    """A convolution's ascent: ``s_i (G_i * x + sum_p d_p)``, ``G_i`` sample ``i``'s weight
    gradient ``sum_p d_p patch_p^T`` over pass 1's output positions ``p``: pass 1's per-sample
    kernels where its norms formed them (:class:`dpfair.engine.layer_grads.ConvGrads`,
    ``kernels``), applied by one grouped convolution with ``B x groups`` groups; else, where
    there are few positions, the Gram form ``s_i sum_p d_p (patch_p . patch'_q)`` of im2col
    patches (pass 1's balanced factors), or the kernels formed here (one grouped
    ``conv2d_weight`` per call)."""

    def __init__(self, layer: ConvGrads, scale: Tensor, still: Tensor | None) -> None:
        super().__init__(scale, still)
        module = self.module = layer.module
        b = len(scale)
        c_out, c_in_g, kh, kw = module.weight.shape
        calls = layer.calls  # balanced; empty for a frozen weight
        positions = sum(d.shape[-1] * d.shape[-2] for _, d in calls)
        self.kernels = None  # (B c_out, c_in / groups, kh, kw): s_i G_i
        self.factors = None  # Gram form: patches (B, T, G, c_in_g kh kw), s_i d (B, T, G, c_out_g)
        kernels = layer.kernels
        if calls and kernels is None and gram_is_cheaper(
            positions, c_in_g * kh * kw, c_out // module.groups
        ):
            factors = [layer_factors(module, a, d) for a, d in calls]
            a, d = (torch.cat(t, 1) for t in zip(*factors, strict=True))  # calls are positions
            self.factors = (a, scale.view(-1, 1, 1, 1) * d)
        elif calls:
            if kernels is None:
                kernels = sum(
                    torch.nn.grad.conv2d_weight(
                        padded_input(module, a).flatten(0, 1).unsqueeze(0),
                        (b * c_out, c_in_g, kh, kw), d.flatten(0, 1).unsqueeze(0),
                        stride=module.stride, padding=0, dilation=module.dilation,
                        groups=b * module.groups,
                    )
                    for a, d in calls
                )
            self.kernels = scale.repeat_interleave(c_out).view(-1, 1, 1, 1) * kernels
        self.sb = None  # s_i sum_p d_p: the bias's shift
        if layer.bias_grad is not None:
            self.sb = scale.view(-1, 1) * layer.bias_grad

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
    affine weight and bias (pass 1's, small: the size of those parameters)."""

    def __init__(
        self, module: nn.LayerNorm | nn.GroupNorm, layer: PerSampleLayer, scale: Tensor,
        still: Tensor | None,
    ) -> None:
        super().__init__(scale, still)
        self.module, grads = module, layer.grads
        self.grads = {  # s_i times the per-sample gradient, per affine parameter
            name: scale.view(-1, *([1] * p.dim())) * grads[p]
            for name, p in (("weight", module.weight), ("bias", module.bias)) if p in grads
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

    def __init__(self, grads: EmbeddingGrads, scale: Tensor, still: Tensor | None) -> None:
        super().__init__(scale, still)
        b, t = grads.ids.shape  # ids (B, T), d (B, T, dim), padding zeroed
        self.v = grads.module.num_embeddings
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


def _shift(module: nn.Module, layer: LayerGrads, scale: Tensor, still: Tensor | None) -> _Shift:
    """The forward hook shifting ``module``'s output by each sample's ascent, from pass 1's
    per-sample gradients of that layer (``layer``)."""
    if isinstance(layer, DenseGrads | SequenceGrads):
        return _LinearShift(layer, scale, still)
    if isinstance(layer, ConvGrads):
        return _ConvShift(layer, scale, still)
    if isinstance(layer, EmbeddingGrads):
        return _EmbeddingShift(layer, scale, still)
    assert isinstance(module, nn.LayerNorm | nn.GroupNorm) and isinstance(layer, PerSampleLayer)
    return _NormShift(module, layer, scale, still)


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
        self.keeps_kernels = True  # pass 1 keeps the convolutions' per-sample kernels
        try:
            norms = super().compute(model, loss_fn, x, y, groups)  # pass 1, at theta
        finally:
            self.keeps_kernels = False
        if self._whole_model() is not None or self.lam == 0:
            self._calls = {}
            return norms
        losses, scale = self.losses, ascent_scale(self.lam, norms)
        still = scale == 0
        still = still if bool(still.any()) else None
        with torch.autocast(x.device.type, enabled=False):  # as the engine forms its norms
            # no fallback layers here: pass 1's layers are its fast layers, in order
            shifts = [(m, _shift(m, layer, scale, still))
                      for m, layer in zip(self._calls, self._layers, strict=True)]
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


class SharedAscent(PerSampleGradients):
    """DP-SAT (Park et al.): wraps an engine, per-sample gradients at the one point
    ``theta + rho d / |d|`` of every sample, ``d`` the last release (post-processing)."""

    def __init__(self, inner: PerSampleGradients, rho: float) -> None:
        self.inner, self.rho = inner, rho
        self.direction: list[Tensor] | None = None

    def compute(
        self, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, groups: Tensor | None = None
    ) -> Tensor:
        if self.direction is None:  # first step: nothing released yet
            norms = self.inner.compute(model, loss_fn, x, y, groups)
        else:
            params = trainable_parameters(model)
            saved = [p.detach().clone() for p in params]
            with torch.no_grad():
                for p, d in zip(params, self.direction, strict=True):
                    p.add_(d)
            try:
                norms = self.inner.compute(model, loss_fn, x, y, groups)
            finally:
                with torch.no_grad():
                    for p, s in zip(params, saved, strict=True):
                        p.copy_(s)
        self.losses = self.inner.losses
        return norms

    def weighted_grad(self, weights: Tensor) -> list[Tensor]:
        return self.inner.weighted_grad(weights)

    def add_weighted_grad(self, weights: Tensor, into: list[Tensor]) -> None:
        self.inner.add_weighted_grad(weights, into)

    def release(self) -> None:
        self.inner.release()

    def observe(self, private_grad: list[Tensor]) -> None:
        self.inner.observe(private_grad)
        norm = global_norm(private_grad)
        if torch.isfinite(norm) and norm > 0:
            self.direction = [(self.rho / norm) * g.detach() for g in private_grad]
