"""URLs as they may be shown: the password of ``scheme://user:password@host`` masked.

Tracking and storage URLs may carry credentials (HTTP basic auth for a tracking server, a
database password for ``postgresql://user:pw@host/db``). Every message, printed line, log
record and logged param that shows such a URL shows :func:`mask_url` of it, so the password
appears nowhere but in the user's own configuration. :func:`credentials` splits a URL into the
URL without its user info and the ``(user, password)`` to send as basic auth (urllib does not
read them from the URL). A leaf: imports only the standard library.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"
_IN_TEXT = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"]+):[^\s@/'\"]+@")


def _parts(url: str):  # -> SplitResult | None: None when there is no user info
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    return parts if "@" in parts.netloc else None


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (``postgresql://bob:***@db/optuna``); a URL
    without credentials unchanged. Text that is not a URL is returned as it is."""
    parts = _parts(str(url))
    if parts is None:
        return str(url)
    userinfo, _, host = parts.netloc.rpartition("@")
    user, has_password, _ = userinfo.partition(":")
    shown = f"{user}:{MASK}" if has_password else user
    return urlunsplit(parts._replace(netloc=f"{shown}@{host}"))


def mask_text(text: str) -> str:
    """``text`` (a YAML file, a message) with the password of every URL in it masked."""
    return _IN_TEXT.sub(rf"\1:{MASK}@", text)


def credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``(url without user info, (user, password) or None)``; percent-escapes decoded."""
    parts = _parts(url)
    if parts is None:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    return urlunsplit(parts._replace(netloc=host)), (unquote(user), unquote(password))


# --------------------------------------------------------------------------- supported schemes

#: Where a tracking store, an artifact root and an Optuna storage may be: each scheme dpfair
#: supports and the module its client needs (None: one of dpfair's own dependencies). A plain
#: path is ``file``; ``postgresql+DRIVER://`` needs the module DRIVER instead.
TRACKING_SCHEMES: dict[str, str | None] = {
    "file": None, "sqlite": None, "http": None, "https": None, "postgresql": "psycopg2"}
ARTIFACT_SCHEMES: dict[str, str | None] = {
    "file": None, "mlflow-artifacts": None, "s3": "boto3", "gs": "google.cloud.storage"}
STORAGE_SCHEMES: dict[str, str | None] = {"sqlite": None, "journal": None,
                                          "postgresql": "psycopg2"}
#: the package to install for a module whose distribution is named otherwise
_PACKAGE = {"psycopg2": "psycopg2-binary", "google.cloud.storage": "google-cloud-storage"}
_IN_MEMORY = ("sqlite://", "sqlite:///:memory:")
_FORM = {"file": "a folder path", "journal": "journal:PATH", "sqlite": "sqlite:///FILE"}


def scheme_of(url: str) -> str:
    """The scheme of ``url`` (``file`` for a plain path), without a ``+driver`` part."""
    if "://" not in url and not url.startswith("journal:"):
        return "file"
    return urlsplit(url).scheme.lower().partition("+")[0]


def check_scheme(url: str, supported: dict[str, str | None], what: str) -> None:
    """``ValueError`` naming ``what``, the URL (masked) and the fix unless ``url`` is of a
    scheme in ``supported`` whose client module is installed, and not a database in memory
    (lost when the command ends, and worker processes cannot share it). The one check of a
    URL's scheme for the tracking store, the artifact root and the search storage."""
    import importlib.util

    shown = mask_url(url)
    scheme = scheme_of(url)
    if scheme not in supported:
        forms = ", ".join(_FORM.get(s, f"{s}://...") for s in supported)
        raise ValueError(f"{what} {shown!r}: the scheme {scheme!r} is not supported; give one "
                         f"of: {forms}")
    if url.strip() in _IN_MEMORY:
        raise ValueError(f"{what} {shown!r} is a database in memory: it is lost when the "
                         "command ends and other processes cannot reach it; give a file, "
                         "e.g. sqlite:///FILE")
    driver = urlsplit(url).scheme.partition("+")[2] or supported[scheme]
    if driver is None:
        return
    try:
        found = importlib.util.find_spec(driver) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ValueError(f"{what} {shown!r} needs the Python module {driver!r}, which is not "
                         f"installed: pip install {_PACKAGE.get(driver, driver)}, or give "
                         "another URL")
