"""Where a queue lives: a SQLite file path or a PostgreSQL URL, and how it is shown.

A notebook should be able to name its queue without writing a password into
its source: with no target given, `NBQUEUE_URL` names it; a PostgreSQL URL
without a password uses libpq's own ways (PGPASSWORD, ~/.pgpass). Wherever a
target is shown (reprs, the board, the CLI's messages) the password is masked.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

from .errors import InvalidArgument

ENVIRONMENT = "NBQUEUE_URL"
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@:]*):(?P<secret>[^/@]*)@")
_QUERY_PASSWORD = re.compile(r"(?i)(password=)[^&\s]*")


def resolve(target: str | os.PathLike[str] | None) -> str:
    """The target as a string; None means the one `NBQUEUE_URL` names."""
    if target is None:
        target = os.environ.get(ENVIRONMENT) or None
        if target is None:
            raise InvalidArgument(
                "a queue needs a file path or a postgresql:// URL "
                f"(or set the {ENVIRONMENT} environment variable)"
            )
    return os.fspath(target) if isinstance(target, os.PathLike) else target


def redact(target: object) -> str:
    """The target as it may be shown: a URL's password (in its user part or its query) as ***."""
    text = str(target)
    if "://" not in text:
        return text
    try:
        parts = urlsplit(text)
        netloc = parts.netloc
        if parts.password is not None:
            host = parts.hostname or ""
            if parts.port is not None:
                host = f"{host}:{parts.port}"
            netloc = f"{parts.username or ''}:***@{host}"
        query = _QUERY_PASSWORD.sub(r"\1***", parts.query)
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    except ValueError:  # a URL too odd to parse (a bad port, say): mask by pattern
        return _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\g<head>:***@", text))


def mask_in(text: str, target: object) -> str:
    """`text` (an error message, say) with the target's password masked wherever it appears."""
    try:
        secret = urlsplit(str(target)).password if "://" in str(target) else None
    except ValueError:
        secret = None
    text = _QUERY_PASSWORD.sub(r"\1***", text.replace(str(target), redact(target)))
    return text.replace(secret, "***") if secret else text
