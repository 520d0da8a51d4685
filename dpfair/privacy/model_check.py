"""Which layers of a model the private engine can train, checked before training.

DP-SGD bounds each example's influence by clipping its own gradient (Abadi et al. 2016,
Algorithm 1); that bound holds only when an example's loss depends on no other example of the
batch and nothing outside the noised gradient carries information from one step to the next.
:func:`check_model` refuses (``PrivacyError``, every offending layer with its qualified name,
the reason and the fix) a model that breaks this:

* **layers that mix samples** in training mode: BatchNorm (any dimension, lazy, SyncBatchNorm)
  normalises by batch statistics; found by type, and generically: every module is called
  again on the input it received in a forward pass of a random dummy batch, once as is and once
  with sample 0 changed, and is refused when its output for the *other* samples changes
  (only the innermost such modules are named);
* **state updated in forward**: InstanceNorm with ``track_running_stats``, and any module whose
  buffers change during a training-mode forward on a dummy batch (running statistics are exact
  training-set statistics, shared across samples and released with the model).

It also lists the layers the fast per-sample gradient path has no rule for, with the reason:
the engine's own plan (:func:`dpfair.privacy.gradients.plan_layers`), which materialises them
one layer at a time and logs them once when it is built.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from dpfair.errors import ConfigError, PrivacyError
from dpfair.privacy.gradients import plan_layers

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
    dummy batch, leaving ``model`` and torch's global random state untouched.
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
    slow = {name: reason for name, _, reason in plan_layers(model).slow}
    return ModelReport(trainable, slow, mixing if not private else {})


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
    """Modules whose buffers a training-mode forward on a random dummy batch changes, and the
    innermost modules whose output for the other samples changes when one sample of their
    input does (module docstring). Runs on copies of ``model``, dropout drawn alike."""
    probe = copy.deepcopy(model).cpu().train()
    before = {n: b.clone() for n, b in probe.named_buffers()}
    # values in [0, 1), sample 0 changed to [1, 2): valid token ids (0, 1) after .long() too
    x = torch.rand(_DUMMY_BATCH, *input_shape, generator=torch.Generator().manual_seed(0))
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        calls = _first_calls(probe, x)
        fresh = copy.deepcopy(model).cpu().train()
        mixing = [name for name in calls if _mixes(fresh.get_submodule(name), *calls[name])]
    found = {}
    for name, buffer in probe.named_buffers():
        if name in before and not torch.equal(before[name], buffer):
            owner, _, short = name.rpartition(".")
            found.setdefault(
                _qualified(owner),
                f"{_kind(model, owner)}: its forward pass updates buffer {short!r}, state "
                "shared across samples (and an exact training-set statistic released with the "
                "model); compute it from each sample alone or make it a constant",
            )
    for name in mixing:
        if not any(_inside(other, name) for other in mixing):  # the innermost only
            found.setdefault(
                _qualified(name),
                f"{_kind(model, name)}: its output for one sample depends on the other samples "
                "of the batch; make its forward act on each sample alone (no statistics over "
                "the batch dimension)",
            )
    return found


def _inside(name: str, parent: str) -> bool:
    """Whether module ``name`` is a proper descendant of module ``parent`` ("" is the root)."""
    return name != parent and (parent == "" or name.startswith(parent + "."))


def _kind(model: nn.Module, name: str) -> str:
    return type(model.get_submodule(name)).__name__


def _first_calls(model: nn.Module, x: Tensor) -> dict[str, tuple[tuple, dict]]:
    """The arguments of each module's first call whose first argument is a floating batch of
    ``len(x)`` samples, from one forward of ``model`` (seeded: dropout)."""
    calls: dict[str, tuple[tuple, dict]] = {}
    names = {m: n for n, m in model.named_modules()}

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        first = args[0] if args else None
        if (
            names[module] not in calls
            and isinstance(first, Tensor)
            and first.is_floating_point()
            and first.dim() > 0
            and len(first) == len(x)
        ):
            calls[names[module]] = (tuple(_copy(a) for a in args), dict(kwargs))

    torch.manual_seed(0)
    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in model.modules()]
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


def _copy(value: object) -> object:
    return value.detach().clone() if isinstance(value, Tensor) else value


def _mixes(module: nn.Module, args: tuple, kwargs: dict) -> bool:
    """Whether changing sample 0 of ``module``'s first argument changes its output for the
    other samples (each call on a fresh copy of the module, with the same dropout draws)."""
    changed = args[0].clone()
    changed[0] = 1 + torch.rand(changed.shape[1:], generator=torch.Generator().manual_seed(1))
    outputs = []
    for first in (args[0], changed):
        torch.manual_seed(0)
        try:
            out = copy.deepcopy(module)(_copy(first), *map(_copy, args[1:]), **kwargs)
        except Exception:  # the module accepts no such input (e.g. token ids): cannot tell
            return False
        outputs.append(out[0] if isinstance(out, tuple) and out else out)
    a, b = outputs
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or a.shape != b.shape:
        return False
    if a.dim() == 0 or len(a) != len(args[0]):
        return False
    return not bool(torch.allclose(a[1:], b[1:], rtol=1e-4, atol=1e-6, equal_nan=True))
