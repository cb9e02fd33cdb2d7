"""Fixtures shared by the core suite.

Tests speak to the public `Queue` API only, so that a second backend can later
parametrise `queue_target` and run the same contract tests.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import nbqueue
from nbqueue import tasks
from tests import templates

MakeQueue = Callable[..., nbqueue.Queue]

# nbformat imports jsonschema, whose optional IRI format check (rfc3987_syntax, installed here
# with JupyterLab) compiles 38 grammars at import: ~2.5 s in every test process that touches a
# notebook. Neither nbformat nor nbqueue checks formats, so test processes go without it
# (jsonschema then leaves that check out); kernels and subprocesses are untouched.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]

# Signed jobs (nbqueue.signing) use a secret of the test run, never the developer's own;
# child processes and kernels started by the tests inherit it.
os.environ.setdefault(
    "NBQUEUE_SECRET_FILE", os.path.join(tempfile.mkdtemp(prefix="nbqueue-secret-"), "secret")
)


@pytest.fixture(autouse=True)
def _isolated_registry() -> Iterator[None]:
    """Tasks registered by one test must not be run by another test's worker."""
    saved = tasks.snapshot()
    yield
    tasks.restore(saved)


# Tests whose first use in a process costs seconds of imports (IPython and ipywidgets, nbformat,
# the openai and anthropic SDKs) run in one test process each under `pytest -n N` (make test-fast),
# so that one process pays instead of every one. (pytest-xdist's own `--dist loadgroup` groups
# nothing under pytest 9.2: it renames test ids, which pytest 9.2 no longer reads.)
HEAVY_IMPORTS = {
    "tests/jupyter/": "ipython",
    "tests/test_notebook_jobs.py": "ipython",  # nbformat, which the magics' tests import too
    "tests/test_client_errors.py": "client-libraries",
}


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "load":
        return None  # a --dist the caller chose
    from xdist.scheduler import LoadScopeScheduling

    class HeavyImportsTogether(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's load scheduling, one test per unit, but each group of HEAVY_IMPORTS one unit."""

        def _split_scope(self, nodeid: str) -> str:
            return next((group for path, group in HEAVY_IMPORTS.items() if nodeid.startswith(path)), nodeid)

    return HeavyImportsTogether(config, log)


PG_SERVER = os.environ.get("NBQUEUE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


# What the suite's schemas, tables and roles churn in the server's catalogs. This server runs
# with autovacuum off: unvacuumed, one fast set leaves ~1 million dead rows in pg_attribute, and
# after a few runs every new connection's catalog reads cost the server ~100 ms (the PostgreSQL
# tests of test_queue.py: 14.3 s of server CPU with 270 MB of pg_attribute, 2.9 s vacuumed).
CHURNED_CATALOGS = (
    "pg_attribute", "pg_class", "pg_depend", "pg_type", "pg_index", "pg_constraint", "pg_attrdef",
    "pg_trigger", "pg_proc", "pg_namespace", "pg_sequence", "pg_init_privs",
)  # fmt: skip


def pytest_sessionstart(session: pytest.Session) -> None:
    """Vacuum the catalogs once per run, before any test process starts (not in xdist's workers)."""
    if hasattr(session.config, "workerinput"):
        return
    import psycopg

    try:
        with psycopg.connect(PG_SERVER, autocommit=True, connect_timeout=3) as conn:
            for catalog in CHURNED_CATALOGS:
                conn.execute(f"VACUUM pg_catalog.{catalog}")
    except psycopg.Error as exc:  # no server, or a role that may not vacuum them: only slower
        print(f"nbqueue tests: the catalogs were not vacuumed: {exc}", file=sys.stderr)


def postgres_available() -> str | None:
    """None if the test server answers, else why not."""
    try:
        import psycopg

        with psycopg.connect(PG_SERVER, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@pytest.fixture(scope="session")
def pg_server() -> str:
    """The PostgreSQL server URL; a missing server fails the test under CI, skips it elsewhere."""
    problem = postgres_available()
    if problem is not None:
        message = f"PostgreSQL at {PG_SERVER} is not reachable: {problem}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return PG_SERVER


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A queue URL in a schema of its own, dropped afterwards: runs never see each other's jobs."""
    import psycopg

    schema = f"nbq_test_{uuid.uuid4().hex[:12]}"
    yield f"{pg_server}?schema={schema}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def pg_schema(pg_server: str) -> Iterator[str]:
    """The name of a schema of the test's own, to build by hand (old versions); dropped after."""
    import psycopg
    from psycopg import sql as pg_sql

    schema = f"nbq_mig_{uuid.uuid4().hex[:10]}"
    yield schema
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(pg_sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pg_sql.Identifier(schema)))


@pytest.fixture(scope="session")
def pg_schemas(pg_server: str) -> Iterator[templates.SchemaPool]:
    """This process's migrated schemas, emptied between tests; all dropped at the end."""
    pool = templates.SchemaPool(pg_server)
    yield pool
    pool.close()


@pytest.fixture
def migrated_pg_url(pg_schemas: templates.SchemaPool) -> Iterator[str]:
    """A queue URL in a migrated, empty schema that no other test uses while this one runs."""
    schema = pg_schemas.take()
    yield pg_schemas.url(schema)
    pg_schemas.give_back(schema)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated queue file made once per test process, for `queue_target` to copy."""
    path = tmp_path_factory.mktemp("template") / "jobs.db"
    templates.make_sqlite_template(path)
    return path


# The backends the contract suite runs on. `make test` runs both; `make test-fast` runs SQLite's
# half (its PostgreSQL twins cost as much again on two cores), while the PostgreSQL-only tests
# (tests/test_postgres.py and the dialect tests) stay in it; `make test-fast BACKENDS=postgres`
# runs the other half.
BACKENDS = ("sqlite", "postgres")
TEST_BACKENDS = [
    name for name in os.environ.get("NBQUEUE_TEST_BACKENDS", ",".join(BACKENDS)).split(",") if name
]
if not TEST_BACKENDS or set(TEST_BACKENDS) - set(BACKENDS):
    raise pytest.UsageError(
        f"NBQUEUE_TEST_BACKENDS={os.environ['NBQUEUE_TEST_BACKENDS']!r}: name some of {', '.join(BACKENDS)}"
    )


@pytest.fixture(params=TEST_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def queue_target(backend: str, request: pytest.FixtureRequest) -> str:
    """Where the queue under test lives: a migrated, empty queue of its own (a copy of a template
    SQLite file, or a PostgreSQL schema emptied after its last test: tests/templates.py). Tests
    of creating or migrating a queue use tmp_path or `pg_url` instead."""
    if backend == "postgres":
        return str(request.getfixturevalue("migrated_pg_url"))
    return str(request.getfixturevalue("sqlite_queue_file"))


@pytest.fixture
def sqlite_queue_file(tmp_path: Path, sqlite_template: Path) -> Path:
    """A migrated, empty SQLite queue file of the test's own (a copy of the template)."""
    target = tmp_path / "jobs.db"
    templates.copy_sqlite_template(sqlite_template, target)
    return target


@pytest.fixture
def make_queue(queue_target: str) -> Iterator[MakeQueue]:
    """Open (another) Queue on the test's target; every one is closed at teardown."""
    opened: list[nbqueue.Queue] = []

    def make(**options: Any) -> nbqueue.Queue:
        q = nbqueue.Queue(queue_target, **options)
        opened.append(q)
        return q

    yield make
    for q in opened:
        q.close()


@pytest.fixture
def queue(make_queue: MakeQueue) -> nbqueue.Queue:
    return make_queue()


@pytest.fixture
def clock() -> nbqueue.ManualClock:
    return nbqueue.ManualClock()


@pytest.fixture
def clocked_queue(make_queue: MakeQueue, clock: nbqueue.ManualClock) -> nbqueue.Queue:
    return make_queue(clock=clock)


@pytest.fixture
def exact_queue(make_queue: MakeQueue, clock: nbqueue.ManualClock) -> nbqueue.Queue:
    """A queue on the manual clock whose backoff has no jitter: delays are exactly 2, 4, 8 ..."""
    return make_queue(clock=clock, backoff=nbqueue.Backoff(base=2, cap=3600, jitter=0))


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An event stuck handlers wait on; always opened at teardown so no thread stays stuck."""
    event = threading.Event()
    yield event
    event.set()
