"""The privacy gate and its durable ledger (what was spent on whose data, over time).

* :mod:`~dpfair.ledger.gate`: the one component every entry point goes through (plan, check,
  reserve, release or void);
* :mod:`~dpfair.ledger.accounts`: which account a data version draws on (one project account
  unless declared otherwise);
* :mod:`~dpfair.ledger.book`: accounts of people and their lifetime budget;
* :mod:`~dpfair.ledger.people`: keyed fingerprints of rows and person ids, the published
  data-version id;
* :mod:`~dpfair.ledger.store`: the SQL store (SQLite by default, a server for a team).
"""

from dpfair.ledger.book import Release, SourceLedger, Spending
from dpfair.ledger.gate import DataVersion, PrivacyGate

__all__ = ["DataVersion", "PrivacyGate", "Release", "SourceLedger", "Spending"]
