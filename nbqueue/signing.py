"""Signed jobs: code a kernel runs only if a process of its own user queued it.

A notebook's worker runs code: `%%enqueue` cells, and notebook functions queued
with `%enqueue`. Anyone who can write a row to a shared queue could otherwise
name such a task and have the kernel run it. So what the magics queue is
signed: an HMAC-SHA256 over the job's task and payload, with a secret kept in a
file only its user can read (`~/.config/nbqueue/secret`, or
`$NBQUEUE_SECRET_FILE`). A restarted kernel of the same user reads the same
secret and still takes its jobs back; a forged, altered or unsigned row never
runs. A column saying where a job came from would be forgeable; a signature is
not without the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import threading
from pathlib import Path

from .errors import NbqueueError

ENVIRONMENT = "NBQUEUE_SECRET_FILE"
_cache: dict[str, bytes] = {}
_lock = threading.Lock()


class SigningError(NbqueueError):
    """The signing secret cannot be read or is not private; the message says how to fix it."""


def secret_path() -> Path:
    """Where this user's signing secret lives."""
    given = os.environ.get(ENVIRONMENT)
    if given:
        return Path(given).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "nbqueue" / "secret"


def secret() -> bytes:
    """This user's secret: read from its file, made (owner-only) on first use."""
    path = secret_path()
    with _lock:
        cached = _cache.get(str(path))
        if cached is not None:
            return cached
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(handle, "w") as out:
                out.write(secrets.token_hex(32))
        info = os.stat(path)
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SigningError(
                f"the signing secret {path} must belong to you and be private (chmod 600 {path}); "
                "jobs signed with a secret others can read prove nothing"
            )
        value = path.read_text().strip().encode()
        if len(value) < 32:
            raise SigningError(f"the signing secret {path} is too short; delete it and a new one is made")
        _cache[str(path)] = value
        return value


def sign(task: str, payload: str) -> str:
    """The signature of a job: task name and stored payload text, under this user's secret."""
    message = f"{task}\n{payload}".encode("utf-8", "surrogatepass")
    return hmac.new(secret(), message, hashlib.sha256).hexdigest()


def verify(task: str | None, payload: str, signature: str | None) -> bool:
    """True when `signature` was made by this user for exactly this task and payload."""
    if task is None or not signature:
        return False
    return hmac.compare_digest(sign(task, payload), signature)
