"""The jobs linked by `after=`: a job's parents and children, and the graph of a workflow or of
every job connected to one (what `q.graph`, the board's detail pane and `nbqueue graph` show).

A room of the JobManager (`manager.links`): it reads the storage it is handed, and hands each
job it lists to the manager (`attach`), so that `job.refresh()` and `job.result()` work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from operator import attrgetter

from .errors import JobNotFound, NbqueueError
from .jobs import Job, State, listed
from .options import check_id
from .storage import Row, Storage
from .workflows import Planned, Workflow

GRAPH_LIMIT = 100_000  # jobs a graph shows at most


class Links:
    """A queue's links between jobs, read."""

    def __init__(self, storage: Storage, attach: Callable[[Job], Job]) -> None:
        self.storage = storage
        self._attach = attach

    def graph(
        self, of: Workflow | Planned | Job | int, limit: int = GRAPH_LIMIT
    ) -> list[tuple[Job, list[int]]]:
        """A workflow's jobs, or every job linked to a job by `after=` (at most `limit` of them),
        each with its parents' ids."""
        if isinstance(of, Workflow):
            if of.id is None:
                raise NbqueueError(f"workflow {of.name!r} is written when its `with` block ends")
            ids = self.storage.workflow_jobs(of.id)
            edges = self.storage.edges(ids) if ids else []
        else:
            ids, edges = self._connected(check_id(getattr(of, "id", of)), limit)
        inside = set(ids)
        parents: dict[int, list[int]] = {}
        for parent, child in sorted({(int(p), int(c)) for p, c in edges}):
            if child in inside:
                parents.setdefault(child, []).append(parent)
        jobs = sorted(
            (self._attach(listed(row)) for row in self.storage.get_many(sorted(inside))), key=attrgetter("id")
        )
        return [(job, parents.get(job.id, [])) for job in jobs]

    def _connected(self, start: int, limit: int) -> tuple[list[int], list[Row]]:
        """The jobs reachable from `start` along edges either way (the nearest `limit`), and the edges."""
        if self.storage.get(start) is None:
            raise JobNotFound(f"no job with id {start}")
        seen, frontier, edges = {start}, [start], set()
        while frontier and len(seen) < limit:
            found = {(int(p), int(c)) for p, c in self.storage.edges(frontier)}
            edges |= found
            reached = {j for edge in found for j in edge} - seen
            seen |= reached
            frontier = sorted(reached)
        return sorted(seen)[:limit], list(edges)

    def parents_of(self, job_ids: Sequence[int]) -> dict[int, list[int]]:
        """Each job's parents (ids), for the jobs that have any."""
        wanted = set(job_ids)
        found: dict[int, list[int]] = {}
        for parent, child in self.storage.edges(list(job_ids)) if job_ids else []:
            if int(child) in wanted:
                found.setdefault(int(child), []).append(int(parent))
        return found

    def found(self, job_ids: Iterable[int]) -> dict[int, Job]:
        """The jobs of these ids that exist (as listed: a damaged row too), by id."""
        return {job.id: job for job in map(listed, self.storage.get_many(sorted(set(job_ids))))}

    def relatives(self, job_id: int) -> tuple[list[int], list[int]]:
        """A job's parents and children (ids)."""
        edges = self.storage.edges([job_id])
        return (
            sorted(int(p) for p, c in edges if int(c) == job_id),
            sorted(int(c) for p, c in edges if int(p) == job_id),
        )

    def what_blocks(self, jobs: Sequence[Job]) -> dict[int, str]:
        """What each blocked or upstream_failed job waits for, in a few words:
        "waiting on #4 (running), #5 (pending)", or "waiting on dead #12: requeue it"."""
        blocked = [j.id for j in jobs if j.status is State.BLOCKED]
        doomed = {j.id: j.root_cause for j in jobs if j.status is State.UPSTREAM_FAILED and j.root_cause}
        if not blocked and not doomed:
            return {}
        parents = self.parents_of(blocked)
        known = self.found([*doomed.values(), *(p for ps in parents.values() for p in ps)])
        notes = {}
        for job_id, root_id in doomed.items():
            root = known.get(root_id)
            if root is None:
                notes[job_id] = f"upstream job #{root_id} failed and is gone"
            elif root.status in (State.DEAD, State.CANCELLED):
                notes[job_id] = f"waiting on {root.status.value} #{root.id}: requeue it"
        for job_id in blocked:
            waited = [known[p] for p in parents.get(job_id, []) if p in known and not known[p].finished]
            named = ", ".join(f"#{p.id} ({p.status.value})" for p in waited[:3])
            more = f" +{len(waited) - 3} more" if len(waited) > 3 else ""
            notes[job_id] = f"waiting on {named}{more}" if waited else "waiting on its parents"
        return notes
