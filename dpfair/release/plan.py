"""What a pipeline run releases and the ε that covers it.

Per method a run releases its search (a tuned method: the selected configuration, or with
``tuning.release: all_trials`` every trial, its score and K) and, on each seed, a trained model
with its test metrics. All of them are computed from the same training data, so they compose:
a method's release is ``ComposedDpEvent([search, run_1, ..., run_S])`` and the run's total is
the composition of every method's release, evaluated by the tightest valid accountant
(:func:`dpfair.accounting.accountant.spend`: PLD, with a search's privacy profile, or RDP, the
smaller; every figure names its accountant, :data:`EPSILON_ACCOUNTANT`), never a sum of epsilons,
known before anything trains and checked against ``budget`` by the gate
(:func:`dpfair.release.allowed.check_budget`).

A tuned method's final runs train the selected configuration, which the search releases, so
their event must hold whichever configuration is selected: it is the search's per-run bound
over its space (:func:`dpfair.tuning.search_events.combine_run_events`; the selected configuration's
own event whenever the space leaves σ, q and the steps alone).

Releases without a guarantee (the non-private reference; heuristic methods, e.g. FairLens):
no ε, left out of the total, shown with a label, refused unless the budget allows them.

The test split is other rows: its metrics are either exact (the default; ε does not cover
them, :data:`TEST_METRICS_NOTE`) or noisy (``test_metrics.release: noisy``,
:mod:`dpfair.fairness.noisy`). Every method and seed evaluates the same test rows, so the
test split's ε is the composition of all of their noisy releases, whatever the method's
training guarantee (its model never saw a test row): a line of its own
(:data:`EPSILON_TEST`), never mixed into the training ε.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from dp_accounting import dp_event

from dpfair import accounting
from dpfair.release.labels import (
    EPSILON_METHOD,
    EPSILON_RUN,
    EPSILON_TEST,
    HEURISTIC,
    NONPRIVATE_REFERENCE,
    PRIVATE_LEDGER_STATUS,
    TEST_METRICS_NOTE,
)
from dpfair.training.config import REPLAYABLE_NOISE
from dpfair.tuning.search_events import search_event

if TYPE_CHECKING:
    from dpfair.config.sections import ReleaseMode
    from dpfair.methods import PrivacyGuarantee
    from dpfair.training import MetricsRelease
    from dpfair.tuning.config import TuningConfig
    from dpfair.tuning.job import TuningResult

__all__ = [
    "MethodRelease",
    "ReleasePlan",
    "SearchRelease",
    "epsilon_cells",
    "epsilon_test_cell",
    "epsilon_text",
    "method_release",
    "release_plan",
    "search_release",
    "write_ledger",
]

_NOT_TUNED = "not tuned"


@dataclass(frozen=True)
class SearchRelease:
    """What a method's search releases: ``event`` (None: no guarantee, a grid search),
    ``run_event`` (the per-run bound over the space, the event of each final run) and a
    label saying which bound ``event`` is."""

    event: dp_event.DpEvent | None
    run_event: dp_event.DpEvent
    label: str
    reproducible: bool
    #: the trials are scored on the validation rows without noise (``public_validation``)
    unnoised_scores: bool = False


@dataclass(frozen=True)
class MethodRelease:
    """Everything a run releases for method ``label``, with its ε at the plan's ``delta``:
    ``epsilon_run`` of one final training run, ``epsilon_search`` of the search (None: not
    tuned), ``epsilon`` of all of it composed (``inf`` without a guarantee)."""

    label: str
    guarantee: PrivacyGuarantee
    seeds: tuple[int, ...]
    run_events: tuple[dp_event.DpEvent, ...]
    search: SearchRelease | None
    reproducible: bool
    delta: float
    epsilon_run: float
    epsilon_search: float | None
    epsilon: float
    #: how each seed's run releases its test metrics; ``epsilon_test``: their composition's
    #: ε for the test rows (None: exact, not covered)
    test_releases: tuple[MetricsRelease, ...] = ()
    epsilon_test: float | None = None
    #: the accountants of ``epsilon_run``, ``epsilon_search``, ``epsilon`` (``ACCOUNTANTS``)
    accountant_run: str = accounting.ACCOUNTANT_NONE
    accountant_search: str | None = None
    accountant: str = accounting.ACCOUNTANT_NONE

    @property
    def test_noisy(self) -> bool:
        """Whether every run of the method releases noisy test metrics."""
        return bool(self.test_releases) and all(t.noisy for t in self.test_releases)

    @property
    def test_event(self) -> dp_event.DpEvent | None:
        """The composition of the method's test releases (None: exact)."""
        if not self.test_noisy:
            return None
        return dp_event.ComposedDpEvent([t.event for t in self.test_releases])

    @property
    def ledger_event(self) -> dp_event.DpEvent:
        """What the data source's privacy ledger records (:func:`ledger_event`)."""
        return ledger_event(self.event if self.has_epsilon else None, self.test_event)

    @property
    def has_epsilon(self) -> bool:
        """Whether an ε describes this release (a proven method; else it has a label)."""
        return self.guarantee == "proven"

    @property
    def tuning(self) -> str:
        return self.search.label if self.search is not None else _NOT_TUNED

    @property
    def retrained(self) -> str:
        """Trainings beyond one per seed (a resumed run's crashed attempts), as a phrase."""
        extra = len(self.run_events) - len(self.seeds)
        return f"; {extra} crashed attempt(s) retrained, each counted again" if extra else ""

    @property
    def event(self) -> dp_event.DpEvent:
        """The composition of everything released for the method."""
        search = [] if self.search is None else [self.search.event or dp_event.NonPrivateDpEvent()]
        return dp_event.ComposedDpEvent([*search, *self.run_events])

    @property
    def no_epsilon_label(self) -> str:
        """What is shown instead of ε when there is none (else empty)."""
        return {"none": NONPRIVATE_REFERENCE, "heuristic": HEURISTIC}.get(self.guarantee, "")

    @property
    def epsilon_note(self) -> str:
        """What this method's ε means, or why it has none (an MLflow tag, a results note)."""
        if self.guarantee == "none":
            return (f"{NONPRIVATE_REFERENCE} (trained without noise): its test metrics are "
                    "released without any guarantee and are not in the total")
        if self.guarantee == "heuristic":
            return (f"{HEURISTIC} (privacy_guarantee 'heuristic': its sensitivity is not "
                    "bounded by its clip norm): no ε is reported and it is not in the total")
        seeds = ", ".join(str(s) for s in self.seeds)
        return (f"epsilon: this training run alone, at its delta ({self.accountant_run}); "
                f"epsilon_method_release: {EPSILON_METHOD} (search: {self.tuning}; seeds "
                f"{seeds}{self.retrained}) at δ = {self.delta:g} ({self.accountant})")


