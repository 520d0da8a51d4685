"""Which layers of a model the private engine can train, checked before training.

DP-SGD bounds each example's influence by clipping its own gradient (Abadi et al. 2016,
Algorithm 1); that bound holds only when an example's loss depends on no other example of the
batch and nothing outside the noised gradient carries information from one step to the next.
:func:`check_model` refuses (``PrivacyError``, every offending layer with its qualified name,
the reason and the fix) a model that breaks this:

* **layers that mix samples** in training mode: BatchNorm (any dimension, lazy, SyncBatchNorm)
  normalises by batch statistics; found by type, and generically by perturbing one sample of a
  dummy batch and finding the innermost module whose output for the *other* samples changes
  while its input for them did not;
* **state updated in forward**: InstanceNorm with ``track_running_stats``, and any module whose
  buffers change during a training-mode forward on a dummy batch (running statistics are exact
  training-set statistics, shared across samples and released with the model).

It also lists the layers with trainable parameters that the fast per-sample gradient path does
not handle (they use the slower materialised path) and logs them once.
"""

from __future__ import annotations

import copy
import functools
import logging
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from dpfair.errors import ConfigError, PrivacyError
from dpfair.privacy.layer_grads import FAST_LAYERS

log = logging.getLogger(__name__)

_BATCH_NORMS = (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm)
_BATCH_NORM_REASON = "BatchNorm mixes samples in a batch; use GroupNorm or LayerNorm"
_DUMMY_BATCH = 3


@dataclass(frozen=True)
class ModelReport:
    """What :func:`check_model` found in a model it accepts.

    ``slow_layers``: qualified name -> why the fast per-sample gradient path does not handle it
    (the run then uses the slower materialised path). ``mixing_layers``: layers that mix samples
    or keep state, tolerated only for a non-private run (empty otherwise).
    """

    n_params: int
    slow_layers: dict[str, str] = field(default_factory=dict)
    mixing_layers: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        """One line per slow layer, or a line saying every layer is on the fast path."""
        if not self.slow_layers:
            return f"all {self.n_params} trainable parameters are on the fast per-sample path"
        lines = [f"  {name}: {reason}" for name, reason in self.slow_layers.items()]
        return (
            "per-sample gradients take the slower materialised path (more time and memory) "
            "for these layers:\n" + "\n".join(lines)
        )


def check_model(
    model: nn.Module, input_shape: tuple[int, ...], *, private: bool = True
) -> ModelReport:
    """Check ``model`` for inputs of ``input_shape`` (no batch dimension) before training.

    Raises ``PrivacyError`` naming every layer that mixes samples or keeps state across
    samples (module docstring) when ``private``; a non-private run (the reference) is plain
    SGD and may use them. Runs the checks on a copy of the model in training mode, on a random
    dummy batch, leaving ``model`` and torch's global random state untouched. When private,
    logs the slow layers once per distinct list.
    """
    mixing = _mixing_by_type(model)
    for name, reason in _state_or_mixing_by_forward(model, input_shape).items():
        mixing.setdefault(name, reason)
    if mixing and private:
        lines = [f"  {name}: {reason}" for name, reason in mixing.items()]
        raise PrivacyError(
            "the model cannot be trained with differential privacy: per-sample clipping bounds "
            "one example's influence only if no layer mixes samples or keeps state across "
            "them. Replace these layers:\n" + "\n".join(lines)
        )
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    report = ModelReport(trainable, _slow_layers(model), mixing if not private else {})
    if private and report.slow_layers:
        _log_once(report.summary())
    return report


def _qualified(name: str) -> str:
    return name or "<model>"


def _mixing_by_type(model: nn.Module) -> dict[str, str]:
    found = {}
    for name, module in model.named_modules():
        kind = type(module).__name__
        if isinstance(module, _BATCH_NORMS):
            found[_qualified(name)] = f"{kind}: {_BATCH_NORM_REASON}"
        elif isinstance(module, nn.modules.instancenorm._InstanceNorm) and (
            module.track_running_stats
        ):
            found[_qualified(name)] = (
                f"{kind} with track_running_stats=True keeps running statistics of the "
                "training data shared across samples; set track_running_stats=False (or use "
                "GroupNorm)"
            )
    return found


