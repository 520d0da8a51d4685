"""FairLens's per-sample gradients (Tran et al. 2021, as implemented by Esipova et al.,
Alg. 4): those of ``l_i + gamma1 R1 + gamma2 R2`` for two groups ``a, b``, with
``R1 = |<g_{B_a} - g_{B_b}, gbar_B - g_B>|`` (group mean gradients; clipped minus unclipped
batch mean) and ``R2 = 1/2 (f_a (1 - f_a) + f_b (1 - f_b))`` (``f_k`` the group's mean
predicted probability of class 1). The regularisers are batch terms, so every
``g'_i = g_i + r`` with the same ``r = grad(gamma1 R1 + gamma2 R2)``.

``grad R1`` needs Hessian-vector products: writing
``u = g_{B_a} - g_{B_b} = grad sum_i alpha_i l_i`` and ``v = gbar_B - g_B = grad sum_i beta_i l_i``
with the clip factors held fixed, ``grad <u, v> = H_alpha v + H_beta u``: the gradient of
``s = sum_i (alpha_i <g_i, v> + beta_i <g_i, u>)`` with ``u`` and ``v`` held fixed (second
derivatives: the engine's per-layer factors do not hold them). Every ``<g_i, r>`` is first
order and comes from the engine's factors.

Both products share one forward, one backward with ``create_graph`` to the layer outputs and
one double backward (:func:`_products`); no parameter's gradient is formed with a graph. Where
every norm is finite these are the engine's own forward and backward, kept for it
(``GhostClipping(keep_graph=True)``, :class:`~dpfair.engine.gradients.KeptGraph`), so the
regulariser sees the dropout draws its ``g_i`` saw; otherwise (and on engines keeping no graph)
the regulariser runs its own forward on the finite samples and its own backward. A
layer ``z = f(a; W)`` linear in its parameters (:data:`TANGENT_LAYERS`) has
``<grad_W l_i, V> = <d_i, f(a_i; V)>`` (``d_i`` its output gradient), so its part of ``s`` is
``<d, alpha f(a; V) + beta f(a; U)>``: two forwards of the layer at its parts ``V``, ``U`` of
``v``, ``u``. A Linear applied once per sample may instead take the Gram route, cheaper where
``B (d_in + d_out) < 3 d_in d_out`` (the hidden layers of a wide MLP): with
``<g_i, g_j> = (a_i . a_j + 1)(d_i . d_j)``, its part is ``sum_ij c_ij K_ij G_ij``
(``c = alpha beta^T + beta alpha^T``, the ``j`` side held fixed), two ``B x B`` products
that never form ``U`` or ``V``. A model whose layers are all Linear forms each layer's ``U``,
``V`` from its own factors (only where needed); another takes them from the engine. A model
with a layer of another type, a layer called without the batch axis, or on the materialised
engine takes two weighted backwards to the parameters (``J^T alpha``, ``J^T beta``) instead;
the gradient is the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from dpfair.engine.gradients import (
    GhostClipping,
    KeptGraph,
    LossFn,
    PerSampleGradients,
    modifies_in_place,
    plan_layers,
    trainable_parameters,
)
from dpfair.engine.low_memory import cuda_devices, rng_state, set_rng_state

#: Layers linear in their own parameters: ``f(a; W)``'s derivative in direction ``V`` is
#: ``f(a; V)`` (the frozen parameters held at zero).
TANGENT_LAYERS: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Conv2d, nn.LayerNorm, nn.GroupNorm, nn.Embedding
)


def _positive_probability(outputs: Tensor) -> Tensor:
    if outputs.dim() == 2 and outputs.shape[1] == 2:
        return outputs.softmax(1)[:, 1]
    if outputs.dim() == 1 or (outputs.dim() == 2 and outputs.shape[1] == 1):
        return outputs.reshape(-1).sigmoid()
    raise ValueError(f"fairlens needs a binary classifier, got outputs {tuple(outputs.shape)}")


def _dot(xs: list[Tensor], ys: list[Tensor]) -> Tensor:
    """``<x, y>`` of two parameter-shaped lists (no copy into one vector)."""
    return torch.stack(
        [torch.vdot(a.reshape(-1), b.reshape(-1)) for a, b in zip(xs, ys, strict=True)]
    ).sum()


def _tangent_layers(model: nn.Module) -> list[nn.Module] | None:
    """The modules owning trainable parameters when every one is a :data:`TANGENT_LAYERS`
    layer the engine's fast path serves (an embedding that renormalises or rescales its rows
    is not linear in them), else ``None``."""
    plan = plan_layers(model)
    if plan.slow or not all(isinstance(m, TANGENT_LAYERS) for m in plan.fast):
        return None
    return plan.fast


def _tangent(module: nn.Module, a: Tensor, r: dict[nn.Parameter, Tensor]) -> Tensor:
    """``f(a; R)``: the layer's output at the parameters ``R`` (zero where ``r`` has none, as
    for a frozen parameter), its derivative in direction ``R`` at any parameters. An
    embedding's ``padding_idx`` row has no gradient, so positions holding it get none."""
    own = module.named_parameters(recurse=False)
    params = {n: r[p] if p in r else torch.zeros_like(p) for n, p in own}
    if isinstance(module, nn.Linear):
        return F.linear(a, params["weight"], params.get("bias"))
    out = functional_call(module, params, (a,))
    if isinstance(module, nn.Embedding) and module.padding_idx is not None:
        out = out.masked_fill((a == module.padding_idx).unsqueeze(-1), 0)
    return out