@dataclass(frozen=True)
class ReleasePlan:
    """Every method's release and the run's total: ``epsilon_total`` of ``event_total``, the
    composition of the releases that have a guarantee, at ``delta``."""

    methods: dict[str, MethodRelease]
    delta: float
    event_total: dp_event.DpEvent
    epsilon_total: float
    #: the test split's line: every noisy test release composed, its ε at ``test_delta``
    #: (None: the test metrics are exact)
    test_event_total: dp_event.DpEvent | None = None
    epsilon_test_total: float | None = None
    test_delta: float | None = None
    #: which accountant gave ``epsilon_total`` and ``epsilon_test_total``
    accountant_total: str = accounting.ACCOUNTANT_NONE
    accountant_test: str | None = None
    #: budget-first planning (:mod:`dpfair.release.budget`): the methods' noise × noise_scale
    noise_scale: float | None = None
    noise_kept: tuple[str, ...] = ()

    @property
    def test_noisy(self) -> bool:
        return self.epsilon_test_total is not None

    @property
    def ledger_event(self) -> dp_event.DpEvent:
        """What the data source's privacy ledger records for the run (:func:`ledger_event`)."""
        return ledger_event(self.event_total, self.test_event_total)

    @property
    def without_guarantee(self) -> list[MethodRelease]:
        return [m for m in self.methods.values() if not m.has_epsilon]

    @property
    def reproducible(self) -> bool:
        return any(m.reproducible for m in self.methods.values())

    @property
    def total_label(self) -> str:
        """The row label of the run's total ε, naming the releases it does not cover."""
        missing = ["non-private reference" if m.guarantee == "none" else m.label
                   for m in self.without_guarantee]
        label = "run total: private releases composed"
        if missing:
            label += f" (released without guarantee, not covered: {', '.join(missing)})"
        return label

    def notes(self) -> list[str]:
        """What the results say once about what ε covers (results.md, the MLflow run's
        description): the columns, the total, what has no guarantee, the test metrics."""
        seeds = ", ".join(str(s) for s in next(iter(self.methods.values())).seeds)
        notes = [
            f"Privacy: '{EPSILON_RUN}' is the ε of one final model; "
            f"'{EPSILON_METHOD}' composes the method's search with its final models on seeds "
            f"{seeds}; the last row composes every private release of this run (not a sum of "
            f"epsilons). Every ε is at δ = {self.delta:g} and is the tightest valid figure of "
            f"two accountants, PLD and RDP; accountants: {self.accountants()}.",
            *(f"{m.label}: {m.epsilon_note}" for m in self.without_guarantee),
            *(f"{m.label}: resumed run{m.retrained}" for m in self.methods.values()
              if m.retrained),
            self.test_note(),
        ]
        if self.reproducible:
            notes.append(f"Reproducible run: {REPLAYABLE_NOISE}.")
        return notes

    def accountants(self) -> str:
        """Which accountant gave each figure, as one phrase."""
        parts = [f"{m.label}: one run {m.accountant_run}"
                 + (f", search {m.accountant_search}" if m.accountant_search else "")
                 + f", composed {m.accountant}" for m in self.methods.values() if m.has_epsilon]
        parts += [f"total: {self.accountant_total}"] + (
            [f"test split: {self.accountant_test}"] if self.accountant_test else [])
        return "; ".join(parts)

    def test_note(self) -> str:
        """What the test metrics are: exact (:data:`TEST_METRICS_NOTE`) or noisy, with the
        test split's total ε."""
        if not self.test_noisy:
            return TEST_METRICS_NOTE
        return (f"Test metrics are released with Gaussian noise (dpfair.fairness.noisy: noisy "
                f"per-group counts, correct predictions and clipped losses; no per-class "
                f"metric or count): '{EPSILON_TEST}' composes a method's evaluations on all "
                f"its seeds, and the last row every method's: ε "
                f"{_fmt(self.epsilon_test_total)} at δ = {self.test_delta:g} for the test "
                "rows, separate from the training ε (other rows; a person in both splits "
                "pays both).")

    def itemised(self) -> list[str]:
        """One line per method and one for the total: the spend, as the budget sees it."""
        lines = []
        for m in self.methods.values():
            if not m.has_epsilon:
                lines.append(f"{m.label}: {m.no_epsilon_label} (no ε; not in the total)")
                continue
            search = (f"search ε {_fmt(m.epsilon_search)} ({m.tuning}; {m.accountant_search}); "
                      if m.epsilon_search is not None else "not tuned; ")
            seeds = ", ".join(str(s) for s in m.seeds)
            lines.append(f"{m.label}: {search}seeds {seeds}: ε {_fmt(m.epsilon_run)} each "
                         f"(one training run; {m.accountant_run}){m.retrained}; composed: ε "
                         f"{_fmt(m.epsilon)} ({m.accountant})")
        lines.append(f"total, composition of every private release: ε {_fmt(self.epsilon_total)} "
                     f"at δ = {self.delta:g} ({self.accountant_total})")
        if self.test_noisy:
            per = "; ".join(f"{m.label} {_fmt(m.epsilon_test)}" for m in self.methods.values())
            lines.append(f"test split (noisy test metrics, other rows): {per}; composed: ε "
                         f"{_fmt(self.epsilon_test_total)} at δ = {self.test_delta:g} "
                         f"({self.accountant_test})")
        if self.noise_scale is not None:
            kept = f"; kept as configured: {', '.join(self.noise_kept)}" if self.noise_kept else ""
            lines.append(f"budget-first: every noise multiplier of the other private methods "
                         f"(training σ, count σ, score σ) × {self.noise_scale:.4g}{kept}")
        if self.reproducible:
            lines.append(f"reproducible: {REPLAYABLE_NOISE}")
        return lines


