"""Empirical privacy audit per group (``dpfair audit``): one training run with canaries, an
ε lower bound per protected group (Steinke, Nasr & Jagielski 2023).

Modules: ``bound`` (the one-run bound), ``canaries`` (input-space canaries), ``gradient``
(Dirac gradient canaries through the engine hook), ``config`` (settings, params.yaml's
``audit:``), ``run`` (:func:`audit`), ``plot`` (score histograms, matplotlib). MLflow logging
lives at the adapter layer (:mod:`dpfair.pipeline.audit_run`).

An audit gives an empirical *lower* bound: a bound above the claimed ε shows a bug (or a
claim that does not hold): the verdict "VIOLATION". A bound below it proves nothing about
privacy; it says "consistent" only when the audit had the power to catch a stated leak over
the claim, and "cannot decide" otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpfair.audit.config import AuditSection, AuditSettings
from dpfair.lazy import lazy_getattr

if TYPE_CHECKING:
    from dpfair.audit.bound import (
        detection_power,
        epsilon_lower_bound,
        mu_lower_bound,
        p_value,
    )
    from dpfair.audit.run import (
        VIOLATION,
        AuditResult,
        CanaryPlan,
        GroupAudit,
        audit,
        claimed_epsilon,
        group_ids,
        plan_canaries,
    )

# The bound (scipy.stats) and the run (torch) load on first use: params.yaml's ``audit:``
# section is read by every command's configuration check, which must stay light.
__getattr__ = lazy_getattr(__name__, {
    **dict.fromkeys(["detection_power", "epsilon_lower_bound", "mu_lower_bound", "p_value"],
                    "bound"),
    **dict.fromkeys(["VIOLATION", "AuditResult", "CanaryPlan", "GroupAudit", "audit",
                     "claimed_epsilon", "group_ids", "plan_canaries"], "run"),
})

__all__ = [
    "VIOLATION",
    "AuditResult",
    "CanaryPlan",
    "AuditSection",
    "AuditSettings",
    "GroupAudit",
    "audit",
    "detection_power",
    "group_ids",
    "plan_canaries",
    "claimed_epsilon",
    "epsilon_lower_bound",
    "mu_lower_bound",
    "p_value",
]