class _Capture:
    """Forward hooks keeping each tangent layer's input and output (a copy handed on where
    the model modifies outputs in place, so the kept output is the one the layer returned)."""

    def __init__(self, layers: list[nn.Module], clone: bool) -> None:
        self.calls: list[tuple[nn.Module, Tensor, Tensor]] = []
        self.clone = clone
        self.handles = [m.register_forward_hook(self) for m in layers]

    def __call__(self, module: nn.Module, args: tuple, output: Tensor) -> Any:
        self.calls.append((module, args[0], output))
        return output.clone() if self.clone else None

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


Directions = dict[nn.Parameter, Tensor]
#: A tangent layer's call: (module, input, output, output gradient), all with their graphs.
Call = tuple[nn.Module, Tensor, Tensor, Tensor | None]


def _gram_is_cheaper(module: nn.Module, calls: list[tuple[Tensor, Tensor, Tensor]]) -> bool:
    """Whether a Linear applied once per sample takes the Gram route of :func:`_products`
    (``2 B^2 (d_in + d_out)`` multiply-adds) rather than its sums and tangents
    (``6 B d_in d_out``)."""
    if not isinstance(module, nn.Linear) or len(calls) != 1 or calls[0][0].dim() != 2:
        return False
    b = calls[0][0].shape[0]
    return b * (module.in_features + module.out_features) < 3 * module.in_features * (
        module.out_features)


def _linear_sums(
    module: nn.Linear, calls: list[tuple[Tensor, Tensor, Tensor]], w: Tensor
) -> Directions:
    """``sum_i w_i g_i`` of a Linear's trainable parameters from its calls' (detached) factors."""
    out: Directions = {}
    wd = _rows([w.view(-1, *([1] * (d.dim() - 1))) * d.detach() for _, _, d in calls])
    if module.weight.requires_grad:
        out[module.weight] = torch.mm(wd.T, _rows([a.detach() for a, _, _ in calls]))
    if module.bias is not None and module.bias.requires_grad:
        out[module.bias] = wd.sum(0)
    return out


def _rows(parts: list[Tensor]) -> Tensor:
    """The positions of every call as rows of one matrix (no copy for one call of one)."""
    rows = [t.reshape(-1, t.shape[-1]) for t in parts]
    return rows[0] if len(rows) == 1 else torch.cat(rows)


