"""The rules that run inside SQL (nbqueue.storage.rules) are written once: both backends'
statements carry the same fragments (the contract suite, run on both, shows they behave alike)."""

from __future__ import annotations

from types import ModuleType

import pytest

from nbqueue.storage import postgres_queries, rules, sqlite_queries


@pytest.mark.parametrize("queries", [sqlite_queries, postgres_queries], ids=["sqlite", "postgres"])
def test_both_backends_claim_and_count_by_the_shared_rules(queries: ModuleType) -> None:
    for statement in ("CLAIM_FROM_ANY_QUEUE", "CLAIM_FROM_QUEUES"):
        text = getattr(queries, statement)
        assert rules.CLAIMABLE_SQL in text, statement
        assert rules.CLAIM_ORDER in text, statement
    assert rules.UNFINISHED_SQL in queries.SQL.HELD_KEY  # a key is held while its job is unfinished


def test_the_fragments_name_exactly_the_state_machines_sets() -> None:
    from nbqueue.jobs import CLAIMABLE, UNFINISHED

    for fragment, states in ((rules.CLAIMABLE_SQL, CLAIMABLE), (rules.UNFINISHED_SQL, UNFINISHED)):
        named = {s.value for s in rules.State if f"'{s.value}'" in fragment}
        assert named == {s.value for s in states}, fragment
