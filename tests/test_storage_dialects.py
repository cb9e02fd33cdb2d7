"""The shared SQL storage runs one set of statements in two dialects (nbqueue.storage.statements).

Both dialects define every statement the storage runs and none it does not, and a statement
written once reads the same in both once the dialect's own spellings (parameters, lists, the
clock, the wake-up, locks and planner hints) are put back to one form: a difference anywhere
else is a statement that quietly means something else on one backend.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from nbqueue.storage import postgres_queries, sqlite_queries
from nbqueue.storage.checkpoint_statements import CheckpointStatements
from nbqueue.storage.dialect import Dialect
from nbqueue.storage.statements import Statements, Written

STORAGE = Path(__file__).resolve().parent.parent / "nbqueue" / "storage"
LITE, PG = sqlite_queries.SQL, postgres_queries.SQL
NAMES = [f.name for f in dataclasses.fields(Statements) if f.name != "dialect"]
WRITTEN = {f.name for f in dataclasses.fields(Written)}
# The LangGraph checkpoint statements (storage/checkpoints.py), built once for both dialects.
LITE_CP, PG_CP = sqlite_queries.CHECKPOINT_SQL, postgres_queries.CHECKPOINT_SQL
CHECKPOINT_NAMES = [f.name for f in dataclasses.fields(CheckpointStatements)]
# Each dialect's own way to hold a thread's writers apart: PostgreSQL's advisory lock; none on
# SQLite, whose write transaction holds the file.
OWN_CHECKPOINT_WORDS = {"LOCK_THREAD"}
SHARED_CHECKPOINT_NAMES = [name for name in CHECKPOINT_NAMES if name not in OWN_CHECKPOINT_WORDS]


def used_names() -> dict[str, set[str]]:
    """Every attribute of a Statements read in the storage code: `sql.SQL.X`, `self.sql.X`, `tx.sql.X`,
    or `sql.X` on a local named sql (what the shared verbs bind): {name: modules}."""
    found: dict[str, set[str]] = {}
    for module in ("sql.py", "cascade.py", "waits.py", "limited.py", "sqlite.py", "postgres.py"):
        for node in ast.walk(ast.parse((STORAGE / module).read_text())):
            if isinstance(node, ast.Attribute) and node.attr.isupper():
                owner = ast.unparse(node.value)
                if owner in ("sql.SQL", "self.sql", "tx.sql", "sql"):
                    found.setdefault(node.attr, set()).add(module)
    return found


def test_both_dialects_define_every_statement_the_storage_runs_and_no_other() -> None:
    used = used_names()
    for statements in (LITE, PG):
        for name in NAMES:
            text = getattr(statements, name)
            assert text, name
            for one in text.values() if isinstance(text, dict) else [text]:
                assert isinstance(one, str) and one.strip(), name
    # (a name used by a backend from its own query module is not a Statements field: skip those)
    shared = {"sql.py", "cascade.py", "waits.py", "limited.py"}
    shared_uses = {name for name, modules in used.items() if name in NAMES or modules & shared}
    missing = sorted(shared_uses - set(NAMES))
    assert not missing, f"run by the shared storage but not a statement of both dialects: {missing}"
    unused = sorted(set(NAMES) - set(used))
    assert not unused, f"statements no storage code runs: {unused}"


def unwrap_unindexed(text: str) -> str:
    """PostgreSQL's `(test) IS TRUE` (d.unindexed) back to `test`, parentheses balanced."""
    while (end := text.find(") IS TRUE")) >= 0:
        depth, start = 0, end
        while start > 0:
            start -= 1
            depth += {")": 1, "(": -1}.get(text[start], 0)
            if depth < 0:
                break
        text = text[:start] + text[start + 1 : end] + text[end + len(") IS TRUE") :]
    return text


def to_one_form(text: str, d: Dialect) -> str:
    """A statement with the dialect's own spellings put back to one neutral form."""
    if d is PG.dialect:
        text = text.replace(d.now, "{now}").replace(d.wake, "")  # SQLite's wake-up is no text
        text = re.sub(r"= ANY\(%\((\w+)\)s::\w+\[\]\)", r"IN [\1]", text)
        text = re.sub(r"<> ALL\(%\((\w+)\)s::\w+\[\]\)", r"NOT IN [\1]", text)
        text = re.sub(r"unnest\(%\((\w+)\)s::\w+\[\]\) AS value", r"EACH [\1]", text)
        text = unwrap_unindexed(text)
        text = re.sub(r"%\((\w+)\)s(::\w+)?", r":\1", text)
    else:
        text = re.sub(r"NOT IN \(SELECT value FROM json_each\(:(\w+)\)\)", r"NOT IN [\1]", text)
        text = re.sub(r"IN \(SELECT value FROM json_each\(:(\w+)\)\)", r"IN [\1]", text)
        text = re.sub(r"json_each\(:(\w+)\)", r"EACH [\1]", text)
        text = re.sub(r":now\b", "{now}", text)
        text = re.sub(r"\b(AND|WHERE) \+(?=[\w(])", r"\1 ", text)  # d.unindexed: `+test`
    text = re.sub(rf"\b{d.same} (?=:|%\()", "{same} ", text)  # before a parameter only
    text = re.sub(rf"\b{d.greatest}\(", "{greatest}(", text)
    text = re.sub(rf" {d.like} (?=:pattern|%\(pattern)", " {like} ", text)
    text = text.replace(d.tail_error, "{tail_error}")
    for field in (
        "lock_children",
        "lock_parents",
        "lock_row",
        "spawned_index",
    ):  # spelled as nothing in one dialect
        if spelling := getattr(d, field):
            text = text.replace(spelling, "")
    text = text.replace(f" {d.ordered_join} ", " JOIN ")  # (a plain JOIN where the order is free)
    return text


