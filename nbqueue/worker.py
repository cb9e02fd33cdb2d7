"""The worker: background threads that claim, run and report jobs.

With `nbqueue.aio` (its event loop), the only module with threads. It never writes to stdout
or stderr (in a notebook that output would land in whatever cell is running): it logs through
`logging`, and what a job prints is captured into the job's record. A keeper thread
(nbqueue.keeper) heartbeats running jobs, enforces timeouts, notices cancellations and runs the
queue's housekeeping; one object keeps what is in flight (nbqueue.flights); coroutine jobs go to
the worker's event loop (nbqueue.coroutines) and their runner goes back to claiming.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import io
import logging
import os
import threading
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from . import cells, notebooks, policy
from . import tasks as registry
from .aio import close_ended_runners
from .batches import Batch
from .capture import captured, tail
from .clock import Duration, seconds, to_us
from .context import TimedOut, running
from .coroutines import Coroutines
from .errors import (
    InvalidArgument,
    InvalidTransition,
    LeaseLost,
    NbqueueError,
    PayloadError,
    Unretryable,
    WaitTimeout,
)
from .flights import Flight, Flights
from .isolation import Ending, Outcome, run_in_child
from .jobs import Job, State, Verdict
from .keeper import PERIODIC_EVERY, TIDY_EVERY, Chore, Housekeeping, Keeper, housekeeping, interval
from .options import queue_names
from .records import Suspension
from .storage import ClaimRequest, Filter

if TYPE_CHECKING:
    from .manager import JobManager


class _QueueLike(Protocol):
    """A Queue, as far as the worker is concerned: it holds the manager."""

    manager: JobManager


log = logging.getLogger("nbqueue.worker")

IDLE_RECHECK = 0.5  # seconds an idle thread sleeps before re-reading the due time
# A claim that took nothing although jobs are due (limits hold them back, or other workers took
# them first) waits this long for a change before it claims again, instead of spinning on the
# database (twelve spinning threads made three PostgreSQL workers 30 times slower).
HELD_BACK_RECHECK = 0.005
STOP_REWAKE = 0.02  # seconds between the wake-ups stop() sends runners still waiting
CANCEL_EVERY = 0.5  # seconds between checks for running jobs cancelled with q.cancel()
KILL_GRACE = 5.0  # seconds stop() gives a process-mode runner to kill its child


def default_worker_id() -> str:
    """host:pid:thread:tag, so a lease names who holds it."""
    return f"{os.uname().nodename}:{os.getpid()}:{threading.get_ident() % 100000}:{uuid.uuid4().hex[:6]}"


class Worker:
    """Runs a queue's jobs in background threads of this process (make one with `Queue.worker`).

    Args:
        queue: the Queue to work (the worker talks only to its JobManager, the one door).
        queues: queue names to take jobs from (None = every queue).
        concurrency: how many jobs run at once (one thread each).
        lease: seconds a claim lasts; heartbeats renew it while a job runs.
        mode: "thread" runs handlers in the worker's threads; "process" runs each
            job in a child process that is killed at its timeout or on cancel.
        retention: prune completed jobs older than this, in small batches (None: keep).
        tasks: task names this worker may run (None = every registered task
            that does not need an opt-in, plus those in `allow`).
        allow_code: also run queued code: ``%%enqueue`` cells and notebook jobs
            (only those this user's processes queued: they are signed).
        notebook_dir: where notebook jobs' executed notebooks are written (default:
            ``nbqueue-notebooks`` beside a SQLite queue file, else in the working folder).
        async_concurrency: how many coroutine jobs may be in flight at once, on the
            worker's own event loop (they hold no thread while they await).
        recover_interval: seconds between recoveries of expired leases and of jobs whose worker
            process on this host is gone (default: a quarter of the lease, at most 2 s).
        cancel_interval: seconds between looks for running jobs cancelled with q.cancel() (0.5).
        periodic_interval: seconds between looks for due periodic slots (1.0).
        tidy_interval: seconds between storage housekeeping (10.0).
        idle_interval: seconds an idle runner waits at most before it looks for due jobs again,
            when nothing in this process told it of a new one (0.5).
        prune_interval: seconds between retention's prunes (default: a tenth of the retention,
            from 1 s to 60 s).
    """

    def __init__(
        self,
        queue: _QueueLike | JobManager,
        queues: str | Sequence[str] | None = None,
        concurrency: int = 1,
        lease: Duration = 60,
        *,
        mode: str = "thread",
        retention: Duration | None = None,
        tasks: Sequence[str] | None = None,
        allow: Sequence[str] = (),
        allow_code: bool = False,
        notebook_dir: str | os.PathLike[str] | None = None,
        worker_id: str | None = None,
        recover_interval: Duration | None = None,
        async_concurrency: int = 64,
        cancel_interval: Duration = CANCEL_EVERY,
        periodic_interval: Duration = PERIODIC_EVERY,
        tidy_interval: Duration = TIDY_EVERY,
        idle_interval: Duration = IDLE_RECHECK,
        prune_interval: Duration | None = None,
    ) -> None:
        if mode not in ("thread", "process"):
            raise InvalidArgument(f"mode must be 'thread' or 'process', not {mode!r}")
        for value, what in ((concurrency, "concurrency"), (async_concurrency, "async_concurrency")):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
                raise InvalidArgument(f"{what} must be a whole number >= 1, not {value!r}")
        lease_s = seconds(lease, "lease", allow_none=False) or 0.0
        if lease_s < 0.05:
            raise InvalidArgument(f"lease must be at least 0.05 seconds, not {lease_s}")
        self.manager: JobManager = getattr(queue, "manager", queue)  # type: ignore[arg-type]
        self.label = str(queue) if hasattr(queue, "manager") else ""  # names the queue in messages
        self.mode = mode
        self.retention = seconds(retention, "retention")
        self.queues = queue_names(queues)
        self.concurrency = concurrency
        self.async_concurrency = async_concurrency
        self.lease = lease_s
        self.tasks = None if tasks is None else tuple(tasks)
        self.allow = tuple(allow)
        if allow_code:  # queued code: %%enqueue cells and notebook jobs (signed, so only this user's)
            if registry.find(cells.CELL_TASK) is None:
                cells.register_cell_task(self.manager.intake)
            notebooks.notebook_task(self.manager.intake, notebook_dir)
            self.allow += (cells.CELL_TASK, notebooks.NOTEBOOK_TASK)
        self.worker_id = worker_id or default_worker_id()
        self.housekeeping = Housekeeping.of(
            self.lease, self.retention, recover_interval, periodic_interval, tidy_interval, prune_interval
        )
        self.cancel_interval = interval(cancel_interval, "cancel_interval")
        self.idle_interval = interval(idle_interval, "idle_interval")
        #: What is in flight, and the one lock it (and this worker's list of threads) is kept under.
        self.flights = Flights()
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        # Quick jobs are claimed several at a time (nbqueue.batches) where the storage can, in
        # thread mode, and with a lease long enough that waiting a moment never risks it.
        quick = mode == "thread" and lease_s >= 1.0
        self._batch_most = self.manager.batch_claims if quick else 1
        self._crashes = 0  # runners crashed since a claim last worked (counted under the lock)
        self._keeper_wake = threading.Event()  # a new deadline to watch, or stop
        self._coroutines = Coroutines(
            self.flights, async_concurrency, self.worker_id, self._stopping,
            self._report, self._say_stopped, self._give_back,
        )  # fmt: skip
        self._filter_made: tuple[int, Filter] = (-1, Filter())

    # -- lifecycle -------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True while the worker's keeper and every one of its runners are alive (a runner that
        died of an unexpected error is replaced at once; False after stop())."""
        with self.flights.lock:
            threads = self.flights.serving(self._threads)
        keeper = [t for t in threads if t.name == "nbqueue-keeper"]
        return bool(keeper) and all(t.is_alive() for t in threads)

    def start(self) -> Worker:
        """Start the threads (no-op if already running)."""
        if any(t.is_alive() for t in self._threads):  # (a thread left from before: never two sets)
            return self
        with self.flights.lock:
            self._stopping.clear()
            self._keeper_wake.clear()
            self.flights.forget_ended()
            self._threads = []
            for _ in range(self.concurrency):
                self._spawn_runner()
            keeper = threading.Thread(target=self._keeper().run, name="nbqueue-keeper", daemon=True)
            keeper.start()
            self._threads.append(keeper)
        log.info(
            "worker %s started: concurrency %d, queues %s",
            self.worker_id,
            self.concurrency,
            self.queues or "all",
        )
        return self

    def stop(self, timeout: float = 10) -> bool:
        """Stop taking jobs; wait up to `timeout` s for running ones, then release them.

        A job still running then goes back to pending, no retry counted: in process
        mode its child (and the child's own subprocesses) is killed first; in thread
        mode its handler is left to finish and whatever it returns is refused.
        Returns True when every thread has ended, or has been retired with its job
        released (False: a job could not be released, or the keeper did not end).
        """
        with self.flights.lock:  # no runner is started after this: the keeper checks _stopping under it
            self._stopping.set()
            threads = list(self._threads)
        self._keeper_wake.set()
        self.manager.wake()
        deadline = time.monotonic() + timeout
        for thread in threads:  # a runner already retired (its job timed out or cancelled) is not waited for
            while (
                thread.name != "nbqueue-keeper" and not self.flights.is_retired(thread) and thread.is_alive()
            ):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                # Woken again and again: a runner that checked _stopping just before it was set
                # and only then began to wait would otherwise sleep its whole idle_interval.
                thread.join(min(remaining, STOP_REWAKE))
                self.manager.wake()
        stuck = self.flights.retire_all()
        threaded = [flight for flight in stuck if flight.task is None]
        for flight in stuck:  # a coroutine is cancelled at its next await: let it unwind
            if flight.task is not None:
                concurrent.futures.wait([flight.task], timeout=max(0.0, deadline - time.monotonic()))
        if self.mode == "process":  # each runner kills its child's process group once it sees the cancel
            for flight in threaded:
                flight.runner.join(KILL_GRACE)
        released = True
        for flight in stuck:
            try:
                if self.manager.release(flight.job):
                    log.warning("job %d still running at stop: released back to pending", flight.job.id)
                else:  # cancelled (or taken over) just before the stop
                    self._say_stopped(flight.job)
            except LeaseLost as exc:  # cancelled or taken over meanwhile: it is not this worker's any more
                log.warning("%s", exc)
            except NbqueueError as exc:
                released = False
                log.warning("job %d could not be released: %s", flight.job.id, exc)
        for batch in self.flights.batches():  # runners retired to a handler still hold theirs
            self._settle(batch)
        self.flights.count(busy=-len(threaded))  # retired runners never count themselves out
        for thread in threads:
            if thread.name == "nbqueue-keeper":
                thread.join(max(0.1, deadline - time.monotonic()))
        self._coroutines.stop(deadline - time.monotonic())
        close_ended_runners(max(0.1, deadline - time.monotonic()))  # run_sync loops of ended runners
        with self.flights.lock:
            alive = [t for t in self.flights.serving(self._threads) if t.is_alive()]
            self._threads = alive
        return released and not alive

    def held_in_batches(self) -> list[int]:
        """The jobs this worker's batches hold, not running: claimed ahead, or finished and not
        yet written (see Queue.held_in_batches)."""
        held: list[int] = []
        for batch in self.flights.batches():
            with batch.lock:
                held.extend(job.id for job in batch.waiting)
                held.extend(job.id for job, _ in batch.done)
        return held

    def run_until_idle(self, timeout: float | None = None) -> None:
        """Work until nothing this worker can run is due now and nothing runs in it.

        Retries scheduled for later are not waited for. Starts the worker for the
        duration if it is not running.
        """
        started_here = not self.running
        if started_here:
            self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                # Under the lock: a runner counts itself busy before it claims, so a job is
                # either seen due here or claimed by a runner seen busy, never neither.
                if self.flights.idle():
                    self.manager.inbox.wake_due()  # a waiting job whose time has come is due
                with self.flights.lock:
                    if self.flights.idle() and not self.manager.due_now(self._filter()):
                        return
                    self.flights.wait(0.02)
                self.manager.notify()  # wake an idle thread for the due job
                if deadline is not None and time.monotonic() > deadline:
                    raise WaitTimeout(f"the worker was still busy after {timeout} s")
                if not self.running:
                    raise NbqueueError("the worker stopped before the queue was idle")
        finally:
            if started_here:
                self.stop()

    def status(self) -> dict[str, Any]:
        """What the worker is doing: running, in-flight job ids and tallies, and the pending jobs
        of its queues that it has no task for (`missing_tasks`: task -> jobs)."""
        try:
            pending = self.manager.pending_per_task(self.queues)
            missing = registry.missing(pending, self._filter().tasks)
        except NbqueueError:  # the storage is away: what the worker itself knows still shows
            missing = {}
        return {
            "worker_id": self.worker_id,
            "running": self.running,
            "concurrency": self.concurrency,
            "queues": list(self.queues) if self.queues else None,
            "mode": self.mode,
            "in_flight": self.flights.ids(),
            "async_in_flight": self.flights.async_busy,
            "completed": self.completed,
            "failed": self.failed,
            "missing_tasks": missing,
        }

    @property
    def completed(self) -> int:
        """Jobs this worker completed."""
        return self.flights.completed

    @property
    def failed(self) -> int:
        """Attempts of this worker that failed (retried or dead)."""
        return self.flights.failed

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<nbqueue.Worker {state} concurrency={self.concurrency} queue={self.label!r}>"

    # -- the loop --------------------------------------------------------------

    def _filter(self) -> Filter:
        version = registry.version()
        if self._filter_made[0] != version:  # the registry changed: which tasks this worker takes
            tasks = self.tasks if self.tasks is not None else registry.runnable(self.allow)
            self._filter_made = (version, Filter(self.queues, tasks, registry.signed_names()))
        return self._filter_made[1]

    def _request(self) -> ClaimRequest:
        return ClaimRequest(self._filter(), self.worker_id, to_us(self.lease))

    def _spawn_runner(self, pause: float = 0.0) -> None:
        """Start a runner thread; the caller holds the lock (so stop() never sees one unstarted).
        It waits `pause` seconds before its first claim (a runner restarted after a crash)."""
        runner = threading.Thread(
            target=self._run_loop, args=(pause,), name=f"nbqueue-worker-{len(self._threads)}", daemon=True
        )
        runner.start()
        self._threads.append(runner)

    def _run_loop(self, pause: float = 0.0) -> None:
        batch = Batch(self._batch_most)
        self.flights.add_batch(batch)
        holding = False  # counted in `_busy`: from its claim until it holds no job and no success
        failing = 0  # claims failed in a row (database read-only, full, gone): back off
        job: Job | None = None  # the job this runner runs, if any
        crash: Exception | None = None
        try:
            self._stopping.wait(pause)
            while True:
                if self.flights.is_retired(threading.current_thread()):  # whoever retired us counts us out
                    holding = False
                    return
                if self._stopping.is_set():  # what the batch still holds is settled on the way out
                    return
                job = batch.next_job()
                if job is not None:
                    self._execute(job, batch)
                    job = None
                    continue
                if not holding:
                    self.flights.count(busy=1)
                    holding = True
                try:  # the successes so far and the next claim, in one commit
                    self._flush(batch, self._request())
                    if failing:
                        log.warning("claims work again after %d failure(s)", failing)
                    failing = 0
                    self._crashes = 0
                except NbqueueError as exc:
                    failing += 1
                    if failing == 1:
                        log.exception("claim failed; retrying with backoff")
                    else:
                        log.debug("claim failed again (%d): %s", failing, exc)
                if batch.waiting:
                    continue
                if not batch.done:  # (unwritten successes keep it busy while writes fail)
                    self.flights.count(busy=-1)
                    holding = False
                if failing:
                    self._stopping.wait(min(30.0, 0.25 * 2 ** min(failing, 7)))
                else:
                    self._idle_wait()
        except Exception as exc:  # a fault nbqueue did not foresee: logged, and the runner replaced
            crash = exc
            log.exception(
                "worker runner %s crashed; a new runner takes its place", threading.current_thread().name
            )
            if job is not None:
                self._fail_crashed(job, exc)
        finally:
            self._settle(batch)
            with self.flights.lock:
                self.flights.drop_batch(batch)
                if holding:
                    self.flights.count(busy=-1)
                if crash is not None:
                    self._restart(threading.current_thread())

    def _restart(self, crashed: threading.Thread) -> None:
        """A new runner in place of one that crashed (the caller holds the lock), after a pause
        that grows while runners keep crashing without a claim working in between."""
        if self._stopping.is_set() or self.flights.is_retired(crashed):
            return
        self._crashes += 1
        self._threads.remove(crashed)
        self._spawn_runner(pause=min(30.0, 0.25 * 2 ** min(self._crashes - 1, 7)))

    def _fail_crashed(self, job: Job, exc: Exception) -> None:
        """The job a runner crashed on fails with that error (retried or dead by its rules), rather
        than staying running until its lease ends."""
        if job.id in self.flights.ids():  # still watched: its claim is settled by whoever took it
            return
        try:
            self.manager.fail(job, exc)
        except LeaseLost as lost:
            log.warning("%s", lost)
        except Exception:
            log.exception("job %d: the error its runner crashed on could not be recorded", job.id)

    def _flush(self, batch: Batch, then_claim: ClaimRequest | None) -> None:
        """Write the batch's successes and, with `then_claim`, claim its next jobs: one commit."""
        done, flags, queued = batch.flush(self.manager, then_claim)
        if queued:  # some wait their turn: the keeper watches how long
            self._keeper_wake.set()
        self._written(done, flags)

    def _settle(self, batch: Batch, overdue_at: float | None = None) -> None:
        """Write a batch's successes and give back its waiting jobs (Batch.settle)."""
        self._written(*batch.settle(self.manager, overdue_at), quiet=True)

    def _written(self, done: list[tuple[Job, Any]], flags: list[bool], quiet: bool = False) -> None:
        for (job, written), ok in zip(done, flags, strict=True):
            waited = isinstance(written, Suspension)  # a run that ended in a wait: no success
            if ok and not waited:
                self.flights.count(completed=1)
                self._hook(job, "on_complete")
            elif not ok and (waited or not quiet):
                lost = "its wait is not recorded" if waited else "result discarded"
                log.warning("job %d: its claim was lost (cancelled, or its lease ran out); %s", job.id, lost)

    def _settle_overdue(self) -> list[float]:
        """Settle the batches that held a success or a waiting job too long (a slow job runs);
        when the others will be due."""
        now = time.monotonic()
        batches_now = self.flights.batches()
        due = []
        for batch in batches_now:
            if batch.overdue(now):
                self._settle(batch, overdue_at=now)
            elif (deadline := batch.deadline()) is not None:
                due.append(deadline)
        return due

    def _idle_wait(self) -> None:
        wait = self.idle_interval
        try:
            if (wakes := self.manager.inbox.until_next_wake()) is not None:  # a wait's deadline
                if wakes == 0:  # due now: pending already, so claim it
                    return
                wait = min(wait, wakes)
            due = self.manager.next_due(self._filter())
            if due is not None:
                now = self.manager.now_us()
                opens = self.manager.limits_open_at
                if due > now:  # a job due later: until then
                    wait = min(wait, (due - now) / 1e6)
                elif opens is not None:  # held back by a rate (or a pause): until its next slot
                    wait = min(wait, max(0.0, (opens - now) / 1e6))
                else:  # held back until a running job ends, or taken by others: a moment
                    wait = min(wait, HELD_BACK_RECHECK)
        except NbqueueError:
            pass
        if wait > 0 and not self._stopping.is_set():
            try:
                self.manager.wait_for_change(wait)
            except NbqueueError:  # the storage is away; the next claim meets it and backs off
                self._stopping.wait(wait)

    def _execute(self, job: Job, batch: Batch) -> None:
        """Run one job and record its outcome (a success goes into the batch, to be written with
        the next claim)."""
        context = self.manager.context_for(job, batch.peek)
        flight = Flight(job, time.monotonic(), context)
        self.flights.add(flight)
        if job.timeout is not None and self.mode == "thread":
            self._keeper_wake.set()  # the keeper watches this deadline from now on
        buffer = io.StringIO()
        launched = False
        handler = None
        try:
            handler = registry.lookup(job.task or "")
            if self.mode == "process" and not handler.own_process:
                registry.check_arguments(handler.fn, job)
                outcome = run_in_child(
                    job, handler.fn, context, job.timeout, handler.retry_on, handler.give_up_on
                )
                buffer.write(outcome.output or "")
            else:
                with captured(buffer), running(context):
                    value = handler.fn(*job.args, **job.kwargs)
                if inspect.iscoroutine(value):  # an async handler: on to the worker's loop
                    launched = True
                    self._coroutines.launch(flight, value, buffer)
                    return
                outcome = Outcome(Ending.RETURNED, value)
        except TypeError as exc:  # the call itself may not fit the function: then no retry can help
            outcome = Outcome(Ending.RAISED, (handler and registry.unfit(handler.fn, job)) or exc)
        except TimedOut as exc:  # a job that keeps its own deadline (a notebook's) met it
            outcome = Outcome(Ending.TIMED_OUT, exc)
        except BaseException as exc:  # a handler's failure is the job's, never the worker's
            outcome = Outcome(Ending.RAISED, exc)
        finally:
            if not launched:  # ours only if no timeout or stop took it (and no newer claim)
                owned = self.flights.land(flight)
                context.close_stream()
        output = tail(buffer.getvalue())
        if context.suspended:  # it waits: written with the batch's next commit, if not already
            del outcome  # (its Suspended's traceback holds this frame: a cycle left to the collector)
            if context.suspension is not None:
                batch.add_done(job, context.suspension)
            return
        if context.cancel.is_set() or outcome.ending is Ending.CANCELLED:
            log.info("job %d stopped: cancelled, timed out or released", job.id)
            return
        if not owned:  # timed out or released meanwhile: the lease is gone
            log.warning("job %d finished after its claim was given up; result discarded", job.id)
            return
        self._report(job, outcome, output, batch)

    def _give_back(self, job: Job) -> None:
        """A claimed coroutine job that never started goes back to pending, no attempt counted."""
        try:
            if self.manager.unclaim(job):
                log.info("job %d not started before the worker stopped: back to pending", job.id)
            else:
                self._say_stopped(job)
        except NbqueueError as exc:  # its lease brings it back
            log.warning("job %d could not be given back: %s", job.id, exc)

    def _say_stopped(self, job: Job) -> None:
        """Log why a job this worker held stopped before it finished (cancelled, most often)."""
        try:
            status = self.manager.get(job.id).status
        except NbqueueError:
            status = None
        if status is State.CANCELLED:
            log.info("job %d cancelled: its handler was stopped", job.id)
        else:
            log.info("job %d stopped: its claim ended (now %s)", job.id, status.value if status else "gone")

    def _report(self, job: Job, outcome: Outcome, output: str | None, batch: Batch | None = None) -> None:
        """Record the outcome: a success into `batch` (written with its next claim), or at once."""
        value = outcome.value
        if outcome.ending is Ending.SUSPENDED:  # a coroutine's run that waits: written now
            if value is not None:
                self._written([(job, value)], self.manager.inbox.suspend([value]))
            return
        try:
            if outcome.ending is Ending.RETURNED:
                try:
                    if batch is not None:
                        batch.add_done(job, self.manager.completion(job, value, output))
                        return
                    self.manager.complete(job, value, output)  # a coroutine's: at once
                    self.flights.count(completed=1)
                    self._hook(job, "on_complete")
                    return
                except PayloadError as exc:  # a result that is not JSON never will be
                    value = Unretryable(f"the result cannot be stored: {exc}")
            timed_out = outcome.ending is Ending.TIMED_OUT
            verdict = self.manager.fail(job, value, output, retry=outcome.retry, timed_out=timed_out)
            self.flights.count(failed=1)
            log.info("job %d failed (%s): %s", job.id, verdict, _last_line(value))
            if verdict is Verdict.DEAD:
                self._hook(job, "on_dead")
        except LeaseLost as exc:
            log.warning("%s", exc)
        except NbqueueError:
            log.exception("could not record the outcome of job %d", job.id)

    # -- heartbeats, recovery, timeouts ------------------------------------------

    def _keeper(self) -> Keeper:
        """The keeper: this worker's chores (heartbeats, cancellations, its loop's health) and the
        queue's housekeeping; between chores it watches batches and timeouts."""
        own = [
            Chore("heartbeat", self.lease / policy.HEARTBEATS_PER_LEASE, self._beat),
            Chore("cancellations", self.cancel_interval, self._watch_cancellations),
            Chore("event loop", self.cancel_interval, self._coroutines.watch),
        ]
        chores = housekeeping(
            self.manager,
            self.housekeeping,
            lambda: self._filter().tasks,
            lambda job: self._hook(job, "on_dead"),
            self._stopping,
        )
        return Keeper([*own, *chores], self._stopping, self._keeper_wake, self._watch)

    def _watch(self) -> list[float]:
        """Settle overdue batches and stop jobs past their timeout; when to look again."""
        due = self._settle_overdue()
        if self.mode == "thread":  # a process-mode runner enforces its job's timeout itself
            self._expire_timeouts()
            due += self.flights.deadlines()  # wake exactly at the next timeout, not on a coarse tick
        return due

    def _beat(self) -> None:
        for flight in self.flights.now():
            try:
                self.manager.heartbeat(flight.job)
            except LeaseLost as exc:  # cancelled, or taken over (or it waits now): tell the handler
                if not flight.context.suspended:
                    log.warning("%s", exc)
                    self._claim_gone(flight)
            except InvalidTransition:  # it finished between the snapshot and the heartbeat
                pass
            except NbqueueError:
                log.exception("heartbeat for job %d failed", flight.job.id)

    def _watch_cancellations(self) -> None:
        """A running job cancelled with q.cancel() (or taken over): stop its handler, free its slot."""
        flights = {flight.job.id: flight for flight in self.flights.now()}
        for job_id in self.manager.lifeline.lost_claims([flight.job for flight in flights.values()]):
            self._claim_gone(flights[job_id])

    def _claim_gone(self, flight: Flight) -> None:
        """The job is no longer this worker's: its handler is told to stop.

        In process mode the runner kills the child and carries on. In thread mode a
        handler that never checks `cancelled()` would hold its thread until it returns,
        so, as at a timeout, the thread is left to it and a new runner takes its place.
        """
        flight.context.cancel.set()
        if self.mode == "process":
            return
        # A coroutine's slot frees itself when it unwinds; a thread's place goes to a new runner.
        if self.flights.retire_if_held(flight) and flight.task is None:
            self._hand_on()

    def _expire_timeouts(self) -> None:
        for flight in self.flights.retire_late():  # (a coroutine's timeout interrupts it at an await)
            job = flight.job
            try:
                verdict = self.manager.fail(job, f"timed out after {job.timeout:g} s", timed_out=True)
                self.flights.count(failed=1)
                if verdict is Verdict.DEAD:
                    self._hook(job, "on_dead")
            except NbqueueError as exc:
                log.warning("could not fail timed-out job %d: %s", job.id, exc)
            self._hand_on()  # only now: until the failure is committed the worker is not idle

    def _hand_on(self) -> None:
        """A retired runner's place goes to a new runner; only then does it stop counting as busy."""
        with self.flights.lock:
            if not self._stopping.is_set():
                self._spawn_runner()
            self.flights.count(busy=-1)

    def _hook(self, job: Job, which: str) -> None:
        """Run a task's on_complete / on_dead hook; its errors are logged, never raised."""
        task = registry.find(job.task)
        if (hook := None if task is None else getattr(task, which)) is None:
            return
        try:
            hook(job if which == "on_complete" else self.manager.get(job.id))
        except Exception:
            log.exception("%s hook of task %s failed for job %d", which, job.task, job.id)


def _last_line(error: object) -> str:
    return (str(error).strip().splitlines() or [""])[-1][:200]
