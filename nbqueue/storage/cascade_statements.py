"""The statements of a cascade (storage/cascade.py: what a finished, requeued or cancelled parent
does to its children), written once for both dialects: a part of `statements.build`, kept here
so that each module stays one screenful of ideas."""

from __future__ import annotations

from .dialect import Dialect
from .rules import NEVER_US


def waits_for_parents(table: str) -> str:
    """A job that its parents still hold (a job waiting for jobs, wait_for_jobs, counts them down
    too), its columns named with `table` ("c." in a join, "" in an update of the row itself)."""
    return f"({table}status = 'blocked' OR ({table}status = 'waiting' AND {table}parents_left > 0))"


def cascade_statements(d: Dialect) -> dict[str, str]:
    """Reading a level's children, counting them down, releasing, dooming and re-arming them, in
    dialect `d`."""
    r, now = d.render, d.now
    children = f"nbqueue_edges e {d.ordered_join} nbqueue_jobs c ON c.id = e.child"
    blocked, waiting, doomed = (
        waits_for_parents("c."),
        "c.status IN ('blocked', 'pending')",
        "c.status = 'upstream_failed'",
    )
    counting = "status IN ('blocked', 'waiting')"  # what a cascade moves (its rows chosen above)
    release = (  # (a job that waited for jobs, re-armed or not, was due at NEVER_US: due now)
        "status = 'pending', parents_left = :left, run_at = CASE WHEN status = 'waiting' OR run_at >= "
        f"{NEVER_US} THEN {now} ELSE {d.greatest}(run_at, {now}) END, updated_at = {now}"
    )
    group = (  # one parent's children alike, as CHILD_GROUPS counted them
        "id IN (SELECT child FROM nbqueue_edges WHERE parent = :parent) AND "
        f"{d.unindexed.format(waits_for_parents(''))} AND wait_when {d.same} :rule::text AND "
        "parents_left = :stored"
    )
    return {
        # A cascade walks the edges from the parents, then each child by its id, never from every
        # blocked job in the state index (each level of a chain). The children are locked (in id
        # order) before their counts are read, where other writers run at once (PostgreSQL): two
        # parents finishing at once queue up on the child, and no count-down is lost. Parents that
        # did not complete: a row per edge, as each passes on its own root cause.
        "CHILDREN_BLOCKED": r(
            f"SELECT c.id, c.wait_when, c.parents_left, e.parent, 1 FROM {children} WHERE e.parent IN "
            "[:ids::bigint] "
            f"AND {d.unindexed.format(blocked)} ORDER BY c.id, e.parent{d.lock_children}"
        ),
        # Parents that completed: a row per child, with how many of them are its parents (a fan-in's
        # join is one row per batch of finished parents, not one per parent). Both read as the
        # cascade folds them: (child, rule, count left, parent or 0 for those completed, parents).
        "CHILDREN_COUNTED": r(
            "SELECT c.id, c.wait_when, c.parents_left, 0, g.n FROM (SELECT e.child, count(*) AS n FROM "
            f"(SELECT value FROM EACH [:ids::bigint]) i {d.ordered_join} nbqueue_edges e ON e.parent = "
            f"i.value GROUP BY e.child) g {d.ordered_join} nbqueue_jobs c ON c.id = g.child WHERE "
            f"{d.unindexed.format(blocked)} ORDER BY c.id{d.lock_children}"
        ),
        # One parent that completed (a fan-out's root, a link of a chain): its children in groups
        # alike (rule, count left), locked first as above, fewest left first; each group is then
        # moved by one statement that finds its children by their parent: no id read or sent back.
        "CHILD_GROUPS": r(
            "SELECT wait_when, parents_left FROM (SELECT c.wait_when, c.parents_left FROM "
            f"{children} WHERE e.parent = :id AND {d.unindexed.format(blocked)} ORDER BY c.id"
            f"{d.lock_children}) k GROUP BY wait_when, parents_left ORDER BY parents_left"
        ),
        "UNBLOCK_GROUP": r(f"UPDATE nbqueue_jobs SET {release} WHERE {group}"),
        "SET_LEFT_GROUP": r(f"UPDATE nbqueue_jobs SET parents_left = :left WHERE {group}"),
        # Children that wait for their parents, or were let go by them and have not started: a parent
        # that comes back (requeue, replay) makes them count afresh.
        "CHILDREN_WAITING": r(
            f"SELECT c.id FROM {children} WHERE e.parent IN [:ids::bigint] "
            f"AND {d.unindexed.format(waiting)} ORDER BY c.id{d.lock_children}"
        ),
        "SET_LEFT": r(f"UPDATE nbqueue_jobs SET parents_left = :left WHERE id = :id AND {counting}"),
        "UNBLOCK": r(f"UPDATE nbqueue_jobs SET {release} WHERE id = :id AND {counting} RETURNING 1{d.wake}"),
        # The children a level releases with the same count left, at once (a batch's joins).
        "UNBLOCK_MANY": r(
            f"UPDATE nbqueue_jobs SET {release} WHERE id IN [:ids::bigint] AND {d.unindexed.format(counting)}"
        ),
        "DOOM": r(
            "UPDATE nbqueue_jobs SET status = 'upstream_failed', parents_left = :left, root_cause = :root, "
            f"error = :error, finished_at = {now}, updated_at = {now} WHERE id = :id AND {counting} "
            "RETURNING has_children"
        ),
        "WAITS_FOR": r("SELECT wait_when FROM nbqueue_jobs WHERE id = :id"),
        # A re-armed job's parents are held while it is settled: a parent finishing meanwhile either
        # commits first (and is read finished) or waits, then sees the job blocked and counts down.
        "PARENTS_OF": r(
            "SELECT p.id, p.status, p.root_cause FROM nbqueue_edges e JOIN nbqueue_jobs p ON p.id = e.parent "
            f"WHERE e.child = :id ORDER BY p.id{d.lock_parents}"
        ),
        "SETTLE": r(
            "UPDATE nbqueue_jobs SET status = :status, parents_left = :left, root_cause = :root, "
            "error = coalesce(:error, error), finished_at = CASE WHEN :status = 'upstream_failed' THEN "
            f"{now} END, updated_at = {now} WHERE id = :id RETURNING 1{d.wake}"
        ),
        "DOOMED_BY": r(
            f"SELECT c.id FROM {children} WHERE e.parent IN [:ids::bigint] "
            f"AND {d.unindexed.format(doomed)} AND c.root_cause = :root"
        ),
        "REARM": r(
            "UPDATE nbqueue_jobs SET status = 'blocked', root_cause = NULL, error = NULL, "
            f"finished_at = NULL, updated_at = {now} WHERE id = :id AND status = 'upstream_failed'"
        ),
        "EDGES_OF": r(
            "SELECT parent, child FROM nbqueue_edges WHERE child IN [:ids::bigint] "
            "OR parent IN [:ids::bigint] ORDER BY child, parent"
        ),
    }
