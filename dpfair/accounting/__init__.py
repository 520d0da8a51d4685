"""Privacy accounting: the events that describe what a run or a search releases, and the
accountants that turn an event into ε.

One entry takes an event and returns ε with its accountant's name:
:func:`spend` (``spend(event, delta) -> Spend(epsilon, accountant)``), in
:mod:`dpfair.accounting.accountant`. Beside it: :mod:`~dpfair.accounting.events` (dp_accounting's
DpEvent language, dpfair's extensions, a run's event and its JSON form),
:mod:`~dpfair.accounting.pld` (privacy loss distributions), :mod:`~dpfair.accounting.profiles`
and :mod:`~dpfair.accounting.repeat_select` (private selection: the best of K runs),
:mod:`~dpfair.accounting.calibration` (the noise that meets a total ε) and
:mod:`~dpfair.accounting.per_group` (DPSGD-F's per-group ε).
"""

from dpfair.accounting.accountant import *  # noqa: F403 - the package is the accountant's face
from dpfair.accounting.accountant import __all__  # noqa: F401
