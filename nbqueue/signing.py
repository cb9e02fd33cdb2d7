"""Signed jobs: code a kernel runs only if a process of its own user queued it.

A notebook's worker runs code: `%%enqueue` cells, and notebook functions queued
with `%enqueue`. Anyone who can write a row to a shared queue could otherwise
name such a task and have the kernel run it. So what the magics queue is
signed: an HMAC-SHA256 with a secret kept in a file only its user can read
(`~/.config/nbqueue/secret`, or `$NBQUEUE_SECRET_FILE`). A restarted kernel of the
same user reads the same secret and still takes its jobs back; a forged, altered
or unsigned row never runs. A column saying where a job came from would be
forgeable; a signature is not without the secret.

A job's signature, "2.<nonce>.<hmac>", covers the database it was written to (its
random identity, and a PostgreSQL schema's name), a fresh random nonce, and what
decides what runs and how: task, payload, queue, max_retries, timeout, backoff,
limits. The database binds the nonce to the first job that runs it and records
when that run ended (nbqueue.trust), so a copy of the row, or the row set back to
pending after it ended, never runs. A signed job's result is vouched for with a
MAC of its own, so that a signed child takes only results its user's jobs made.
Stored schedules keep the first form (task and payload, hex alone).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import threading
from pathlib import Path
from typing import NamedTuple

from .errors import NbqueueError

ENVIRONMENT = "NBQUEUE_SECRET_FILE"
VERSION = "2"
NONCE_CHARS = 32  # hex digits of a signature's nonce: "2.<nonce>.<hmac>"
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
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        except OSError as exc:
            raise SigningError(f"the signing secret {path} cannot be made ({exc.strerror})") from None
        else:
            with os.fdopen(handle, "w") as out:
                out.write(secrets.token_hex(32))
        value = _read_private(path)
        if len(value) < 32:
            raise SigningError(f"the signing secret {path} is too short; delete it and a new one is made")
        _cache[str(path)] = value
        return value


def _read_private(path: Path) -> bytes:
    """The secret file's text: a regular file (never through a symlink, which could point at
    another private file) that belongs to this user and only this user can read."""
    try:  # O_NOFOLLOW: a symlink is refused; the checks are made on what was opened
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        link = os.path.islink(path)
        why = "is a symlink; give the file itself" if link else f"cannot be read ({exc.strerror})"
        raise SigningError(f"the signing secret {path} {why}") from None
    info = os.fstat(handle)
    if not stat.S_ISREG(info.st_mode):
        os.close(handle)
        raise SigningError(
            f"the signing secret {path} is not a regular file; delete it and a new one is made"
        )
    with os.fdopen(handle, "rb") as source:
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SigningError(
                f"the signing secret {path} must belong to you and be private (chmod 600 {path}); "
                "jobs signed with a secret others can read prove nothing"
            )
        try:
            return source.read().decode("utf-8").strip().encode()
        except UnicodeDecodeError:
            raise SigningError(
                f"the signing secret {path} is not text (UTF-8); delete it and a new one is made"
            ) from None


def sign(task: str, payload: str) -> str:
    """The first form of signature, kept for stored schedules: task name and stored payload text."""
    message = f"{task}\n{payload}".encode("utf-8", "surrogatepass")
    return hmac.new(secret(), message, hashlib.sha256).hexdigest()


def verify(task: str | None, payload: str, signature: str | None) -> bool:
    """True when `signature` was made by this user for exactly this task and payload (first form)."""
    if task is None or not signature:
        return False
    return hmac.compare_digest(sign(task, payload), signature)


class Covered(NamedTuple):
    """What a job's signature covers besides the database and the nonce: the stored text or
    value of each column that decides what runs and how."""

    task: str
    payload: str
    queue: str
    max_retries: int
    timeout: float | None
    backoff: str | None
    limits: str | None


def _mac(*parts: object) -> str:
    message = json.dumps([VERSION, *parts], ensure_ascii=False).encode("utf-8", "surrogatepass")
    return hmac.new(secret(), message, hashlib.sha256).hexdigest()


def _job_mac(database: str, nonce: str, job: Covered) -> str:
    timeout = None if job.timeout is None else float(job.timeout)  # 60 and 60.0 are one timeout
    return _mac("job", database, nonce, *job._replace(timeout=timeout))


def sign_job(database: str, job: Covered) -> str:
    """A new signature for `job` in the database of identity `database`, with a fresh nonce."""
    nonce = secrets.token_hex(NONCE_CHARS // 2)
    return f"{VERSION}.{nonce}.{_job_mac(database, nonce, job)}"


def nonce_of(signature: str | None) -> str | None:
    """The nonce of a signature of the current form (None: none, or of another form)."""
    prefix = f"{VERSION}."
    if not signature or not signature.startswith(prefix):
        return None
    nonce, dot, _ = signature[len(prefix) :].partition(".")
    return nonce if dot and len(nonce) == NONCE_CHARS else None


def verify_job(database: str, job: Covered, signature: str | None) -> bool:
    """True when `signature` was made by this user for exactly this job in this database."""
    nonce = nonce_of(signature)
    if nonce is None or signature is None:
        return False
    return hmac.compare_digest(signature, f"{VERSION}.{nonce}.{_job_mac(database, nonce, job)}")


def vouch(database: str, nonce: str, result: str) -> str:
    """The MAC of a signed job's result text, bound to that job's run (its nonce) and database."""
    return _mac("result", database, nonce, result)
