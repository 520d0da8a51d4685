"""check_model: layers that mix samples or keep state are refused with their name, reason and
fix; slow layers are listed and logged once; the checked model is left untouched."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpfair.engine.model_check import check_model
from dpfair.errors import PrivacyError
from tests.fixtures.own_models import BatchCentre, RunningMean

BATCHNORM = "BatchNorm mixes samples in a batch; use GroupNorm or LayerNorm"


class Block(nn.Module):
    """A residual block whose normalisation layer is given."""

    def __init__(self, norm: nn.Module, width: int = 8) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.norm(self.lin(x))


class Calls(nn.Module):
    """Counts its calls in a buffer; its output does not depend on the count."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x


def _net(*middle: nn.Module, width: int = 8) -> nn.Sequential:
    return nn.Sequential(nn.Linear(5, width), *middle, nn.Linear(width, 3))


def _refusal(model: nn.Module, shape: tuple[int, ...] = (5,)) -> str:
    with pytest.raises(PrivacyError) as info:
        check_model(model, shape)
    return str(info.value)


@pytest.mark.parametrize(
    "norm", [nn.BatchNorm1d(8), nn.SyncBatchNorm(8), nn.BatchNorm1d(8, affine=False)],
    ids=["batchnorm", "sync", "no-affine"],
)
def test_batchnorm_is_refused_with_its_name_and_the_fix(norm: nn.Module) -> None:
    message = _refusal(_net(nn.Tanh(), Block(norm)))
    assert f"  2.norm: {type(norm).__name__}: {BATCHNORM}" in message


def test_batchnorm2d_in_a_cnn_is_refused() -> None:
    cnn = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2)
    )
    assert f"  1: BatchNorm2d: {BATCHNORM}" in _refusal(cnn, (1, 8, 8))


def test_every_offending_layer_is_listed() -> None:
    message = _refusal(_net(nn.BatchNorm1d(8), RunningMean(), BatchCentre()))
    lines = [line for line in message.splitlines() if line.startswith("  ")]
    assert [line.split(":")[0].strip() for line in lines] == ["1", "2", "3"]


def test_instance_norm_with_running_stats_is_refused_without_is_accepted() -> None:
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.InstanceNorm2d(4, track_running_stats=True),
                        nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    message = _refusal(cnn, (1, 8, 8))
    assert "1: InstanceNorm2d with track_running_stats=True" in message
    assert "set track_running_stats=False" in message
    cnn[1] = nn.InstanceNorm2d(4)
    assert check_model(cnn, (1, 8, 8)).slow_layers == {}


def test_a_buffer_written_in_forward_is_found_generically() -> None:
    message = _refusal(_net(Block(RunningMean())))
    assert "1.norm: RunningMean: its forward pass updates buffer 'mean'" in message
    assert "1.norm: Calls: its forward pass updates buffer 'calls'" in _refusal(
        _net(Block(Calls()))
    )


def test_mixing_without_buffers_names_the_innermost_module() -> None:
    inner = nn.Sequential(nn.Tanh(), nn.Sequential(nn.Identity(), BatchCentre()))
    message = _refusal(_net(inner))
    assert "  1.1.1: BatchCentre: its output for one sample depends on the other samples" in (
        message
    )
    assert "  1:" not in message and "<model>" not in message


def test_residual_layernorm_and_dropout_pass_and_the_model_is_left_as_is() -> None:
    model = _net(Block(nn.LayerNorm(8)), nn.Dropout(0.5), Block(nn.GroupNorm(2, 8)))
    model.eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    report = check_model(model, (5,))
    assert report.slow_layers == {} and report.mixing_layers == {}
    assert report.n_params == sum(p.numel() for p in model.parameters())
    assert not model.training  # its mode is kept
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_nonprivate_run_may_use_batchnorm_and_its_statistics_stay_untouched() -> None:
    model = _net(nn.BatchNorm1d(8))
    report = check_model(model, (5,), private=False)
    assert report.mixing_layers == {"1": f"BatchNorm1d: {BATCHNORM}"}
    assert torch.equal(model[1].running_mean, torch.zeros(8))
    assert int(model[1].num_batches_tracked) == 0


def test_slow_layers_are_the_engines_plan_with_reasons() -> None:
    model = _net(nn.PReLU(), Block(nn.LayerNorm(8)))
    report = check_model(model, (5,))
    assert list(report.slow_layers) == ["1"] and "PReLU" in report.slow_layers["1"]
    assert "  1: nn.PReLU: " in report.summary()
    assert "fast per-sample path" in check_model(_net(Block(nn.LayerNorm(8))), (5,)).summary()


class TokenNet(nn.Module):
    """Token ids stored as floats (dpfair's features are float32), embedded and pooled."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(3, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(x.long()).mean(1))


def test_a_model_of_token_ids_is_checked_without_index_errors() -> None:
    assert check_model(TokenNet(), (6,)).slow_layers == {}


def test_two_mixing_modules_without_buffers_are_both_named() -> None:
    inner = nn.Sequential(nn.Linear(8, 8), BatchCentre())
    message = _refusal(_net(BatchCentre(), nn.Tanh(), inner))
    assert "  1: BatchCentre: " in message and "  3.1: BatchCentre: " in message


class TimeMajorLSTM(nn.Module):
    """Runs an LSTM with the time axis first (batch second): per-sample, though its inner
    layer's first axis is not the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(2, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x.view(len(x), 3, 2).transpose(0, 1))
        return self.head(out[-1])


def test_a_time_major_inner_layer_is_not_mistaken_for_mixing() -> None:
    report = check_model(TimeMajorLSTM(), (6,))
    assert report.mixing_layers == {}
