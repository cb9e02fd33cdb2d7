"""The SQL storage both backends share: every queue verb written once, over a few primitives.

A backend (`sqlite.SQLiteStorage`, `postgres.PostgresStorage`) gives its statements
(`storage.statements`, rendered in its dialect) and a few primitives: `_read` one
statement, `_change` one write statement, `_transaction` several in one, `_deleted`,
and `_filter` (binding lists and the wake-up channel is each backend's own). It keeps
for itself only what really differs: connections and transactions, a worker's batch
(complete and claim in one commit), enqueue, waiting for work, migrations; claims run
here over the dialect's own claim statements (BEGIN IMMEDIATE on SQLite, SKIP LOCKED on
PostgreSQL).

PostgreSQL can lose a reply after its write committed: a write passes `lost`, the
statement that reads back whether it did (its first value true); SQLite never needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from ..clock import Clock, system_clock, to_us
from ..errors import StorageError
from ..jobs import JobRow, State
from ..records import AttemptRow, LimitRow, Reached, RunRow, StepRow, Suspension, WaitRow, WaitSpec
from ..search import Search
from . import (
    ClaimRequest,
    Decide,
    Filter,
    NewJob,
    Row,
    StepRecord,
    StoredSchedule,
    cascade,
    limited,
    waits,
)
from .checkpoints import SqlCheckpoints
from .statements import Params, Statements, Tx

T = TypeVar("T")


class SqlStorage(SqlCheckpoints):
    """The queue verbs over SQL; a subclass supplies the statements and the primitives."""

    sql: Statements
    server_clock: bool
    #: What writes are stamped with: the Queue's clock (its manager sets it).
    clock: Clock = staticmethod(system_clock)
    batch_claims = 64  # (16 before: a batch's commit and statements are spent over 4x the jobs)
    _where: str  # the queue, as messages name it
    identity_suffix = ""  # PostgreSQL: the schema, so a row copied into another never verifies

    # -- what a backend supplies ------------------------------------------------

    def _read(self, statement: str, params: Params | None = None) -> list[Row]:
        raise NotImplementedError

    def _change(self, statement: str, params: Params, lost: str | None = None) -> list[Row]:
        """One write statement (atomic); its rows (RETURNING)."""
        raise NotImplementedError

    def _transaction(self, work: Callable[[Tx], T], committed: Callable[[], T | None] | None = None) -> T:
        """`work` in one write transaction; `committed` reads back its answer after a lost reply."""
        raise NotImplementedError

    def _filter(self, where: Filter) -> Params:
        """A claim filter as the statements' parameters."""
        raise NotImplementedError

    def _token(self) -> int | None:
        """A token a write leaves behind to be found after a lost reply (None: never lost)."""
        return None

    def _text(self, text: str | None) -> str | None:
        """Text as this database can store it."""
        return text

    def _deleted(self, statement: str, params: Params) -> int:
        """One DELETE (atomic); how many jobs it deleted."""
        raise NotImplementedError

    def _wake_here(self) -> None:
        """After a write that may make work due, when the database does not wake waiters itself."""

    def notify(self) -> None:
        raise NotImplementedError

    def now(self) -> int | None:
        raise NotImplementedError

    def stamp(self) -> int | None:
        """The time a write stamps, from this storage's clock: None where the server's own clock
        stamps it (a server backend on the system clock)."""
        if self.clock is system_clock and self.server_clock:
            return None
        return to_us(self.clock())

    def now_us(self) -> int:
        """The time by the clock writes are stamped with (the server's, where it stamps them)."""
        stamp = self.stamp()
        if stamp is None:
            stamp = self.now()
        return stamp if stamp is not None else to_us(self.clock())

    # -- claims -------------------------------------------------------------------

    def _claim_params(self, request: ClaimRequest) -> Params:
        where, worker_id, lease_us, host, pid = request
        params = {**self._filter(where), "worker": worker_id, "lease": lease_us, "host": host, "pid": pid}
        return {**params, "token": self._token()}

    def claim(self, request: ClaimRequest) -> JobRow | None:
        if request.where.matches_nothing:
            return None
        sql = self.sql
        statement = sql.CLAIM_FROM_ANY_QUEUE if request.where.queues is None else sql.CLAIM_FROM_QUEUES
        rows = self._change(statement, {**self._claim_params(request), "now": self.stamp()}, sql.CLAIMED)
        return JobRow._make(rows[0]) if rows else None

    def claim_limited(self, request: ClaimRequest, decide: Decide, most: int = 1) -> list[JobRow]:
        if request.where.matches_nothing:
            return []
        sql = self.sql
        params = {**self._claim_params(request), "now": self.stamp()}
        statement = sql.HEADS_IN_ANY_QUEUE if request.where.queues is None else sql.HEADS_IN_QUEUES

        def work(tx: Tx) -> list[JobRow]:
            return limited.take(tx, statement, params, decide, most)

        def committed() -> list[JobRow] | None:
            return [JobRow._make(row) for row in self._read(sql.CLAIMED, params)]

        return self._transaction(work, committed)

    # -- jobs that wait for others, workflows, steps and files ---------------------

    def insert_linked(
        self,
        count: int,
        make: Callable[[int, list[int], int | None], NewJob],
        workflow: str | None,
    ) -> list[tuple[int, bool]]:
        now, token, sql = self.stamp(), self._token(), self.sql

        def work(tx: Tx) -> list[tuple[int, bool]]:
            wf = None if workflow is None else int(tx(sql.NEW_WORKFLOW, {"name": workflow, "now": now})[0][0])
            made: list[tuple[int, bool]] = []
            ids: list[int] = []  # grows as jobs are written; `make` reads it, never keeps it
            for i in range(count):
                made.append(cascade.link(tx, make(i, ids, wf), now, token))
                ids.append(made[-1][0])
            tx(sql.WAKE, {})
            return made

        def committed() -> list[tuple[int, bool]] | None:
            return [(int(r[0]), True) for r in self._read(sql.INSERTED, {"token": token})] or None

        made = self._transaction(work, committed)
        self.notify()
        return made

    def edges(self, job_ids: Sequence[int]) -> list[Row]:
        return self._read(self.sql.EDGES_OF, {"ids": list(job_ids)})

    def workflow_jobs(self, workflow: int) -> list[int]:
        return [int(r[0]) for r in self._read(self.sql.IN_WORKFLOW, {"workflow": workflow})]

    def step_values(self, job_id: int) -> dict[str, str]:
        return {str(name): str(value) for name, value in self._read(self.sql.STEP_VALUES, {"id": job_id})}

    def record_step(self, step: StepRecord) -> str | None:
        params = {**step.params(), "now": self.stamp()}
        if self._change(self.sql.RECORD_STEP, params, lost=self.sql.STEP_OF):
            return step.value
        held = self._read(self.sql.STEP_OF, params)  # recorded before (a parallel twin), if the claim lives
        return str(held[0][0]) if held and self._read(self.sql.STILL_CLAIMED, params) else None

    # -- streams (nbqueue.emit) -------------------------------------------------------

    def emit(
        self, job_id: int, attempt: int, run: int, items: Sequence[tuple[int, str]], bound: int | None
    ) -> bool:
        sql = self.sql
        claim = {"id": job_id, "attempt": attempt, "now": self.stamp()}
        params = {"id": job_id, "run": run, "items": [list(i) for i in items], "bound": bound}
        params |= {"seqs": [seq for seq, _ in items], "texts": [text for _, text in items]}

        def work(tx: Tx) -> bool:
            if not tx(sql.LOCK_CLAIM, claim):  # only the claim's holder writes its stream
                return False
            tx(sql.EMIT, params)
            if bound is not None:
                tx(sql.TRIM_STREAM, params)
            return True

        return self._transaction(work)

    def stream_head(self, job_id: int, most: int) -> tuple[int, int] | None:
        rows = self._read(self.sql.STREAM_HEAD, {"id": job_id, "most": most})
        return (int(rows[0][0]), int(rows[0][1])) if rows else None

    def stream_items(self, job_id: int, run: int, after: int, limit: int) -> list[tuple[int, str]]:
        params = {"id": job_id, "run": run, "after": after, "limit": limit}
        return [(int(seq), str(value)) for seq, value in self._read(self.sql.STREAM_ITEMS, params)]

    def stream_last(self, job_ids: Sequence[int]) -> dict[int, str]:
        if not job_ids:
            return {}
        return {int(i): str(v) for i, v in self._read(self.sql.STREAM_LAST, {"ids": list(job_ids)})}

    # -- jobs that wait (storage/waits.py) ------------------------------------------

    def peek_waits(self, job_ids: Sequence[int]) -> list[Row]:
        if not job_ids:
            return []
        return self._read(self.sql.PEEK_WAITS, {"ids": list(job_ids)})

    def suspend(self, suspensions: Sequence[Suspension]) -> list[bool]:
        if not suspensions:
            return []
        stamp = self.stamp()
        written = self._transaction(lambda tx: waits.suspend_all(tx, suspensions, stamp))
        self._wake_here()  # (a value sent meanwhile made one pending again)
        return written

    def reach_wait(self, job_id: int, attempt: int, wait: WaitSpec) -> Reached:
        stamp = self.stamp()
        now_us = self.now_us() if stamp is None else stamp
        reached = self._transaction(lambda tx: waits.reach(tx, job_id, attempt, wait, now_us, stamp))
        if reached.outcome in ("suspended", "doomed"):
            self._wake_here()  # a value sent meanwhile, or a failed job's blocked children
        return reached

    def send(self, job_ids: Sequence[int], name: str, value: str, by: str) -> list[bool]:
        stamp, by = self.stamp(), self._text(by) or ""
        woken = self._transaction(lambda tx: waits.send(tx, job_ids, name, value, by, stamp))
        if any(woken):
            self._wake_here()
        return woken

    def wake_due(self, limit: int) -> list[int]:
        params = {"now": self.stamp(), "limit": limit, "wake": True}
        rows = self._change(self.sql.WAKE_DUE, params)
        if rows:
            self._wake_here()
        return [int(r[0]) for r in rows]

    def next_wake(self) -> int | None:
        rows = self._read(self.sql.NEXT_WAKE)
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    def waits(self, job_ids: Sequence[int]) -> list[WaitRow]:
        if not job_ids:
            return []
        return [WaitRow._make(r) for r in self._read(self.sql.WAITS, {"ids": list(job_ids)})]

    def steps(self, job_id: int) -> list[StepRow]:
        return [StepRow._make(r) for r in self._read(self.sql.STEPS, {"id": job_id})]

    def step_previews(self, job_id: int, chars: int) -> list[StepRow]:
        return [StepRow._make(r) for r in self._read(self.sql.STEP_PREVIEWS, {"id": job_id, "chars": chars})]

    def forget_steps(self, job_id: int, since: int) -> int:
        return len(self._change(self.sql.FORGET_STEPS, {"id": job_id, "since": since}))

    def save_file(self, job_id: int, attempt: int, name: str, content: str) -> bool:
        params = {"id": job_id, "attempt": attempt, "name": name, "content": content, "now": self.stamp()}
        return bool(self._change(self.sql.SAVE_FILE, params, lost=self.sql.FILE_SAVED))

    def load_file(self, job_id: int, name: str) -> str | None:
        rows = self._read(self.sql.LOAD_FILE, {"id": job_id, "name": name})
        return str(rows[0][0]) if rows else None

    def file_names(self, job_ids: Sequence[int]) -> dict[int, list[str]]:
        found: dict[int, list[str]] = {}
        for job_id, name in self._read(self.sql.FILE_NAMES, {"ids": list(job_ids)}):
            found.setdefault(int(job_id), []).append(str(name))
        return {job_id: sorted(names) for job_id, names in found.items()}

    def replay(self, job_id: int, since: int) -> bool:
        now, sql = self.stamp(), self.sql

        def work(tx: Tx) -> bool:
            if not tx(sql.REPLAY, {"ids": [job_id], "now": now}):
                return False  # (also when a lost reply's retry finds it moved already)
            tx(sql.FORGET_STEPS, {"id": job_id, "since": since})
            tx(sql.FORGET_WAITS, {"id": job_id, "since": since})  # and the waits and sleeps after it,
            tx(sql.FORGET_CHILDREN, {"id": job_id, "since": since})  # and the jobs it made after it
            tx(sql.FORGET_STREAM, {"ids": [job_id]})  # its run emits afresh
            cascade.rearm(tx, [job_id], now)
            return True

        moved = self._transaction(work)
        if moved:
            self.notify()
        return moved

    # -- stored schedules ---------------------------------------------------------

    def save_schedule(self, schedule: StoredSchedule) -> None:
        self._change(self.sql.SAVE_SCHEDULE, {**schedule._asdict(), "now": self.stamp()})  # safe to repeat

    def schedules(self) -> list[StoredSchedule]:
        return [StoredSchedule(*row) for row in self._read(self.sql.SCHEDULES)]

    def delete_schedule(self, name: str) -> bool:
        sql = self.sql

        def work(tx: Tx) -> bool:
            tx(sql.FORGET_SLOT, {"name": name})
            return bool(tx(sql.DELETE_SCHEDULE, {"name": name}))

        def committed() -> bool | None:
            return True if self._read(sql.SCHEDULE_GONE, {"name": name})[0][0] else None

        return self._transaction(work, committed)

    # -- limits -------------------------------------------------------------------

    def limited_waiting(self, where: Filter) -> bool:
        if where.matches_nothing:
            return False
        any_queue = where.queues is None
        statement = self.sql.LIMITED_WAITING_IN_ANY_QUEUE if any_queue else self.sql.LIMITED_WAITING_IN_QUEUES
        rows = self._read(statement, self._filter(where))
        return bool(rows and rows[0][0])

    def define_limit(self, key: str, concurrency: int | None, rate: float | None, burst: float) -> None:
        params = {
            "key": key,
            "concurrency": concurrency,
            "rate": rate,
            "burst": burst,
            "now": self.stamp(),
        }
        self._change(self.sql.DEFINE_LIMIT, params)
        self.notify()

    def pause(self, keys: Sequence[str], until_us: int, why: str) -> None:
        params = {"keys": list(keys), "until": until_us, "delay": None, "why": self._text(why)}
        self._change(self.sql.PAUSE, {**params, "now": self.stamp()})

    def resume(self, key: str) -> bool:
        resumed = bool(self._change(self.sql.RESUME, {"key": key, "now": self.stamp()}))
        self.notify()
        return resumed

    def limits(self) -> tuple[list[LimitRow], list[Row], int]:
        stored = [LimitRow._make(r) for r in self._read(self.sql.LIMITS)]
        return stored, self._read(self.sql.WAITING_PER_KEY), self.now_us()

    # -- a claim's outcome --------------------------------------------------------

    def snooze(
        self,
        job_id: int,
        attempt: int,
        delay_us: int,
        note: str,
        output: str | None,
        pause: Sequence[str],
    ) -> bool:
        sql = self.sql
        params: Params = {"id": job_id, "attempt": attempt, "delay": delay_us, "now": self.stamp()}
        params |= {"error": self._text(note), "output": self._text(output), "why": self._text(note)}
        params |= {"keys": list(pause), "until": None}

        def work(tx: Tx) -> bool:
            if not tx(sql.SNOOZE, params):
                return False
            if pause:  # paused for as long, in the same transaction
                tx(sql.PAUSE, params)
            return True

        def committed() -> bool | None:
            return True if self._read(sql.SNOOZED, params) else None

        return self._transaction(work, committed)

    def heartbeat(self, job_id: int, attempt: int, lease_us: int | None) -> int | None:
        params = {"id": job_id, "attempt": attempt, "lease": lease_us, "now": self.stamp()}
        rows = self._change(self.sql.HEARTBEAT, params)
        return int(rows[0][0]) if rows else None

    def fail(
        self,
        job_id: int,
        attempt: int,
        error: str,
        output: str | None,
        status: State,
        delay_us: int,
        expired: bool = False,
        failed_as: str | None = None,
    ) -> bool:
        sql = self.sql
        params: Params = {"id": job_id, "attempt": attempt, "status": status.value, "delay": delay_us}
        params["failed_as"] = "lost" if expired else failed_as
        params |= {"error": self._text(error), "output": self._text(output), "now": self.stamp()}
        params["wake"] = status is State.FAILED
        # One statement, unless the job is dead and has children: they are resolved in its transaction.
        if not expired and self._change(sql.FAIL, params, lost=sql.FAILED):
            changed, linked = True, False
        else:
            statement = sql.FAIL_EXPIRED if expired else sql.FAIL_LINKED

            def work(tx: Tx) -> tuple[bool, bool]:
                rows = tx(statement, params)
                if not rows:
                    return False, False
                if rows[0][0] and status is not State.FAILED:
                    cascade.resolve(tx, [(job_id, status, None)], params["now"])
                    return True, True
                return True, False

            def committed() -> tuple[bool, bool] | None:
                return (True, True) if self._read(sql.FAILED, params) else None

            changed, linked = self._transaction(work, committed)
        if changed and (status is State.FAILED or linked):
            self._wake_here()
        return changed

    def release(self, job_id: int, attempt: int) -> bool:
        params = {"id": job_id, "attempt": attempt, "now": self.stamp()}
        released = bool(self._change(self.sql.RELEASE, params, lost=self.sql.RELEASED))
        if released:
            self.notify()
        return released

    def unclaim(self, job_id: int, attempt: int, started_at: int) -> bool:
        sql = self.sql
        params = {"id": job_id, "attempt": attempt, "started": started_at, "now": self.stamp()}

        def work(tx: Tx) -> bool:  # safe to repeat: it undoes only this claim
            if not tx(sql.UNCLAIM, params):
                return False
            tx(sql.FORGET_ATTEMPT, params)
            return True

        undone = self._transaction(work)
        if undone:
            self.notify()
        return undone

    def refuse(self, job_id: int, attempt: int, error: str) -> bool:
        params = {"id": job_id, "attempt": attempt, "error": self._text(error), "now": self.stamp()}
        return bool(self._change(self.sql.REFUSE, params))

    def progress(self, job_id: int, attempt: int, done: float, total: float | None, message: str) -> bool:
        params = {"id": job_id, "attempt": attempt, "done": done, "total": total, "now": self.stamp()}
        return bool(self._change(self.sql.PROGRESS, {**params, "message": self._text(message)}))

    def bury(self, job_id: int, error: str) -> bool:
        now, sql = self.stamp(), self.sql

        def work(tx: Tx) -> bool:
            rows = tx(sql.BURY, {"id": job_id, "error": self._text(error), "now": now})
            if rows and rows[0][0]:
                cascade.resolve(tx, [(job_id, State.DEAD, None)], now)
            return bool(rows)

        buried = self._transaction(work)
        self._wake_here()  # (an all_done child may be due now)
        return buried

    # -- signatures and runs ------------------------------------------------------

    def repin(self, job_id: int, old: str, payload: str, signature: str | None) -> bool:
        params = {"id": job_id, "old": old, "payload": payload, "signature": signature}
        return bool(self._change(self.sql.REPIN, params, lost=self.sql.REPINNED))

    def sign(self, job_id: int, payload: str, signature: str, old: str | None) -> bool:
        params = {"id": job_id, "payload": payload, "signature": signature, "old": old}
        return bool(self._change(self.sql.SIGN, params, lost=self.sql.SIGNED_AS))

    def identity(self) -> str:
        rows = self._read(self.sql.IDENTITY_VALUE)
        if not rows:
            raise StorageError(f"{self._where}: the queue's identity row (nbqueue_info) is missing")
        return f"{rows[0][0]}{self.identity_suffix}"

    def runs(self, nonces: Sequence[str]) -> dict[str, RunRow]:
        return {str(r[0]): RunRow._make(r) for r in self._read(self.sql.RUNS, {"nonces": list(nonces)})}

    def vouch(self, nonce: str, job_id: int, mac: str) -> bool:
        return bool(self._change(self.sql.VOUCH, {"nonce": nonce, "id": job_id, "mac": mac}))

    # -- operator verbs -----------------------------------------------------------

    def cancel(self, job_ids: Sequence[int]) -> list[int]:
        now, sql = self.stamp(), self.sql

        def committed() -> list[int] | None:
            return [int(r[0]) for r in self._read(sql.CANCELLED, {"ids": list(job_ids)})] or None

        cancelled = self._transaction(lambda tx: cascade.cancel(tx, job_ids, now), committed)
        self._wake_here()  # (an all_done child may be due now)
        return cancelled

    def requeue(self, job_ids: Sequence[int] | None) -> list[int]:
        now, sql = self.stamp(), self.sql
        statement = sql.REQUEUE_DEAD if job_ids is None else sql.REQUEUE_IDS
        params: Params = {"now": now} if job_ids is None else {"ids": list(job_ids), "now": now}

        def work(tx: Tx) -> list[int]:
            moved = sorted(int(r[0]) for r in tx(statement, params))
            if moved:  # the graph comes back with them, in the same transaction
                tx(sql.FORGET_EXPIRIES, {"ids": moved})  # a fresh start: its waits reached anew,
                tx(sql.FORGET_STREAM, {"ids": moved})  # and its streams begun anew
                cascade.rearm(tx, moved, now)
            return moved

        def committed() -> list[int] | None:
            return (
                None if job_ids is None else ([int(r[0]) for r in self._read(sql.REQUEUED, params)] or None)
            )

        moved = self._transaction(work, committed)
        if moved:
            self.notify()
        return moved

    def periodic_slot(self, name: str) -> int | None:
        rows = self._read(self.sql.PERIODIC_SLOT, {"name": name})
        return int(rows[0][0]) if rows else None

    def periodic_advance(self, name: str, last: int | None, slot: int, job: NewJob | None) -> bool:
        now, sql = self.stamp(), self.sql

        def work(tx: Tx) -> bool:
            if last is None:
                moved = tx(sql.PERIODIC_START, {"name": name, "slot": slot})
            else:
                moved = tx(sql.PERIODIC_MOVE, {"name": name, "slot": slot, "last": last})
            if not moved:  # another worker moved it first
                return False
            if job is not None:
                self._insert_in(tx, job, now)
            return True

        def committed() -> bool | None:
            return True if self._read(sql.PERIODIC_MOVED, {"name": name, "slot": slot}) else None

        taken = self._transaction(work, committed)
        if taken and job is not None:
            self.notify()
        return taken

    def _insert_in(self, tx: Tx, job: NewJob, now: int | None) -> None:
        """Enqueue one job inside an open transaction."""
        raise NotImplementedError

    def delete(self, job_ids: Sequence[int]) -> int:
        return self._deleted(self.sql.DELETE, {"ids": list(job_ids)})

    def purge(self, statuses: Sequence[State], older_than_us: int, limit: int | None = None) -> int:
        age = older_than_us - (0 if older_than_us else 1)  # age 0: everything so far
        params = {"now": self.stamp(), "age": age, "statuses": [s.value for s in statuses]}
        return self._deleted(self.sql.PURGE, {**params, "limit": limit})

    # -- reading ------------------------------------------------------------------

    def get(self, job_id: int) -> JobRow | None:
        rows = self._read(self.sql.GET, {"id": job_id})
        return JobRow._make(rows[0]) if rows else None

    def get_many(self, job_ids: Sequence[int]) -> list[JobRow]:
        return (
            [JobRow._make(r) for r in self._read(self.sql.GET_MANY, {"ids": list(job_ids)})]
            if job_ids
            else []
        )

    def expired(self, limit: int) -> list[JobRow]:
        return [JobRow._make(r) for r in self._read(self.sql.EXPIRED, {"now": self.stamp(), "limit": limit})]

    def running_on(self, host: str) -> list[tuple[JobRow, int | None]]:
        return [(JobRow._make(r[:-1]), r[-1]) for r in self._read(self.sql.RUNNING_ON, {"host": host})]

    def claims(self, job_ids: Sequence[int]) -> list[Row]:
        return self._read(self.sql.CLAIMS, {"ids": list(job_ids)}) if job_ids else []

    def attempts(self, job_id: int) -> list[AttemptRow]:
        return [AttemptRow._make(r) for r in self._read(self.sql.ATTEMPTS, {"id": job_id})]

    def activity(self, since: int) -> list[Row]:
        return self._read(self.sql.ACTIVITY, {"since": since})

    def failures(self, job_ids: Sequence[int]) -> dict[int, int]:
        rows = self._read(self.sql.FAILURES, {"ids": list(job_ids)}) if job_ids else []
        return {int(job_id): int(n) for job_id, n in rows}

    def counts(self, queue: str | None = None) -> dict[str, int]:
        found = {str(s): int(n) for s, n in self._read(self.sql.COUNTS, {"queue": queue})}
        return {s.value: found.get(s.value, 0) for s in State}

    def rows(
        self,
        statuses: Sequence[State] | None,
        queue: str | None,
        limit: int,
        offset: int = 0,
        brief: bool = False,
    ) -> list[JobRow]:
        params = {**self._listing(statuses, queue), "limit": limit, "offset": offset}
        return [
            JobRow._make(r)
            for r in self._read(self.sql.ROWS[statuses is not None, queue is not None, brief], params)
        ]

    def search(
        self,
        found: Search,
        statuses: Sequence[State] | None,
        queue: str | None,
        limit: int,
        offset: int = 0,
        brief: bool = False,
    ) -> list[JobRow]:
        params = {**self._listing(statuses, queue), **found.params(), "limit": limit, "offset": offset}
        statement = self.sql.SEARCH[statuses is not None, queue is not None, brief]
        return [JobRow._make(r) for r in self._read(statement, params)]

    def count_found(self, found: Search, statuses: Sequence[State] | None, queue: str | None) -> int:
        params = {**self._listing(statuses, queue), **found.params()}
        return int(self._read(self.sql.SEARCH_COUNT[statuses is not None, queue is not None], params)[0][0])

    def dead_since(self, since: int) -> int:
        return int(self._read(self.sql.DEAD_SINCE, {"since": since})[0][0])

    @staticmethod
    def _listing(statuses: Sequence[State] | None, queue: str | None) -> Params:
        return {"statuses": None if statuses is None else [s.value for s in statuses], "queue": queue}

    def queues(self) -> list[str]:
        return [str(r[0]) for r in self._read(self.sql.QUEUES)]

    def next_due(self, where: Filter) -> int | None:
        if where.matches_nothing:
            return None
        statement = self.sql.NEXT_DUE_IN_ANY_QUEUE if where.queues is None else self.sql.NEXT_DUE_IN_QUEUES
        rows = self._read(statement, self._filter(where))
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    def task_names(self, statuses: Sequence[State], signed: bool = False) -> list[str]:
        params = {"statuses": [s.value for s in statuses], "signed": signed}
        return [str(r[0]) for r in self._read(self.sql.TASK_NAMES, params)]

    def pending_per_task(self) -> list[Row]:
        return list(self._read(self.sql.PENDING_PER_TASK))