@pytest.mark.parametrize("name", [n for n in NAMES if n not in WRITTEN])
def test_a_statement_written_once_differs_only_where_the_dialect_says(name: str) -> None:
    lite, pg = getattr(LITE, name), getattr(PG, name)
    pairs = [(lite[k], pg[k]) for k in lite] if isinstance(lite, dict) else [(lite, pg)]
    for one_lite, one_pg in pairs:
        assert to_one_form(one_lite, LITE.dialect) == to_one_form(one_pg, PG.dialect)


def test_the_normal_form_really_removes_only_the_dialects_spellings() -> None:
    """The check above is not empty: a real difference survives it (a different state)."""
    lite = LITE.CANCEL.replace("'cancelled'", "'dead'")
    assert to_one_form(lite, LITE.dialect) != to_one_form(PG.CANCEL, PG.dialect)
    assert to_one_form(LITE.GET_MANY, LITE.dialect) == to_one_form(PG.GET_MANY, PG.dialect)
    assert "%(" not in to_one_form(PG.FAIL, PG.dialect)


def test_no_statement_is_edited_at_run_time_or_looked_up_by_name() -> None:
    """The statements are attributes read by name in the code (typed), never getattr by string."""
    for module in ("sql.py", "cascade.py", "sqlite.py", "postgres.py", "checkpoints.py"):
        tree = ast.parse((STORAGE / module).read_text())
        lookups = [
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and any(isinstance(a, ast.Name) and a.id in ("sql", "SQL") for a in node.args[:1])
        ]
        assert not lookups, f"{module} looks statements up by name at lines {lookups}"


def checkpoint_names_used() -> set[str]:
    """Every attribute of a CheckpointStatements the checkpoint verbs read: `self.checkpoint_sql.X`,
    or `sql.X` on a local named sql (what they bind it to)."""
    return {
        node.attr
        for node in ast.walk(ast.parse((STORAGE / "checkpoints.py").read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr.isupper()
        and ast.unparse(node.value) in ("self.checkpoint_sql", "sql")
    }


def test_both_dialects_define_every_checkpoint_statement_the_verbs_run_and_no_other() -> None:
    for statements in (LITE_CP, PG_CP):
        assert isinstance(statements, CheckpointStatements)
        for name in SHARED_CHECKPOINT_NAMES:
            text = getattr(statements, name)
            for one in text if isinstance(text, tuple) else [text]:
                assert isinstance(one, str) and one.strip(), name
    assert LITE_CP.LOCK_THREAD == "" and "pg_advisory_xact_lock" in PG_CP.LOCK_THREAD
    for name in CHECKPOINT_NAMES:  # a tuple runs in order: the same statements, as many, in both
        lite, pg = getattr(LITE_CP, name), getattr(PG_CP, name)
        assert isinstance(lite, tuple) == isinstance(pg, tuple), name
        assert not isinstance(lite, tuple) or len(lite) == len(pg) > 0, name
    used = checkpoint_names_used()
    missing = sorted(used - set(CHECKPOINT_NAMES))
    assert not missing, f"run by storage/checkpoints.py but not a checkpoint statement: {missing}"
    unused = sorted(set(CHECKPOINT_NAMES) - used)
    assert not unused, f"checkpoint statements storage/checkpoints.py never runs: {unused}"


@pytest.mark.parametrize("name", SHARED_CHECKPOINT_NAMES)
def test_a_checkpoint_statement_differs_only_where_the_dialect_says(name: str) -> None:
    lite, pg = getattr(LITE_CP, name), getattr(PG_CP, name)
    pairs = list(zip(lite, pg, strict=True)) if isinstance(lite, tuple) else [(lite, pg)]
    for one_lite, one_pg in pairs:
        assert to_one_form(one_lite, LITE.dialect) == to_one_form(one_pg, PG.dialect)


def test_the_normal_form_tells_checkpoint_statements_apart() -> None:
    """The check above is not empty for them either: a real difference survives it."""
    assert to_one_form(LITE_CP.DROP, LITE.dialect) != to_one_form(PG_CP.DROP_WRITES, PG.dialect)
    changed = LITE_CP.HEADS.replace("WHERE thread", "WHERE ns")
    assert to_one_form(changed, LITE.dialect) != to_one_form(PG_CP.HEADS, PG.dialect)
    assert to_one_form(LITE_CP.UNFINISHED, LITE.dialect) == to_one_form(PG_CP.UNFINISHED, PG.dialect)
    assert "%(" not in to_one_form(PG_CP.PUT, PG.dialect)
    assert "IN [ids]" in to_one_form(PG_CP.DROP, PG.dialect)