def _state_or_mixing_by_forward(model: nn.Module, input_shape: tuple[int, ...]) -> dict[str, str]:
    """Modules whose buffers a training-mode forward changes, and the innermost module whose
    output for unchanged samples depends on a changed one (module docstring). Each pass runs on
    its own copy of ``model`` with the same dropout draws."""
    probes = [copy.deepcopy(model).cpu().train() for _ in range(2)]
    before = {n: b.clone() for n, b in probes[0].named_buffers()}
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(_DUMMY_BATCH, *input_shape, generator=gen)
    changed = x.clone()
    changed[0] = torch.randn(input_shape, generator=gen) * 3 + 1
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        first, second = _record(probes[0], x), _record(probes[1], changed)
    found = {}
    for name, buffer in probes[0].named_buffers():
        if name in before and not torch.equal(before[name], buffer):
            owner, _, short = name.rpartition(".")
            found.setdefault(
                _qualified(owner),
                f"{_kind(model, owner)}: its forward pass updates buffer {short!r}, state "
                "shared across samples (and an exact training-set statistic released with the "
                "model); compute it from each sample alone or make it a constant",
            )
    culprit = _first_mixing(first, second)
    if culprit is not None:
        found.setdefault(
            _qualified(culprit),
            f"{_kind(model, culprit)}: its output for one sample depends on the other samples "
            "of the batch; make its forward act on each sample alone (no statistics over the "
            "batch dimension)",
        )
    return found


def _kind(model: nn.Module, name: str) -> str:
    return type(model.get_submodule(name)).__name__


def _record(model: nn.Module, x: Tensor) -> list[tuple[str, Tensor | None, Tensor]]:
    """(name, first input, output) of every module call, in completion order (children
    before their parent), after seeding torch's global generator (dropout)."""
    calls: list[tuple[str, Tensor | None, Tensor]] = []
    names = {m: n for n, m in model.named_modules()}

    def hook(module: nn.Module, args: tuple, output: object) -> None:
        inp = args[0].detach().clone() if args and isinstance(args[0], Tensor) else None
        if isinstance(output, Tensor):
            calls.append((names[module], inp, output.detach().clone()))

    torch.manual_seed(0)
    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        model(x)
    except Exception as err:
        raise ConfigError(
            f"the model's training-mode forward pass failed on a random batch of shape "
            f"{tuple(x.shape)} (the data's input shape with a batch dimension): "
            f"{type(err).__name__}: {err}"
        ) from err
    finally:
        for h in handles:
            h.remove()
    return calls


def _rows_equal(a: Tensor | None, b: Tensor | None) -> bool:
    """Whether the samples other than the first agree (``None``: not a batch tensor)."""
    if a is None or b is None or a.shape != b.shape or a.dim() == 0 or len(a) != _DUMMY_BATCH:
        return True
    return bool(torch.allclose(a[1:], b[1:], rtol=1e-4, atol=1e-6, equal_nan=True))


def _first_mixing(
    first: list[tuple[str, Tensor | None, Tensor]],
    second: list[tuple[str, Tensor | None, Tensor]],
) -> str | None:
    """The first module to finish (so the innermost) whose input rows 1.. agree between the two
    passes while its output rows 1.. do not."""
    for (name, in_a, out_a), (_, in_b, out_b) in zip(first, second, strict=False):
        if _rows_equal(in_a, in_b) and not _rows_equal(out_a, out_b):
            return name
    return None


def _materialise_reason(module: nn.Module) -> str | None:
    """Why the fast path does not handle ``module``'s own trainable parameters (None if it
    does). The ``engine`` branch adds ``layer_grads.materialise_reason``; use it when merged."""
    if isinstance(module, FAST_LAYERS):
        return None
    return f"{type(module).__name__}: no fast per-sample gradient rule for this layer type"


def _slow_layers(model: nn.Module) -> dict[str, str]:
    slow = {}
    for name, module in model.named_modules():
        if any(p.requires_grad for p in module.parameters(recurse=False)):
            reason = _materialise_reason(module)
            if reason is not None:
                slow[_qualified(name)] = reason
    return slow


@functools.cache
def _log_once(summary: str) -> None:
    log.warning("%s", summary)