def ledger_event(training: dp_event.DpEvent | None, test: dp_event.DpEvent | None
                 ) -> dp_event.DpEvent:
    """The event a release adds to the data source's cumulative ledger
    (:mod:`dpfair.ledger`): its private training releases and its noisy test-metric
    releases, composed. Within one run the test rows are other people than the training rows,
    so the run's own table keeps them on separate lines; across releases they are not: a later
    version of the source, or another split seed, may put today's test rows into training, so
    the ledger composes them sequentially (the bound that holds whatever the splits). Exact
    test metrics are not covered by any ε and add nothing here."""
    events = [e for e in (training, test) if e is not None]
    if not events:
        return dp_event.NoOpDpEvent()
    return events[0] if len(events) == 1 else dp_event.ComposedDpEvent(events)


def _fmt(eps: float | None) -> str:
    return "∞" if eps is None or not math.isfinite(eps) else f"{eps:.3g}"


def search_release(
    cfg: TuningConfig, run_event: dp_event.DpEvent, k: int, release: ReleaseMode
) -> SearchRelease:
    """The release of a search with settings ``cfg``, per-run event ``run_event`` and K = ``k``.

    ``selected``: :func:`dpfair.tuning.search_events.search_event` (the bound of ``cfg.mode``, e.g.
    RepeatAndSelect, Papernot & Steinke 2022 Thm. 2; it covers only the selected run, so K and
    the other trials stay private). ``all_trials``: every run and its score are public, so the
    bound is their composition, ``SelfComposed(run ∘ score, K)`` (the same function in mode
    ``fixed`` with ``n_runs = K``); a grid search has no guarantee either way.
    """
    scores = " and their noisy score releases" if cfg.score_privacy == "noisy" else ""
    if release == "all_trials" and cfg.mode != "grid":
        fixed = cfg.model_copy(update={"mode": "fixed", "n_runs": k})
        event = search_event(fixed, run_event)
        label = f"all {k} trials released: composition of the {k} runs{scores}"
    else:
        event = search_event(cfg, run_event)
        selected = "only the selected configuration released"
        label = {
            "tnb": f"RepeatAndSelect, TNB η={cfg.eta:g} μ={cfg.mu:g}: {selected}",
            "poisson": f"RepeatAndSelect, Poisson μ={cfg.mu:g}: {selected}",
            "binomial": f"best of K ~ Binomial({cfg.n_runs}, {cfg.p}) runs: {selected}",
            "fixed": f"best of {cfg.n_runs} runs: composition of the {cfg.n_runs} runs{scores}",
            "grid": "grid search: no DP guarantee",
        }[cfg.mode]
    unnoised = cfg.score_privacy == "public_validation"
    if unnoised:
        label += "; validation scores released without noise (no guarantee)"
    return SearchRelease(event=event, run_event=run_event, label=label,
                         reproducible=cfg.reproducible, unnoised_scores=unnoised)


