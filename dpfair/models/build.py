"""The models of the papers: softmax/logistic regression, MLP, two CNNs.

Every model is a plain ``nn.Sequential`` of ``Linear``/``Conv2d`` layers and parameter-free
modules (activations, pooling, flatten), so the per-sample gradient engine can hook every
trainable layer. There is no BatchNorm anywhere: it mixes samples and breaks per-sample
sensitivity.

Parameter counts against the papers (``esipova2023.settings.models`` in published.yaml):

* ``logistic_regression`` is one ``Linear(d, n_classes)`` trained with cross-entropy (softmax
  regression). For two classes it has the capacity of logistic regression with twice the
  parameters (``2(d+1)`` instead of ``d+1``); this is what Esipova's code uses
  (``Linear(d, 2)``), and Dutch one-hot encoded as in her code has d = 59 features
  (sex, prev_res_place binary; age 12, household position 8, household size 6, citizenship 3,
  country of birth 3, education 6, economic status 3, current activity 12, marital status 4),
  so 2 * 60 = 120 parameters: her published count.
* ``mlp`` with hidden ``[256, 256]``, tanh and 2 logits has ``256 d + 66,562`` parameters;
  Esipova's 91,650 implies d = 98, which is Adult one-hot encoded as in her code (5 z-scored
  numeric, sex and race binary, 91 one-hot columns of the 6 categorical features).
* ``esipova_cnn`` is her code's CNN: 3x3 convolutions with 32 and 16 channels, stride 1,
  no padding, tanh after each, **no pooling**, flatten, one linear layer to the logits. On
  CelebA (3x64x64, 2 classes) that is 896 + 4,624 + 16*60*60*2 + 2 = 120,722: exactly the
  published count. On MNIST (1x28x28, 10 classes) it is 97,114, not the published 80,522, and
  no variant can give 80,522: the two convolutions have 4,944 parameters and a 10-way linear
  head ``10 (F + 1)`` parameters, so any such model has a count ending in 4 whatever the
  padding, stride or pooling (80,522 ends in 2; a programmatic search over padding 0-2, stride
  1-2, max-pool 2/3 with stride 1/2 after either layer and hidden heads found nothing). We keep
  the code's architecture, which does reproduce the CelebA count.
* ``zhao_cnn`` is Zhao et al.'s App. A.5 CNN: two 3x3 convolutions of 64 filters, each
  followed by ReLU and max-pooling (kernel 3, stride 2), then fully connected 500-500 with
  ReLU and a linear output layer. The paper gives no padding; the default is 0 (valid), which
  on MNIST leaves 64x4x4 features and 805,578 parameters. Inputs smaller than 13x13
  (scikit-learn's 8x8 digits) need ``padding: 1``.
* ``import`` is the user's own module by import path (:class:`ImportModelConfig`); its layers
  are checked before training by :func:`dpfair.engine.model_check.check_model`.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from dpfair.errors import ConfigError, did_you_mean
from dpfair.models.config import (
    FROM_DATA,
    Activation,
    EsipovaCNNConfig,
    ImportModelConfig,
    LogisticRegressionConfig,
    MLPConfig,
    ModelConfig,
    ZhaoCNNConfig,
    resolve_target,
    users_code,
)

_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


def n_params(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    """Build the model of ``cfg`` for inputs of ``input_shape`` (no batch dim) and ``n_classes``.

    Tabular models flatten their input, so they also accept images; CNNs need ``(c, h, w)``.
    Initialisation uses torch's global RNG: seed it (the training loop does, in a fork).
    """
    input_shape = tuple(int(s) for s in input_shape)
    if n_classes < 2:
        raise ValueError(f"a classifier needs at least 2 classes, got {n_classes}")
    if isinstance(cfg, LogisticRegressionConfig):
        return _mlp(_flat_dim(input_shape), [], n_classes, "tanh")
    if isinstance(cfg, MLPConfig):
        return _mlp(_flat_dim(input_shape), cfg.hidden, n_classes, cfg.activation)
    if isinstance(cfg, EsipovaCNNConfig):
        convs = _conv_stack(input_shape, cfg.channels, cfg.kernel_size, 0, cfg.activation, None)
        return _with_head(convs, input_shape, cfg.name, [], n_classes, cfg.activation)
    if isinstance(cfg, ZhaoCNNConfig):
        pool = (cfg.pool_kernel, cfg.pool_stride)
        convs = _conv_stack(
            input_shape, cfg.channels, cfg.kernel_size, cfg.padding, cfg.activation, pool
        )
        return _with_head(convs, input_shape, cfg.name, cfg.hidden, n_classes, cfg.activation)
    if isinstance(cfg, ImportModelConfig):
        return _import_model(cfg, input_shape, n_classes)
    raise TypeError(f"not a model config: {cfg!r}")


def _flat_dim(input_shape: tuple[int, ...]) -> int:
    if not input_shape or min(input_shape) < 1:
        raise ValueError(f"bad input shape {input_shape}")
    return int(torch.Size(input_shape).numel())


def _mlp(d: int, hidden: list[int], n_classes: int, activation: Activation) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Flatten()]
    for width in hidden:
        layers += [nn.Linear(d, width), _ACTIVATIONS[activation]()]
        d = width
    layers.append(nn.Linear(d, n_classes))
    return nn.Sequential(*layers)


def _conv_stack(
    input_shape: tuple[int, ...],
    channels: list[int],
    kernel: int,
    padding: int,
    activation: Activation,
    pool: tuple[int, int] | None,
) -> list[nn.Module]:
    if len(input_shape) != 3:
        raise ValueError(f"CNNs need image inputs (c, h, w), got shape {input_shape}")
    layers: list[nn.Module] = []
    c_in = input_shape[0]
    for c_out in channels:
        layers += [nn.Conv2d(c_in, c_out, kernel, padding=padding), _ACTIVATIONS[activation]()]
        if pool is not None:
            layers.append(nn.MaxPool2d(*pool))
        c_in = c_out
    return layers + [nn.Flatten()]


def _with_head(
    convs: list[nn.Module],
    input_shape: tuple[int, ...],
    name: str,
    hidden: list[int],
    n_classes: int,
    activation: Activation,
) -> nn.Sequential:
    """Append the fully connected head; its input size comes from a dry run of ``convs``."""
    try:
        with torch.no_grad():
            d = nn.Sequential(*convs)(torch.zeros(1, *input_shape)).shape[1]
    except RuntimeError as err:
        raise ValueError(
            f"{name}: input {input_shape} is too small for its convolutions and pooling "
            f"(try padding, a smaller kernel or fewer layers): {err}"
        ) from err
    head = _mlp(d, hidden, n_classes, activation)
    return nn.Sequential(*convs, *list(head)[1:])


# ------------------------------------------------------------------ own model by import path


def _import_model(
    cfg: ImportModelConfig, input_shape: tuple[int, ...], n_classes: int
) -> nn.Module:
    """Call the factory (see :class:`ImportModelConfig`) and check its output on a dummy batch."""
    factory = resolve_target(cfg.target)
    kwargs = dict(cfg.kwargs)
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # some builtins have none: pass the kwargs only
        signature = None
    if signature is not None:
        given = {"input_shape": input_shape, "n_classes": n_classes}
        kwargs.update({k: v for k, v in given.items() if k in signature.parameters})
        try:
            signature.bind(**kwargs)
        except TypeError as err:
            accepted = [k for k in signature.parameters if k not in FROM_DATA]
            unknown = sorted(set(cfg.kwargs) - set(signature.parameters))
            hint = did_you_mean(unknown[0], accepted) if unknown else ""
            raise ConfigError(
                f"model {cfg.target}: kwargs {cfg.kwargs} do not fit its signature "
                f"{signature}: {err}{hint}"
            ) from err
    with users_code(f"model {cfg.target}", f"model {cfg.target}(**{kwargs}) raised"):
        model = factory(**kwargs)
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model {cfg.target} returned a {type(model).__name__}, not a torch.nn.Module"
        )
    check_output_shape(model, input_shape, n_classes, cfg.target)
    return model


def check_output_shape(
    model: nn.Module, input_shape: tuple[int, ...], n_classes: int, what: str = "the model"
) -> None:
    """``ConfigError`` unless ``model`` has trainable parameters and maps a dummy batch
    ``(2, *input_shape)`` to floating-point logits of shape ``(2, n_classes)`` (evaluated in
    eval mode, without gradients; the mode is restored): the one check of a model's contract,
    so a model that cannot be trained is refused before anything is charged."""
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(
            f"{what} has no trainable parameters (nothing to train, so a training run would "
            "release nothing useful and fail in the optimiser): give a model with layers that "
            "have weights (e.g. nn.Linear), their requires_grad left on")
    was_training = model.training
    device = next(model.parameters(), torch.empty(0)).device
    failed = (f"{what}: the forward pass failed on a dummy batch of shape {(2, *input_shape)} "
              f"(the data's input shape {input_shape} with a batch dimension):")
    model.eval()
    try:
        with users_code(f"{what}: the forward pass", failed), torch.no_grad():
            out = model(torch.zeros(2, *input_shape, device=device))
    finally:
        model.train(was_training)
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if shape != (2, n_classes):
        raise ConfigError(
            f"{what}: a batch of shape {(2, *input_shape)} gave output {shape}; expected logits "
            f"of shape (2, {n_classes}) = (batch, n_classes) for this dataset's {n_classes} "
            "classes"
        )
    if not out.is_floating_point():
        raise ConfigError(
            f"{what}: its output has dtype {out.dtype}, not floating-point logits (the loss "
            "needs real-valued scores per class): return the last layer's output unrounded, "
            "without .long(), .int() or argmax")
