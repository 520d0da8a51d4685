"""The privacy gate: the one component every entry point that reads private data goes through.

``dpfair run`` (and a resumed run), ``dpfair train``, ``dpfair tune``, ``dpfair audit``, a
scheduled retrain of ``dpfair serve``, ``dpfair.api.fit`` and the DVC stages (``dvc repro``,
``dvc exp run`` in any mode) all follow the same four steps, in this order:

1. **plan**: what the command will release, as DpEvents (:class:`dpfair.release.plan.ReleasePlan`),
   built by the caller after every check that needs no training (config, data, search space,
   groups, the model check) has passed;
2. **check** (:meth:`PrivacyGate.check`): the plan against ``budget.*`` (the run's ε, the
   test split's ε, releases without a guarantee) - the same rules for every command;
3. **reserve** (:meth:`PrivacyGate.admit`): the plan's event against the lifetime budget of
   every account of people the data touches (:mod:`dpfair.ledger.book`), recorded as pending
   in the durable ledger in one locked transaction;
4. **release or void**: the returned :class:`~dpfair.ledger.book.Spending` settles it when the
   command ends (void when it stopped before anything could leave the process).

A refusal at steps 2-3 costs nothing: nothing was recorded and nothing trained.

:meth:`PrivacyGate.identify` is where a loaded dataset meets the ledger: it computes the keyed
fingerprints of the people (:mod:`dpfair.ledger.people`) and replaces
``dataset.meta["data_version"]`` (the source's md5) by the published data-version id, so no
later log, tag or registry entry can publish the md5, which would be a membership oracle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dp_accounting import dp_event

from dpfair.data.privacy_unit import PrivacyUnit
from dpfair.errors import PrivacyError
from dpfair.ledger.accounts import PROJECT_ACCOUNT, Account, account_of
from dpfair.ledger.book import Release, SourceLedger, Spending
from dpfair.ledger.people import Fingerprints, dataset_fingerprints, examples_md5, version_id
from dpfair.ledger.store import Store
from dpfair.release.allowed import check_budget

if TYPE_CHECKING:
    from dpfair.config.sections import BudgetSection
    from dpfair.data import GroupedDataset
    from dpfair.release.plan import ReleasePlan

__all__ = ["DataVersion", "PrivacyGate", "check_preprocessing"]


def check_preprocessing(budget: BudgetSection, dataset: GroupedDataset) -> None:
    """A released model carries its feature transform: one fitted on the training rows holds
    their exact statistics, which ε does not cover. Refused (before anything trains, for every
    entry point: the CLI's commands and :func:`dpfair.api.fit`) unless the dataset declares its
    public ranges and categories, or ``budget.allow_fitted_preprocessing`` accepts it."""
    pre = dataset.preprocessor
    if pre is None or getattr(pre, "data_independent", False):
        return
    if budget.allow_fitted_preprocessing:
        return
    raise PrivacyError(
        f"dataset {dataset.name!r}: the models would carry a feature transform fitted on the "
        f"{getattr(pre, 'fitted_on', 'training split')}. Declare the public ranges and "
        f"categories of those columns (datasets.{dataset.name}.numeric_ranges and .categories;"
        " from Python: data_options=dict(numeric_ranges=..., categories=...)), or accept the "
        "release with budget.allow_fitted_preprocessing: true (the models are then labelled as "
        "holding exact training statistics). Nothing was trained."
    )


@dataclass(frozen=True)
class DataVersion:
    """A loaded data version as the ledger knows it: its ``source`` name, the private
    ``source_md5`` (never published), the published ``public_id``, the fingerprints of the
    people in it, the ``account`` it draws on and its privacy ``unit`` in words."""

    source: str
    source_md5: str
    public_id: str
    fingerprints: Fingerprints
    account: Account = PROJECT_ACCOUNT
    unit: PrivacyUnit = field(default_factory=PrivacyUnit)
    id_column: str | None = None

    def describe(self) -> str:
        """What every ε of this data protects and who pays, in words."""
        return (f"every ε protects {self.unit.describe(self.id_column)}; charged to "
                f"{self.account.describe()}")

    def tags(self) -> dict[str, str]:
        """The data version, its privacy unit (``row`` or ``person``, and the rows one unit
        may hold) and its account, as the runs are tagged (one token each)."""
        return {"dpfair.data_version": self.public_id, "dpfair.privacy_unit": self.unit.unit,
                "dpfair.rows_per_unit": str(self.unit.rows), "dpfair.account": self.account.name}


class PrivacyGate:
    """Plan -> check -> reserve -> release or void (module docstring), with ``budget``
    (``params.budget``) and the ledger it names, relative to the project ``root``."""

    def __init__(self, budget: BudgetSection, root: str | Path | None = None) -> None:
        self.budget = budget
        self.ledger = SourceLedger(budget.ledger, root)

    def identify(self, name: str, dataset: GroupedDataset, options: Any = None,
                 source_md5: str | None = None, command: str = "") -> DataVersion:
        """The data version of ``dataset`` (loaded from source ``name`` with ``options``, None
        for data given in Python; its source's md5 ``source_md5``, default the one it was
        loaded with): fingerprints of its people, its account and privacy unit
        (:mod:`dpfair.ledger.accounts`), and ``dataset.meta["data_version"]`` replaced by the
        published id (module docstring). The one place every entry point identifies data."""
        secret = self.ledger.secret()
        md5 = (source_md5 or dataset.meta.get("source_md5") or dataset.meta.get("data_version")
               or examples_md5(dataset))
        public = version_id(secret, md5)
        dataset.meta["source_md5"] = md5
        dataset.meta["data_version"] = public
        with self.ledger.store.reading() as conn:  # a known version's accounts are fixed
            known = Store.version_row(conn, md5) is not None
        people = {} if known else dataset_fingerprints(secret, dataset, options)
        account = account_of(name, options, public, disjoint=self.budget.disjoint_from_previous,
                             command=command)
        unit = getattr(options, "privacy_unit", None) or PrivacyUnit()
        return DataVersion(name, md5, public, people, account, unit,
                           getattr(options, "id_column", None))

    def public_id(self, source_md5: str) -> str:
        """The published id of the data version whose source md5 is ``source_md5``."""
        return version_id(self.ledger.secret(), source_md5)

    def check(self, plan: ReleasePlan) -> None:
        """Refuse (``PrivacyError``, itemised) a plan that ``budget.*`` does not allow."""
        check_budget(plan, self.budget)

    def admit(self, plan: ReleasePlan, data: DataVersion, *,
              event: dp_event.DpEvent | None = None, **context: str) -> Spending:
        """Check ``plan`` (:meth:`check`), then reserve it on ``data``'s people against
        ``budget.lifetime_epsilon``; returns the :class:`Spending` that settles it.
        ``event``: what to reserve when it is not the whole plan (a resumed run reserves only
        its retrains; the crashed run's reservation counts already). A resumption
        (``resumes=<parent run id>`` in ``context``) is claimed atomically first."""
        self.check(plan)
        resumes = context.get("resumes")
        claim = f"resume of pipeline run {resumes}" if resumes else None
        if claim is not None:
            self._claim_resume(claim, resumes)
        whole = event is None
        try:
            reserved = self.reserve(
                data, plan.ledger_event if whole else event, plan.delta,
                **(self._whole(plan) if whole else {}), **context)
        except BaseException:
            if claim is not None:
                self.ledger.store.unclaim(claim)
            raise
        spending = self.ledger.spending(reserved)
        spending.claims = [claim] if claim is not None else []
        return spending

    def admit_once(self, plan: ReleasePlan, data: DataVersion, key: str,
                   **context: str) -> Spending | None:
        """:meth:`admit` of the whole ``plan`` once per ``key`` (a search's identity): None,
        with nothing recorded, when a release that counts holds ``key`` already (the same
        search resumed, or joined by a process started at the same time,
        :meth:`SourceLedger.reserve_once`)."""
        self.check(plan)
        reserved = self.ledger.reserve_once(
            key, data.source, data.source_md5, plan.ledger_event, plan.delta,
            **self._charge(data), **self._whole(plan), context=context)
        return None if reserved is None else self.ledger.spending(reserved)

    @staticmethod
    def _whole(plan: ReleasePlan) -> dict[str, Any]:
        """What a reservation of the whole ``plan`` records besides its event."""
        return {"epsilon": plan.epsilon_total if not plan.test_noisy else None,
                "without_guarantee": [f"{m.label}: {m.no_epsilon_label}"
                                      for m in plan.without_guarantee]}

    def _charge(self, data: DataVersion) -> dict[str, Any]:
        """Who a reservation on ``data`` is charged to, and the lifetime limit it is held to."""
        return {"fingerprints": data.fingerprints, "lifetime_epsilon": self.budget.lifetime_epsilon,
                "disjoint": self.budget.disjoint_from_previous, "account": data.account}

    def _claim_resume(self, claim: str, parent_run_id: str) -> None:
        """Claim the resumption of a crashed pipeline run atomically (in the ledger's store),
        and refuse it when another process has resumed it meanwhile: two resumptions would
        retrain and release the same trainings twice."""
        self.ledger.store.claim(claim)
        if any(r.status == "released" and r.context.get("resumes") == parent_run_id
               for r in self.ledger.releases()):
            self.ledger.store.unclaim(claim)
            raise PrivacyError(
                f"pipeline run {parent_run_id} was resumed by another dpfair process meanwhile; "
                "nothing was trained. Run again: it starts afresh or resumes what is left")

    def reserve(self, data: DataVersion, event: dp_event.DpEvent, delta: float, *,
                epsilon: float | None = None, without_guarantee: Any = (),
                **context: str) -> Release:
        """Reserve ``event`` on ``data``'s people (the lifetime check alone)."""
        return self.ledger.reserve(
            data.source, data.source_md5, event, delta, epsilon=epsilon,
            without_guarantee=list(without_guarantee), context=context, **self._charge(data))

    def spent(self, data: DataVersion, delta: float) -> float:
        """ε already spent on ``data``'s people (the most spent account it touches)."""
        return self.ledger.spent(data.source, data.source_md5, delta,
                                 self.budget.disjoint_from_previous, data.fingerprints,
                                 data.account)
