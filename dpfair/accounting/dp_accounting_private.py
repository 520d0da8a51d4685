"""The one place dpfair uses a private name of dp_accounting (written against 0.6.0).

dp_accounting's RDP accountant composes events, but :class:`MaxOfDpEvent` inside a
``RepeatAndSelectDpEvent`` (a tuning search over a space of run configurations) needs the RDP of
"repeat a run a random number of times, keep the best" (Papernot & Steinke, ICLR 2022, Theorems
2 and 6) applied to an RDP curve dpfair computed itself. dp_accounting has no public function
for that; its private ``rdp_privacy_accountant._compute_rdp_repeat_and_select`` is exactly it.
Rather than copy it, dpfair calls it here only. If dp_accounting renames, removes or changes
it, :func:`check_private_api` (run by ``tests/accounting/test_dp_accounting_private.py``) and every
call fail with a :class:`~dpfair.errors.PrivacyError` naming the installed version.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from importlib import metadata

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant

from dpfair.errors import PrivacyError

#: the private function and the parameters dpfair passes it.
REPEAT_AND_SELECT = "_compute_rdp_repeat_and_select"
REPEAT_AND_SELECT_PARAMETERS = ("orders", "rdp", "mean", "shape")


def dp_accounting_version() -> str:
    return metadata.version("dp-accounting")


def _repeat_and_select() -> Callable[..., Sequence[float]]:
    found = getattr(rdp_privacy_accountant, REPEAT_AND_SELECT, None)
    parameters = tuple(inspect.signature(found).parameters) if callable(found) else None
    if parameters != REPEAT_AND_SELECT_PARAMETERS:
        raise PrivacyError(
            f"dp_accounting {dp_accounting_version()} has no private "
            f"rdp_privacy_accountant.{REPEAT_AND_SELECT}{REPEAT_AND_SELECT_PARAMETERS} "
            f"(found {parameters}); dpfair was written against dp_accounting 0.6.0: pin "
            "dp-accounting==0.6.0 or adapt dpfair/accounting/dp_accounting_private.py"
        )
    return found


def check_private_api() -> None:
    """Raises :class:`PrivacyError` (naming the installed version) if a name is gone."""
    _repeat_and_select()


def repeat_and_select_rdp(
    orders: np.ndarray, rdp: np.ndarray, mean: float, shape: float
) -> np.ndarray:
    """RDP at ``orders`` of the best of K runs whose one-run RDP is ``rdp``; K is Poisson
    (``shape = inf``) or truncated negative binomial (``shape >= 0``) with mean ``mean``."""
    return np.asarray(_repeat_and_select()(orders, rdp, mean, shape), dtype=np.float64)