def _output_grads(
    calls: list[tuple[nn.Module, Tensor, Tensor]], losses: Tensor
) -> list[Call] | None:
    """The captured calls with their output gradients ``d``: one backward of ``losses.sum()``
    to the layer outputs, with ``create_graph``. ``None`` where a layer ran without the batch
    axis (its output gradient sums over samples)."""
    batch = losses.shape[0]
    if any(out.dim() == 0 or out.shape[0] != batch for _, _, out in calls):
        return None
    if not calls:
        return []
    grads = torch.autograd.grad(
        losses.sum(), [out for _, _, out in calls], create_graph=True, allow_unused=True
    )
    return [(m, a, out, d) for (m, a, out), d in zip(calls, grads, strict=True)]


def _products(
    calls: list[Call], alpha: Tensor, beta: Tensor,
    engine_sums: Callable[[], tuple[Directions, Directions]],
) -> tuple[Tensor, Tensor] | None:
    """``s = sum_i (alpha_i <g_i, v> + beta_i <g_i, u>)`` as a function of theta (``v``, ``u``
    held fixed) and ``<u, v>``, from the tangent layers' calls with their output gradients
    ``d`` (:data:`Call`). Per layer: ``<d, alpha f(a; V) + beta f(a; U)>``, ``U``, ``V`` the
    layer's parts of ``u``, ``v`` (the engine's ``engine_sums``, or a Linear's own where every
    layer is one); or, for a Linear applied once per sample where cheaper, the Gram route
    ``s_l = <c * K, G>``, ``c = alpha beta^T + beta alpha^T``, ``K_ij = a_i . a_j + 1`` and
    ``G_ij = d_i . d_j`` (the ``j`` side held fixed: ``<g_i, g_j> = K_ij G_ij``), which never
    forms ``U`` or ``V``."""
    by_layer: dict[nn.Module, list[tuple[Tensor, Tensor, Tensor]]] = {}
    dtype = alpha.dtype  # under autocast: the products in the parameters' dtype, as the engine
    for module, a, out, d in calls:
        if d is not None:
            a = a.to(dtype) if a.is_floating_point() else a
            by_layer.setdefault(module, []).append((a, out, d.to(dtype)))
    device = alpha.device.type
    if torch.is_autocast_enabled(device):
        with torch.autocast(device, enabled=False):
            return _layer_products(by_layer, alpha, beta, engine_sums)
    return _layer_products(by_layer, alpha, beta, engine_sums)


def _layer_products(
    by_layer: dict[nn.Module, list[tuple[Tensor, Tensor, Tensor]]], alpha: Tensor, beta: Tensor,
    engine_sums: Callable[[], tuple[Directions, Directions]],
) -> tuple[Tensor, Tensor] | None:
    """:func:`_products` from each layer's calls ``(input, output, output gradient)``."""
    batch = alpha.shape[0]
    own = all(isinstance(m, nn.Linear) for m in by_layer)  # each Linear forms its own U, V
    u, v = ({}, {}) if own else engine_sums()
    c = torch.outer(alpha, beta)
    c = c + c.T
    terms, uv = [], []
    for module, layer_calls in by_layer.items():
        if own and _gram_is_cheaper(module, layer_calls):
            a, _, d = layer_calls[0]
            weight, bias = module.weight.requires_grad, module.bias is not None and (
                module.bias.requires_grad)
            one = a.new_ones(()) if bias else a.new_zeros(())
            k = torch.addmm(one, a, a.detach().T) if weight else one
            g = d @ d.detach().T
            terms.append(torch.vdot((c * k).reshape(-1), g.reshape(-1)))
            uv.append(terms[-1].detach() / 2)  # <c * K, G> = 2 alpha^T (K * G) beta = 2 <U, V>
            continue
        if own:
            assert isinstance(module, nn.Linear)
            u.update(_linear_sums(module, layer_calls, alpha))
            v.update(_linear_sums(module, layer_calls, beta))
            uv += [torch.vdot(u[p].reshape(-1), v[p].reshape(-1)) for p in module.parameters(
                recurse=False) if p.requires_grad]
        for a, out, d in layer_calls:
            view = (batch, *([1] * (out.dim() - 1)))  # the sample weights against the output
            both = torch.addcmul(
                alpha.view(view) * _tangent(module, a, v), beta.view(view), _tangent(module, a, u)
            )
            terms.append(torch.vdot(d.reshape(-1), both.reshape(-1)))
    if not terms:
        return None
    if not own:
        uv = [_dot(list(u.values()), [v[p] for p in u])]
    return torch.stack(terms).sum(), torch.stack(uv).sum()


