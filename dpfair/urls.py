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