def method_release(
    label: str,
    guarantee: PrivacyGuarantee,
    seeds: Sequence[int],
    run_events: Sequence[dp_event.DpEvent],
    search: SearchRelease | None,
    reproducible: bool,
    delta: float,
    test: Sequence[MetricsRelease] = (),
) -> MethodRelease:
    """A method's release (``run_events``: one per seed) with its epsilons at ``delta``; a
    method without a proven guarantee gets none (``inf``). ``reproducible``: its runs draw
    their noise from the seed (the non-private reference has no noise to replay). ``test``:
    each seed's test-metric release; noisy ones get their composed ε for the test rows,
    whatever the training guarantee."""
    release = MethodRelease(
        label=label, guarantee=guarantee, seeds=tuple(seeds), run_events=tuple(run_events),
        search=search, delta=delta, epsilon_run=math.inf,
        reproducible=guarantee != "none" and (reproducible or bool(search and search.reproducible)),
        epsilon_search=None if search is None else math.inf, epsilon=math.inf,
        test_releases=tuple(test),
    )
    if release.test_event is not None:
        release = replace(release, epsilon_test=accounting.epsilon(
            release.test_event, _test_delta(release.test_releases)))
    if not release.has_epsilon:
        return release
    run = max((accounting.spend(e, delta) for e in run_events), key=lambda sp: sp.epsilon)
    found = search and accounting.spend(search.event or dp_event.NonPrivateDpEvent(), delta)
    total = accounting.spend(release.event, delta)
    return replace(release, epsilon_run=run.epsilon, accountant_run=run.accountant,
                   epsilon_search=found and found.epsilon, epsilon=total.epsilon,
                   accountant_search=found and found.accountant, accountant=total.accountant)