def _from_kept(kept: KeptGraph) -> tuple[Tensor, Tensor, Callable[[], list[Call] | None]]:
    """The engine's outputs, losses and tangent layers' calls (:class:`KeptGraph`)."""
    calls = kept.calls
    return kept.outputs, kept.losses, lambda: calls


class RegularisedGradients(PerSampleGradients):
    """Wraps an engine: ``g'_i = g_i + r`` with ``r`` the gradient of the FairLens regularisers."""

    chunkable = False  # r is a batch term

    def __init__(self, inner: PerSampleGradients, C: float, gamma1: float, gamma2: float) -> None:
        self.inner, self.C, self.gamma1, self.gamma2 = inner, C, gamma1, gamma2
        self.shared: list[Tensor] = []
        self._model: nn.Module | None = None  # the model _layers and _clone were found for
        self._layers: list[nn.Module] | None = None
        self._clone = False
        self._trainable: list[bool] = []

    def _tangent(self, model: nn.Module) -> bool:
        """Whether the products are factored per layer (:func:`_tangent_layers`, found again
        for another model or when a parameter's ``requires_grad`` changed): not on the
        materialised engine nor with another layer type."""
        trainable = [p.requires_grad for p in model.parameters()]
        if self._model is not model or trainable != self._trainable:
            fast = isinstance(self.inner, GhostClipping)
            self._layers = _tangent_layers(model) if fast else None
            self._model, self._clone = model, modifies_in_place(model)
            self._trainable = trainable
        return self._layers is not None

    def _own_pass(
        self, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, tangent: bool
    ) -> tuple[Tensor, Tensor, Callable[[], list[Call] | None]]:
        """The regulariser's own forward on ``x`` (the finite samples): the outputs, the
        losses and (on a call) the tangent layers' calls with their output gradients."""
        capture = _Capture(self._layers or [], self._clone) if tangent else None
        try:
            outputs = model(x)
        finally:
            if capture is not None:
                capture.remove()
        losses = loss_fn(outputs, y)
        captured = [] if capture is None else capture.calls
        return outputs, losses, lambda: _output_grads(captured, losses)

    def compute(
        self, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, groups: Tensor | None = None
    ) -> Tensor:
        if groups is None:
            raise ValueError("fairlens needs the group ids of the batch")
        tangent = self._tangent(model)
        if isinstance(self.inner, GhostClipping):  # its forward and backward serve R1's too
            self.inner.keep_graph = tangent and self.gamma1 != 0
        state = rng_state(x.device)  # what the engine's forward draws (dropout)
        norms = self.inner.compute(model, loss_fn, x, y)
        self.losses = self.inner.losses
        keep = torch.isfinite(norms)  # the regularisers are formed from the finite samples
        every = bool(keep.all())
        params = trainable_parameters(model)
        xk, yk = (x, y) if every else (x[keep], y[keep])
        kept = self.inner.take_graph() if isinstance(self.inner, GhostClipping) else None
        if kept is not None and every:
            outputs, losses, calls = _from_kept(kept)
        else:
            state = rng_state(x.device)  # what the regulariser's own forward draws
            outputs, losses, calls = self._own_pass(model, loss_fn, xk, yk, tangent)
        del kept
        reg = self._regulariser(norms, keep, groups, outputs, losses, params, calls)
        del outputs, losses, calls  # the double backward frees the graph as it goes
        if reg.requires_grad:
            grads = torch.autograd.grad(reg, params, allow_unused=True)
        else:
            grads = (None,) * len(params)
        self.shared = [
            torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)
        ]
        sq = norms.square() + _dot(self.shared, self.shared)
        cross = self.inner.per_sample_dots(self.shared)  # <g_i, r> from the engine's factors
        if cross is None:  # an engine keeping none: J r = d/dv <J^T v, r>, a double backward
            with torch.random.fork_rng(devices=cuda_devices(x.device)):
                set_rng_state(state, x.device)  # the regulariser's forward again, its draws
                losses = loss_fn(model(xk), yk)
            v = torch.ones_like(losses, requires_grad=True)
            jt_v = torch.autograd.grad(losses, params, v, create_graph=True)
            cross = torch.autograd.grad(_dot(list(jt_v), self.shared), v)[0]
        elif not every:
            cross = cross[keep]
        if every:
            sq.add_(cross.detach(), alpha=2)
        else:
            sq[keep] = sq[keep] + 2 * cross.detach()
        return sq.clamp(min=0).sqrt()

    def _regulariser(
        self,
        norms: Tensor,
        keep: Tensor,
        groups: Tensor,
        outputs: Tensor,
        losses: Tensor,
        params: list[nn.Parameter],
        calls: Callable[[], list[Call] | None],
    ) -> Tensor:
        """``gamma1 R1 + gamma2 R2`` as a function of theta, with the clip factors held fixed.
        ``keep``: the finite samples, those ``outputs`` and ``losses`` are of (a group mean of
        the probabilities is a masked sum, so an empty group adds nothing to R2). ``calls``:
        the tangent layers' calls with their output gradients (empty on another route,
        ``None`` where a layer ran without the batch axis), formed only where R1 is."""
        every = len(losses) == len(keep)
        kept = groups if every else groups[keep]
        member = (kept.unsqueeze(1) == torch.arange(2, device=kept.device)).to(outputs.dtype)
        f = (_positive_probability(outputs) @ member) / member.sum(0).clamp(min=1)
        total = self.gamma2 * 0.5 * (f * (1 - f)).sum()  # R2
        in_group = [(keep & (groups == k)).to(norms.dtype) for k in (0, 1)]
        sizes = [m.sum() for m in in_group]
        if sizes[0] == 0 or sizes[1] == 0 or self.gamma1 == 0:  # R1 needs both groups
            return total
        alpha = in_group[0] / sizes[0] - in_group[1] / sizes[1]  # in the norms' precision
        beta = torch.where(keep, ((self.C / norms).clamp(max=1.0) - 1) / keep.sum(), 0.0)

        def engine_sums() -> tuple[Directions, Directions]:
            u, v = self.inner.weighted_grad(alpha), self.inner.weighted_grad(beta)
            return dict(zip(params, u, strict=True)), dict(zip(params, v, strict=True))

        found = None
        layer_calls = calls()
        if layer_calls:
            found = _products(
                layer_calls, alpha if every else alpha[keep], beta if every else beta[keep],
                engine_sums,
            )
        del layer_calls
        if found is None:  # two weighted backwards to the parameters
            u, v = (list(t.values()) for t in engine_sums())
            ju = torch.autograd.grad(losses, params, alpha[keep], create_graph=True)
            jv = torch.autograd.grad(losses, params, beta[keep], create_graph=True)
            # the gradient of <J^T alpha, v> + <J^T beta, u>: H_alpha v + H_beta u
            found = _dot(list(ju), v) + _dot(list(jv), u), _dot(u, v)
        s, uv = found
        return total + self.gamma1 * torch.sign(uv) * s

    def weighted_grad(self, weights: Tensor) -> list[Tensor]:
        summed = [torch.zeros_like(r) for r in self.shared]
        self.add_weighted_grad(weights, summed)
        return summed

    def add_weighted_grad(self, weights: Tensor, into: list[Tensor]) -> None:
        """``sum_i w_i (g_i + r) = sum_i w_i g_i + (sum_i w_i) r``."""
        self.inner.add_weighted_grad(weights, into)
        torch._foreach_add_(into, torch._foreach_mul(self.shared, weights.sum()))

    def release(self) -> None:
        self.inner.release()
        self.shared = []
