"""New jobs: a task's call or a raw payload, with its options, made into a row and written.

A room of the JobManager (`manager.intake`). One job's trip reads top to bottom here:
`submit` (inside a workflow's block it is only collected; inside a running job it is keyed
by its origin, so every later run gets it back), `encode` (the body as JSON, the options
checked, the row signed, all before the write transaction), `link` (its parents, origin and
workflow, only when it has any), then one insert, returned as a Job without reading it back.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from . import dependencies, workflows
from . import payload as payload_json
from .clock import from_us, to_us, utc_seconds
from .context import current as current_job
from .errors import InvalidArgument, PayloadError
from .jobs import Job, State, stored_backoff
from .options import JobArgs, JobOptions, gate, stored
from .payload import SCALARS, call_body
from .retry import Backoff
from .storage import NewJob, Storage
from .tasks import Task
from .trust import Trust
from .workflows import Plan, Workflow


class Intake:
    """A queue's way in for new jobs, one at a time, many at once, or a workflow's together."""

    def __init__(
        self,
        storage: Storage,
        trust: Trust,
        backoff: Backoff,
        read: Callable[[list[int]], list[Job]],
        attach: Callable[[Job], Job],
        graph: Callable[[Workflow], list[tuple[Job, list[int]]]],
        limited: Callable[[], object],
    ) -> None:
        """`read` reads jobs back by id, `attach` ties a new Job to the manager, `graph` draws a
        workflow, `limited` tells the claims that jobs holding limit keys now exist."""
        self.storage = storage
        self.trust = trust
        self._read = read
        self._attach = attach
        self._graph = graph
        self._limited = limited
        self._default_backoff = payload_json.dumps(backoff.to_dict(), "backoff")
        #: At most this many jobs made inside one job's family (workflows.FAMILY_LIMIT).
        self.family_limit = workflows.FAMILY_LIMIT

    def enqueue_call(
        self, task: Task[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any], options: JobArgs
    ) -> Job:
        """Queue `task(*args, **kwargs)` with the task's options, some replaced by `options`."""
        chosen = task.options.but(options)
        return self.submit(
            Plan(task.name, tuple(args), dict(kwargs), None, chosen, task.backoff, task.signed)
        )

    def payload(self, payload: Any, options: JobArgs) -> Job:
        """Queue a raw JSON payload job."""
        return self.submit(Plan(None, (), {}, payload, JobOptions.given(options)))

    def submit(self, plan: Plan) -> Job:
        """Write one job now, or collect it into the workflow whose block is running."""
        workflow = workflows.active()
        if workflow is not None and workflow.owner is self:
            return workflow.add(plan)  # type: ignore[return-value]  # a Planned stands for the Job
        plan = self._with_origin(plan)
        new = self._encoded(plan, {})
        if not plan.parents and plan.origin is None:
            return self._written(new)
        linked = self._linked(plan, new, {}, None)
        [(job_id, _)] = self.storage.insert_linked(1, lambda _i, _ids, _wf: linked, None)
        return self._read([job_id])[0]

    def enqueue_map(self, task: Task[Any, Any], items: Iterable[Any], options: JobArgs) -> list[Job]:
        """Queue `task(item)` for each item, in one transaction: all are written, or none."""
        if isinstance(items, str | bytes | dict) or not isinstance(items, Iterable):
            raise InvalidArgument(
                f"map takes an iterable of items (one job each), not {type(items).__name__}"
            )
        chosen = task.options.but(options)
        if chosen.key is not None:
            raise InvalidArgument("map cannot share one idempotency key among many jobs")
        values = list(items)

        def planned() -> list[Plan]:
            return [Plan(task.name, (item,), {}, None, chosen, task.backoff, task.signed) for item in values]

        workflow = workflows.active()
        if workflow is not None and workflow.owner is self:
            return [workflow.add(plan) for plan in planned()]  # type: ignore[misc]  # Planned for Job
        linked = chosen.after or (dependencies.any_made() and any(map(dependencies.referenced, values)))
        if linked or current_job() is not None:  # each linked to its parents, or made once
            plans = [self._with_origin(plan) for plan in planned()]
            news = [self._linked(plan, self._encoded(plan, {}), {}, None) for plan in plans]
            made = self.storage.insert_linked(len(news), lambda i, _ids, _wf: news[i], None) if news else []
            return self._read([job_id for job_id, _ in made])
        template = self.encode(task.name, "", chosen, task.backoff)  # the options, checked once
        news = []
        for i, item in enumerate(values):
            try:
                new = template.with_payload(call_body((item,), {}))
            except PayloadError as exc:
                raise PayloadError(f"map: item {i}: {exc}") from None
            if task.signed:
                new.signature = self.trust.sign(new)
            news.append(new)
        written = self.storage.insert(news) if news else []
        rows = zip(values, news, written, strict=True)
        return [self._made(new, job_id, at, _call_of(item)) for item, new, (job_id, _, at) in rows]

    def many(self, payloads: Iterable[Any], options: JobArgs) -> list[int]:
        """Queue many raw payload jobs in one transaction: all are written, or none."""
        if isinstance(payloads, str | bytes | dict) or not isinstance(payloads, Iterable):
            raise InvalidArgument("enqueue_many takes an iterable of payloads (for one, use enqueue)")
        chosen = JobOptions.given(options)
        if chosen.key is not None:
            raise InvalidArgument("enqueue_many cannot share one idempotency key among many jobs")
        template = self.encode(None, "", chosen, None)  # the options, checked and encoded once
        news = [
            template.with_payload(payload_json.dumps(p, f"payloads[{i}]")) for i, p in enumerate(payloads)
        ]
        return [job_id for job_id, _, _ in self.storage.insert(news)] if news else []

    def workflow(self, name: str) -> Workflow:
        """A workflow: the jobs made in its `with` block are written together when it ends."""
        return Workflow(
            workflows.check_name(name), self._submit_workflow, self._read, owner=self, graph=self._graph
        )

    def _submit_workflow(self, workflow: Workflow) -> tuple[int, list[int]]:
        plans = [self._with_origin(plan) for plan in workflow.plans]
        made_in: list[int] = []
        # Encoded and signed before the write transaction, all but the jobs whose arguments name
        # an earlier job of the workflow (result_of): its id is known only once it is written.
        encoded = [None if plan.placeholders else self._encoded(plan, {}) for plan in plans]

        def make(index: int, ids: list[int], workflow_id: int | None) -> NewJob:
            if workflow_id is not None and not made_in:
                made_in.append(workflow_id)
            written = workflows.WrittenIds(ids)
            new = encoded[index] or self._encoded(plans[index], written)
            return self._linked(plans[index], new, written, workflow_id)

        made = self.storage.insert_linked(len(plans), make, workflow.name)
        return made_in[0], [job_id for job_id, _ in made]

    def _with_origin(self, plan: Plan) -> Plan:
        """A job made inside a running job is keyed by that job and the call: made once per job."""
        running = current_job()
        if running is None or plan.origin is not None:
            return plan
        origin = workflows.origin_of(running.job.id, plan.task, self._body(plan, {}), running.made)
        return replace(plan, origin=origin)

    def _encoded(self, plan: Plan, ids: Mapping[int, int]) -> NewJob:
        """The plan's job encoded (and signed), its arguments' references to the workflow's
        earlier jobs (`ids`: index -> id) written as their ids."""
        signed = plan.signed and plan.task is not None
        return self.encode(plan.task, self._body(plan, ids), plan.options, plan.backoff, signed)

    def _body(self, plan: Plan, ids: Mapping[int, int]) -> str:
        if not plan.placeholders:  # nothing to write as markers (the common case: no walk)
            return (
                payload_json.dumps(plan.payload, "payload")
                if plan.task is None
                else call_body(plan.args, plan.kwargs)
            )
        if plan.task is None:
            return payload_json.dumps(dependencies.encode(plan.payload, ids), "payload")
        return call_body(dependencies.encode(list(plan.args), ids), dependencies.encode(plan.kwargs, ids))

    def encode(
        self, task: str | None, body: str, options: JobOptions, backoff: Backoff | None, signed: bool = False
    ) -> NewJob:
        """A new job's row: its task, its body (JSON text), its options checked; signed if asked."""
        policy_text = (
            self._default_backoff if backoff is None else payload_json.dumps(backoff.to_dict(), "backoff")
        )
        held = options.limits or {}
        if held:
            self._limited()
        new = NewJob(
            queue=options.queue,
            task=task,
            payload=body,
            priority=options.priority,
            key=options.key,
            max_retries=options.max_retries,
            delay_us=to_us(options.delay or 0.0),
            run_at_us=None if options.run_at is None else to_us(utc_seconds(options.run_at, "run_at")),
            timeout=options.timeout,
            backoff=policy_text,
            limits=stored(held),
            gate=gate(held),
        )
        if signed:
            new.signature = self.trust.sign(new)
        return new

    def _linked(self, plan: Plan, new: NewJob, ids: Mapping[int, int], workflow: int | None) -> NewJob:
        """An encoded job with what ties it to others: its parents' ids, origin and workflow."""
        parents = tuple(dependencies.job_ref(p, ids) for p in plan.parents)
        if not parents and plan.origin is None and workflow is None:
            return new
        # Set in place (the job was encoded for this plan alone): dataclasses.replace costs a
        # workflow of thousands of jobs a tenth of its time.
        new.parents, new.when, new.origin = parents, plan.options.when if parents else None, plan.origin
        new.workflow, new.family_limit = workflow, self.family_limit if plan.origin is not None else None
        return new

    def _written(self, new: NewJob) -> Job:
        """Insert one job; the Job is made from what was written (a held key's job is read back)."""
        [(job_id, created, created_at)] = self.storage.insert([new])
        if not created or created_at is None:
            return self._read([job_id])[0]
        return self._made(new, job_id, created_at)

    def _made(self, new: NewJob, job_id: int, created_at: int | None, payload: Any = None) -> Job:
        """The Job a new row became, from what was written (no read back; `payload`, when given,
        is what its JSON reads back as)."""
        assert created_at is not None
        stamp, run_at = _times(created_at, new.run_at_us, new.delay_us)
        return self._attach(
            Job(
                id=job_id,
                status=State.PENDING,
                queue=new.queue,
                task=new.task,
                payload=json.loads(new.payload) if payload is None else payload,
                priority=new.priority,
                key=new.key,
                retries=0,
                max_retries=new.max_retries,
                attempts=0,
                error=None,
                run_at=run_at,
                created_at=stamp,
                updated_at=stamp,
                timeout=new.timeout,
                backoff=stored_backoff(new.backoff),
                signature=new.signature,
                limits=json.loads(new.limits) if new.limits else {},
            )
        )


@functools.lru_cache(maxsize=8)  # the jobs of one map or batch share their times: worked out once
def _times(created_at: int, run_at_us: int | None, delay_us: int) -> tuple[datetime, datetime]:
    """A new job's created_at and run_at, from what was written (µs)."""
    stamp = from_us(created_at)
    assert stamp is not None
    run_at = from_us(run_at_us) if run_at_us is not None else stamp + timedelta(microseconds=delay_us)
    assert run_at is not None
    return stamp, run_at


def _call_of(item: Any) -> dict[str, Any] | None:
    """A one-argument call's payload as its JSON reads back, for a scalar item (a string, number,
    bool or None reads back as itself); None: read the JSON."""
    return {"args": [item], "kwargs": {}} if type(item) in SCALARS else None