def _test_delta(releases: Sequence[MetricsRelease]) -> float:
    """The δ of composed test releases: the largest of theirs."""
    return max(t.delta for t in releases if t.delta is not None)


def release_plan(methods: Sequence[MethodRelease], delta: float) -> ReleasePlan:
    """The run's releases and their total ε (the composition of those with a guarantee), and
    the test split's line when every method's test metrics are noisy (module docstring)."""
    private = [m.event for m in methods if m.has_epsilon]
    total = dp_event.ComposedDpEvent(private)
    spent = accounting.spend(total, delta) if private else None
    plan = ReleasePlan(methods={m.label: m for m in methods}, delta=delta, event_total=total,
                       epsilon_total=spent.epsilon if spent else 0.0,
                       accountant_total=spent.accountant if spent else accounting.ACCOUNTANT_NONE)
    tests = [m.test_event for m in methods]
    if not methods or any(e is None for e in tests):
        return plan
    test_total = dp_event.ComposedDpEvent(tests)
    test_delta = _test_delta([t for m in methods for t in m.test_releases])
    test_spent = accounting.spend(test_total, test_delta)
    return replace(plan, test_event_total=test_total, test_delta=test_delta,
                   epsilon_test_total=test_spent.epsilon, accountant_test=test_spent.accountant)


def epsilon_cells(m: MethodRelease) -> tuple[str, str]:
    """The two ε cells of method ``m`` in a results table: one training run, and everything
    released for the method (a label instead of a number when there is no guarantee)."""
    if not m.has_epsilon:
        return m.no_epsilon_label, m.no_epsilon_label
    if m.search is not None and m.search.event is None:
        return epsilon_text(m.epsilon_run), f"∞ ({m.search.label})"
    return epsilon_text(m.epsilon_run), epsilon_text(m.epsilon)


def epsilon_test_cell(m: MethodRelease) -> str:
    """Method ``m``'s :data:`EPSILON_TEST` cell: its noisy test releases' ε, or why none."""
    return epsilon_text(m.epsilon_test) if m.epsilon_test is not None else "exact: not covered"


def epsilon_text(eps: float) -> str:
    """An ε as a results table shows it: two decimals, ``∞`` when unbounded."""
    return f"{eps:.2f}" if math.isfinite(eps) else "∞"


def write_ledger(result: TuningResult, release: ReleaseMode) -> Path:
    """Write the search's ledger (every trial, its score and hyperparameters, K) as JSON next
    to its Optuna storage (the working directory for a server storage) and return its path.

    ``selected``: ``<study>.ledger.PRIVATE.json``, private working state whose top-level
    ``status`` says so: the search's ε covers only the selected configuration, so this file
    must never be published (nor logged to MLflow). ``all_trials``: ``<study>.ledger.json``,
    part of the release (its ε is the composition of all K runs).
    """
    storage = result.storage
    folder = Path.cwd()
    for prefix in ("journal:", "sqlite:///"):
        if storage.startswith(prefix) and storage[len(prefix):] != ":memory:":
            folder = Path(storage[len(prefix):]).resolve().parent
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", result.study_name)
    private = release == "selected"
    path = folder / f"{name}.ledger{'.PRIVATE' if private else ''}.json"
    status = PRIVATE_LEDGER_STATUS if private else (
        "released: every trial of the search; its ε is the composition of all K runs")
    payload = {
        "status": status,
        "study": result.study_name,
        "storage": storage,
        "K": result.K,
        "best_trial": result.best_trial,
        "best_score": result.best_score,
        "reproducible": result.reproducible,
        "trials": result.trials,
    }
    path.write_text(json.dumps(payload, indent=2, default=str), encoding="utf-8")
    return path
