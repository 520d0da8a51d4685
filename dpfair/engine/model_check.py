"""Which layers of a model the private engine can train, checked before training.

DP-SGD bounds each example's influence by clipping its own gradient (Abadi et al. 2016,
Algorithm 1); that bound holds only when an example's loss depends on no other example of the
batch and nothing outside the noised gradient carries information from one step to the next.
:func:`check_model` refuses (``PrivacyError``, every offending layer with its qualified name,
the reason and the fix) a model that breaks this:

* **layers that mix samples** in training mode: BatchNorm (any dimension, lazy, SyncBatchNorm)
  normalises by batch statistics; found by type, and generically: two forward passes of a
  random dummy batch, the second with sample 0 changed, name the first (innermost) module whose
  input for the *other* samples is the same in both while its output for them is not; the
  search repeats with that module made per-sample, so every such module is named;
* **state updated in forward**: InstanceNorm with ``track_running_stats``, and any module whose
  buffers change during a training-mode forward on a dummy batch (running statistics are exact
  training-set statistics, shared across samples and released with the model).

It also lists the layers the fast per-sample gradient path has no rule for, with the reason:
the engine's own plan (:func:`dpfair.engine.gradients.plan_layers`), which materialises them
one layer at a time and logs them once when it is built.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from dpfair.engine.gradients import plan_layers
from dpfair.errors import ConfigError, PrivacyError

_BATCH_NORMS = (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm)
_BATCH_NORM_REASON = "BatchNorm mixes samples in a batch; use GroupNorm or LayerNorm"
_DUMMY_BATCH = 3
_MAX_SEARCHES = 8  # mixing modules named by the forward test, at most


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
    SGD and may use them. Runs the checks on copies of the model in training mode, on a random
    dummy batch, leaving ``model`` and torch's global random state untouched.
    """
    found = _mixing_by_type(model)
    for name, reason in _state_or_mixing_by_forward(model, input_shape, set(found)).items():
        found.setdefault(name, reason)
    mixing = {_qualified(name): reason for name, reason in found.items()}
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
            found[name] = f"{kind}: {_BATCH_NORM_REASON}"
        elif isinstance(module, nn.modules.instancenorm._InstanceNorm) and (
            module.track_running_stats
        ):
            found[name] = (
                f"{kind} with track_running_stats=True keeps running statistics of the "
                "training data shared across samples; set track_running_stats=False (or use "
                "GroupNorm)"
            )
    return found


def _state_or_mixing_by_forward(
    model: nn.Module, input_shape: tuple[int, ...], known: set[str]
) -> dict[str, str]:
    """Modules whose buffers a training-mode forward changes, and modules whose output for
    the other samples changes when sample 0 of the model's input does (module docstring).

    The search for mixing repeats, each time with the modules already found (``known`` ones
    too) made per-sample (:func:`_isolate`), so every mixing module is named, innermost first.
    """
    gen = torch.Generator().manual_seed(0)
    # values in [0, 1), sample 0 changed to [1, 2): valid token ids (0, 1) after .long() too
    x = torch.rand(_DUMMY_BATCH, *input_shape, generator=gen)
    changed = x.clone()
    changed[0] = 1 + torch.rand(input_shape, generator=gen)
    probe = copy.deepcopy(model).cpu().train()
    before = {n: b.clone() for n, b in probe.named_buffers()}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        _record(probe, x)
    found = {}
    for name, buffer in probe.named_buffers():
        if name in before and not torch.equal(before[name], buffer):
            owner, _, short = name.rpartition(".")
            found.setdefault(owner, (
                f"{_kind(model, owner)}: its forward pass updates buffer {short!r}, state "
                "shared across samples (and an exact training-set statistic released with the "
                "model); compute it from each sample alone or make it a constant"
            ))
    isolated = known | set(found)
    for _ in range(_MAX_SEARCHES):
        if "" in isolated:
            break
        pair = [copy.deepcopy(model).cpu().train() for _ in range(2)]
        for probe in pair:
            for name in isolated:
                _isolate(probe.get_submodule(name))
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            first, second = _record(pair[0], x), _record(pair[1], changed)
        culprit = _first_mixing(first, second)
        if culprit is None:
            break
        found.setdefault(culprit, (
            f"{_kind(model, culprit)}: its output for one sample depends on the other samples "
            "of the batch; make its forward act on each sample alone (no statistics over the "
            "batch dimension)"
        ))
        isolated.add(culprit)
    return found


def _kind(model: nn.Module, name: str) -> str:
    return type(model.get_submodule(name)).__name__


def _isolate(module: nn.Module) -> None:
    """Take a module already named out of the search: the identity when it keeps its input's
    shape (so a change of sample 0 still reaches the layers after it), else one call per
    sample in evaluation mode (running statistics, no updates)."""
    module.eval()
    forward = module.forward

    def isolated(x: Tensor, *args: object, **kwargs: object) -> Tensor:
        out = torch.cat([forward(x[i : i + 1], *args, **kwargs) for i in range(len(x))])
        return x if out.shape == x.shape else out

    module.forward = isolated  # type: ignore[method-assign]


def _record(model: nn.Module, x: Tensor) -> list[tuple[str, Tensor | None, Tensor]]:
    """(name, first input, output) of every module call in completion order (children before
    their parent), after seeding torch's global generator (the same dropout in both passes)."""
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
    """Whether samples 1.. agree (True when either is not a batch of the dummy's size)."""
    if a is None or b is None or a.shape != b.shape or a.dim() == 0 or len(a) != _DUMMY_BATCH:
        return True
    a, b = a[1:], b[1:]
    return torch.equal(a, b) or bool(((a - b).abs() <= 1e-6 + 1e-4 * b.abs()).all())


def _first_mixing(
    first: list[tuple[str, Tensor | None, Tensor]],
    second: list[tuple[str, Tensor | None, Tensor]],
) -> str | None:
    """The first module to finish (so the innermost) whose input samples 1.. agree between the
    two passes while its output samples 1.. do not."""
    for (name, in_a, out_a), (_, in_b, out_b) in zip(first, second, strict=False):
        if _rows_equal(in_a, in_b) and not _rows_equal(out_a, out_b):
            return name
    return None
