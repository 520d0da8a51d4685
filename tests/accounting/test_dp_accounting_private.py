"""The private dp_accounting name dpfair relies on is still there and still computes
Papernot & Steinke's repeat-and-select RDP; else these fail naming the installed version."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from dpfair.accounting import dp_accounting_private as private
from dpfair.accounting import repeat_select
from dpfair.errors import PrivacyError

VERSION = private.dp_accounting_version()
ORDERS = np.array([1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0, 64.0])
#: one run: a Gaussian mechanism of noise multiplier 2 (RDP α / (2 σ²) at order α).
RDP = ORDERS / (2 * 2.0**2)


def test_the_private_api_is_there():
    try:
        private.check_private_api()
    except PrivacyError as exc:
        pytest.fail(str(exc))


@pytest.mark.parametrize("shape", [0.0, 0.5, 1.0, 3.0])
def test_repeat_and_select_is_papernot_steinke_theorem_2(shape):
    """dp_accounting's function against dpfair's own Theorem 2 (written for η in (-1, 0))."""
    got = private.repeat_and_select_rdp(ORDERS, RDP, 10.0, shape)
    want = repeat_select.tnb_repeat_and_select(ORDERS, RDP, 10.0, shape)
    assert np.allclose(got, want, rtol=1e-9), (
        f"dp_accounting {VERSION}: {private.REPEAT_AND_SELECT} changed its results "
        f"(shape {shape}): {got} != {want}"
    )


def test_repeat_and_select_poisson_is_theorem_6():
    got = private.repeat_and_select_rdp(ORDERS, RDP, 10.0, math.inf)
    for i, order in enumerate(ORDERS):
        eps_hat = math.log1p(1 / (order - 1))
        delta_hat = rdp_privacy_accountant.compute_delta(ORDERS, RDP, eps_hat)[0]
        want = RDP[i] + 10.0 * delta_hat + math.log(10.0) / (order - 1)
        assert got[i] == pytest.approx(want, rel=1e-12), (
            f"dp_accounting {VERSION}: {private.REPEAT_AND_SELECT} changed (Poisson, order {order})"
        )


def test_a_removed_name_fails_loudly_naming_the_version(monkeypatch):
    monkeypatch.delattr(rdp_privacy_accountant, private.REPEAT_AND_SELECT)
    for call in (
        private.check_private_api,
        lambda: private.repeat_and_select_rdp(ORDERS, RDP, 10.0, 1.0),
    ):
        with pytest.raises(PrivacyError, match=f"dp_accounting {VERSION} has no private"):
            call()


def test_a_changed_signature_fails_loudly(monkeypatch):
    monkeypatch.setattr(rdp_privacy_accountant, private.REPEAT_AND_SELECT, lambda rdp, mean: rdp)
    with pytest.raises(PrivacyError, match="found \\('rdp', 'mean'\\)"):
        private.check_private_api()
