"""Per-sample ascended gradients for BAM (Knolle et al., Alg. 2 line 4):
``g_i = grad l_i(theta + lam u_i)``, ``u_i = grad l_i(theta) / |grad l_i(theta)|`` (the global
norm over every trainable parameter).

* :class:`AscentMaterialized` -- the reference: ``vmap`` of two ``grad`` calls per sample.
* :class:`AscentGhost` -- the fast path for models whose trainable layers are all ``nn.Linear``
  (inputs ``(B, d)`` or ``(B, ..., d)``). A Linear's per-sample gradient is low rank in factored
  form, ``grad_W l_i = sum_t d_t a_t^T`` and ``grad_b l_i = sum_t d_t`` (``a`` its input, ``d``
  its output gradient, ``t`` over positions), so sample ``i``'s ascended layer applied to an
  input ``x_t`` is ``W x_t + b + s_i sum_s d_s (a_s . x_t + 1)``, ``s_i = lam / |g_i|``: the
  shared layer plus a per-sample correction (a ``T x T`` product on sequences). Pass 1 is the
  ghost-clipping pass at ``theta`` (:class:`dpfair.privacy.gradients.GhostClipping`: the factors
  and ``|g_i|``); pass 2 runs it again with forward hooks adding the corrections (later layers
  see the ascended activations, as they must), so its ghost norms and weighted sum are those of
  the ascended gradients. Cost: about two DP-SGD steps, no per-sample gradient materialised.

Both clamp ``|g_i|`` to the smallest normal number before dividing (a zero gradient moves
nothing), and a sample with a non-finite norm gets a non-finite ascended norm (weight 0 in the
rule); samples never mix, so such a sample leaves every other one unchanged.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dpfair.privacy.gradients import (
    GhostClipping,
    LossFn,
    Materialized,
    PerSampleFn,
    fast_path_obstacle,
    global_norm,
    plan_layers,
)
from dpfair.privacy.layer_grads import _balance, _sq


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


def ghost_ascent_obstacle(model: nn.Module) -> str | None:
    """Why :class:`AscentGhost` cannot serve ``model``, or ``None`` when every module owning
    trainable parameters is an ``nn.Linear`` with parameters of its own."""
    shared = fast_path_obstacle(model)
    if shared is not None:
        return shared
    plan = plan_layers(model)
    names = {id(m): n or "model" for n, m in model.named_modules()}
    others = [names[id(m)] for m in plan.fast if not isinstance(m, nn.Linear)]
    others += [name for name, _, _ in plan.slow]
    if others:
        return (
            f"{', '.join(others)} {'is' if len(others) == 1 else 'are'} not nn.Linear (the fast "
            "ascent rule covers Linear layers only)"
        )
    return None


def _positions(calls: list[Tensor], b: int) -> Tensor:
    """A layer's per-call tensors ``(B, ..., k)`` as one ``(B, T, k)``, the calls' positions
    concatenated (a view for one call)."""
    flat = [t.reshape(b, -1, t.shape[-1]) for t in calls]
    return flat[0] if len(flat) == 1 else torch.cat(flat, 1)


class _Correction:
    """Forward hook adding sample ``i``'s ascent to a Linear's output,
    ``s_i sum_s d_s (a_s . x_t + 1)`` over the positions ``s`` of the layer's pass-1 calls.

    The weight's factors are balanced first (:func:`dpfair.privacy.layer_grads._balance`) and
    ``s_i`` scales the output-gradient factor: a huge input with a zero output gradient, or a
    zero gradient (``s_i = lam / tiny``), then gives ``0 * finite``, never ``0 * inf``, and moves
    nothing, as on the materialised path. ``still`` (``s_i = 0``: an infinite norm; ``None``
    when there is none) gets no shift at all, as ``theta + 0 g_i`` is ``theta`` there.
    """

    def __init__(
        self, module: nn.Linear, calls: list[tuple[Tensor, Tensor]], scale: Tensor,
        still: Tensor | None,
    ) -> None:
        b, self.dtype = len(scale), scale.dtype
        scale = scale.view(-1, 1, 1)
        self.still = still
        d = _positions([d for _, d in calls], b)  # (B, T, d_out)
        self.a = self.sd = None
        if module.weight.requires_grad:
            a = _positions([a for a, _ in calls], b)  # (B, T, d_in)
            self.a, d_w, _, _ = _balance(a, d, _sq(a), _sq(d))
            self.sd = scale * d_w
        self.sb = None  # s_i sum_s d_s: the bias's shift, the same at every position
        if module.bias is not None and module.bias.requires_grad:
            self.sb = (scale * d).sum(1)

    def __call__(self, module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        x = args[0].to(self.dtype)
        b = x.shape[0]
        x = x.reshape(b, -1, x.shape[-1])  # (B, T', d_in)
        if self.a is None or self.sd is None:  # bias only
            shift = self.sb.unsqueeze(1).expand(b, x.shape[1], -1)  # type: ignore[union-attr]
        elif self.a.shape[1] == 1 and x.shape[1] == 1:  # one position: elementwise
            coeff = torch.linalg.vecdot(x, self.a)  # (B, 1)
            shift = coeff * self.sd[:, 0] if self.sb is None else torch.addcmul(
                self.sb, coeff, self.sd[:, 0]
            )
        else:  # a T' x T product per sample
            shift = torch.bmm(torch.bmm(x, self.a.transpose(1, 2)), self.sd)
            if self.sb is not None:
                shift = shift + self.sb.unsqueeze(1)
        if self.still is not None:
            shift = torch.where(self.still.view(-1, *([1] * (shift.dim() - 1))), 0, shift)
        return output + shift.reshape(output.shape).to(output.dtype)


class AscentGhost(GhostClipping):
    """BAM's ascended per-sample gradients on the fast path (module docstring); the model's
    trainable layers must all be ``nn.Linear`` (:func:`ghost_ascent_obstacle`). A model with a
    layer run without the batch axis is served whole by :class:`AscentMaterialized`."""

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
            return norms
        losses, scale = self.losses, ascent_scale(self.lam, norms)
        still = scale == 0
        still = still if bool(still.any()) else None
        hooks = [
            m.register_forward_hook(_Correction(m, calls, scale, still))  # type: ignore[arg-type]
            for m, calls in self._calls.items()
        ]
        try:
            norms = super().compute(model, loss_fn, x, y, groups)  # pass 2, ascended
        finally:
            for h in hooks:
                h.remove()
        self.losses = losses  # the loss at theta, as the materialised path reports
        return norms
