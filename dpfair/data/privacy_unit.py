"""The privacy unit a private dataset declares: what one ε protects, and whose account pays.

``datasets.<name>.privacy_unit`` (a ``kind: table`` dataset)::

    privacy_unit:
      unit: person              # row (default) | person
      max_rows_per_person: 3    # person: the most rows one id may hold (more: refused)
      account: loans-eu         # optional: these people are nobody else's (a declaration)

``unit: row`` protects the change of one row; ``unit: person`` the change of every row of one
person (``id_column``), at most ``max_rows_per_person`` of them, so every ε is charged for a
change of that many rows (group privacy, :func:`dpfair.accounting.accountant.with_group`).

``account``: without it every private source of a project draws on **one project account**,
since nothing proves that two tables hold different people (a renamed column or an added
feature is the same people). A named account is a declaration that the source's people are
in no other account: checked on the person ids where the table has an ``id_column``, else
recorded in the privacy ledger as the user's attestation (:mod:`dpfair.ledger.accounts`).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

__all__ = ["MAX_ROWS_PER_PERSON", "PrivacyUnit"]

MAX_ROWS_PER_PERSON = 10_000
_ACCOUNT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")


class PrivacyUnit(BaseModel):
    """What one ε protects (module docstring)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    unit: Literal["row", "person"] = Field(
        "row", description="row: one row's change; person: all rows of one id_column value")
    max_rows_per_person: PositiveInt | None = Field(
        None, le=MAX_ROWS_PER_PERSON,
        description="unit person: the most rows one person holds (a file with more is refused)")
    account: str | None = Field(
        None, description="declare that these people are in no other account of the project "
        "(verified on id_column where there is one, else recorded as your attestation)")

    @model_validator(mode="after")
    def _consistent(self) -> PrivacyUnit:
        if self.unit == "person" and self.max_rows_per_person is None:
            raise ValueError("privacy_unit: unit person needs max_rows_per_person, the most "
                             "rows one person holds (e.g. max_rows_per_person: 1)")
        if self.unit == "row" and self.max_rows_per_person is not None:
            raise ValueError("privacy_unit: max_rows_per_person applies to unit: person only; "
                             "set unit: person (with id_column) or remove it")
        if self.account is not None and not _ACCOUNT.fullmatch(self.account):
            raise ValueError(f"privacy_unit.account: {self.account!r} is no account name: up to "
                             "40 letters, digits, '_', '-' or '.', starting with a letter or digit")
        return self

    @property
    def rows(self) -> int:
        """Rows one unit may hold: what every ε is charged for."""
        return self.max_rows_per_person or 1

    def describe(self, id_column: str | None = None) -> str:
        """The unit in words, as every ε names it."""
        if self.unit == "row":
            return "one row"
        rows = self.rows
        by = f" by {id_column}" if id_column else ""
        return f"one person{by} (up to {rows} row{'s' if rows > 1 else ''})"
