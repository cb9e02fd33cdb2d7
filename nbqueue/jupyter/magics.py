"""%nbqueue, %enqueue, %%enqueue, %worker, %jobs, %deadletters and %send."""

from __future__ import annotations

import ast
import functools
import inspect
import logging
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments

from .. import cells, notebooks
from .. import tasks as registry
from ..cli import sent_text, sent_value
from ..errors import NbqueueError
from ..jobs import UNFINISHED, Job, State
from ..options import FLAGS, from_flags
from ..queue import Queue
from ..targets import ENVIRONMENT
from ..tasks import Task
from ..worker import Worker
from ..workflows import Workflow
from .render import worker_status_html, worker_status_text

log = logging.getLogger("nbqueue.magics")

DEFAULT_FILE = "nbqueue.db"
MAIN = "__main__."  # the module of what a notebook defines


@dataclass
class Session:
    """The notebook's queue, its worker and its live views: one per kernel."""

    shell: Any
    queue: Queue | None = None
    worker: Worker | None = None
    views: list[Any] = field(default_factory=list)
    _functions_seen: dict[str, int] = field(default_factory=dict)  # the functions after_cell last saw

    def open(self, path: str) -> Queue:
        """Open (or create) the notebook's queue; the worker follows it."""
        target = path if "://" in path else os.path.abspath(os.path.expanduser(path))
        if self.queue is not None and self.queue.target == target:
            return self.queue
        opened = Queue(target)  # first: a bad path must leave the running worker alone
        self.stop_worker()
        self.close_views()
        if self.queue is not None:
            self.queue.close()
        self.queue = opened
        self.queue.cell_task(self.shell.user_ns)
        self.shell.user_ns["nbqueue_queue"] = self.queue
        return self.queue

    def current(self) -> Queue:
        """The open queue; the first use opens $NBQUEUE_URL, or else nbqueue.db beside the notebook."""
        if self.queue is not None:
            return self.queue
        return self.open(os.environ.get(ENVIRONMENT) or DEFAULT_FILE)

    def start_worker(
        self, concurrency: int, queues: list[str] | None, lease: float, async_concurrency: int = 64
    ) -> Worker:
        queue = self.current()
        if self.worker is not None and self.worker.running:
            return self.worker
        self.adopt_functions()
        queue.notebook_task()  # notebook jobs this kernel's user queued (signed)
        self.worker = queue.worker(
            queues=queues,
            concurrency=concurrency,
            lease=lease,
            async_concurrency=async_concurrency,
            allow=[cells.CELL_TASK, notebooks.NOTEBOOK_TASK],
        ).start()
        return self.worker

    def cell_name(self, filename: str) -> str | None:
        """A cell's source file as IPython names it in tracebacks ("Cell In[17]"), else None."""
        found = self.shell.compile.format_code_name(filename)
        return f"{found[0]} {found[1]}" if found else None

    def after_cell(self, *_: Any) -> None:
        """After every cell, while the worker runs: a function the cell defined that waiting jobs
        name is taken up at once (the worker may have started before the cell ran). A cell that
        defined no function costs no query."""
        if self.worker is None or self.queue is None or not self.worker.running:
            return
        defined = {name: id(v) for name, v in self.shell.user_ns.items() if inspect.isfunction(v)}
        if defined.items() <= self._functions_seen.items():
            return
        self._functions_seen = defined
        try:
            self.adopt_functions()
        except NbqueueError:  # the queue is away: the next cell tries again
            log.debug("adopting notebook functions failed", exc_info=True)

    def adopt_functions(self) -> list[str]:
        """Register notebook functions that unfinished jobs name but this kernel has not seen.

        After a kernel restart, re-running the cells that define the functions is
        enough for the new worker to take the old jobs back. A job names its function
        the way `%enqueue` does: `__main__.fetch` for one defined in the notebook,
        `pkg.mod.fetch` for an imported one; a bare `fetch` (what an older nbqueue
        named it) is still found.
        """
        adopted = []
        ns = self.shell.user_ns
        for name in self.current().task_names(UNFINISHED, signed=True):
            if name in registry.names():
                continue
            found = notebook_function(ns, name)
            if found is None:
                continue
            variable, fn = found
            self.current().task(name=name, signed=True)(_LatestDefinition(ns, variable, fn))
            adopted.append(name)
        return adopted

    def stop_worker(self, timeout: float = 10) -> bool:
        if self.worker is None:
            return True
        stopped = self.worker.stop(timeout=timeout)
        self.worker = None
        return stopped

    def show_workflow(self, workflow: Workflow) -> None:
        """A workflow at the end of a cell: its graph, live (IPython's display hook for it)."""
        from IPython.display import HTML, display  # noqa: PLC0415

        from .views import GraphView  # noqa: PLC0415 - ipywidgets loads on first view

        if workflow.id is None or workflow.graph is None:  # not written yet: nothing to draw
            display(HTML(workflow._repr_html_()))  # type: ignore[no-untyped-call]
            return
        view = GraphView(None, workflow, rows=functools.partial(workflow.graph, workflow))
        self.views.append(view)
        display(view)  # type: ignore[no-untyped-call]

    def close_views(self) -> None:
        for view in self.views:
            view.close()
        self.views.clear()

    def shutdown(self) -> None:
        """Stop the worker and the views' timers (unload, kernel shutdown)."""
        self.close_views()
        self.stop_worker()


def _options(fn: Any) -> Any:
    """The job options (`nbqueue.options.FLAGS`) as options of %enqueue and %%enqueue."""
    for flag in reversed(FLAGS):
        fn = argument(*flag.flags, dest=flag.option, type=flag.type, default=None, help=flag.help)(fn)
    return fn


def _parse(magic: Any, line: str) -> Any:
    """A magic's options, split the shell's way: quotes group words and are removed."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"cannot read the options {line!r}: {exc}") from None
    return magic.parser.parse_args(words)


def _split_options(line: str, parser: Any) -> tuple[list[str], str]:
    """Leading `--options` (unquoted) and the call after them, which is left as written.

    (argparse would read `f(1, -1)` as holding an option `-1)`, and split strings.)
    """
    takes_value = {opt for action in parser._actions if action.nargs != 0 for opt in action.option_strings}
    value = r"(\"[^\"]*\"|'[^']*'|\S+)"
    rest, options = line.strip(), []
    while rest.startswith("-"):
        match = re.match(r"(--?[A-Za-z][\w-]*)(=" + value + r")?(\s+|$)", rest)
        if match is None:
            break
        rest = rest[match.end() :]
        options.append(match.group(1))
        if match.group(2) is not None:
            options.append(_unquote(match.group(3)))
        elif match.group(1) in takes_value and (given := re.match(value + r"(\s+|$)", rest)):
            options.append(_unquote(given.group(1)))
            rest = rest[given.end() :]
    return options, rest


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def task_name(fn: Any, written: str) -> str:
    """The name `%enqueue` gives a plain function's task: module-qualified, as `@q.task` does
    (`__main__.fetch` for a function of the notebook, `pkg.mod.fetch` for an imported one).
    A callable without a qualified name (a partial, an object) is named as written, and so is
    a lambda (`f = lambda x: ...` is `__main__.f`: every lambda's own name is `<lambda>`)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and module and qualname:
        if "<lambda>" in qualname and written.isidentifier():
            return f"{module}.{written}"
        return f"{module}.{qualname}"
    own = getattr(fn, "__name__", None)
    return f"{MAIN}{own if isinstance(own, str) and own else written}"


def notebook_function(namespace: dict[str, Any], task: str) -> tuple[str, Any] | None:
    """The notebook's function a signed job names, with the variable that holds it, or None.

    `__main__.fetch` is whatever `fetch` holds now (a redefinition included); `pkg.mod.fetch`
    is `fetch` if it is that function (imported); a bare `fetch` is the name an older nbqueue
    gave. A Task is registered by itself, and is never adopted."""
    if task.startswith(MAIN):
        variable = task.removeprefix(MAIN)
    elif "." in task:
        variable = task.rsplit(".", 1)[1]
    else:
        variable = task
    fn = namespace.get(variable) if variable.isidentifier() else None
    if fn is None or isinstance(fn, Task) or not callable(fn):
        return None
    if "." in task and not task.startswith(MAIN) and task_name(fn, variable) != task:
        return None  # another function under the same short name
    return variable, fn


class _LatestDefinition:
    """Calls whatever the notebook's namespace holds under `name` now (else the original)."""

    def __init__(self, namespace: dict[str, Any], name: str, original: Any) -> None:
        self.namespace, self.name, self.original = namespace, name, original
        self.__name__ = getattr(original, "__name__", name)
        self.__doc__ = getattr(original, "__doc__", None)

    @property
    def __signature__(self) -> inspect.Signature:
        """The current definition's signature: a call it cannot take is refused before it runs."""
        return inspect.signature(self._current())

    def _current(self) -> Any:
        current = self.namespace.get(self.name, self.original) if self.name else self.original
        if isinstance(current, Task):
            current = current.fn
        return current if callable(current) else self.original

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._current()(*args, **kwargs)


@magics_class
class NbqueueMagics(Magics):
    """The magics; all of them work on the session's queue."""

    def __init__(self, shell: Any, session: Session) -> None:
        super().__init__(shell)
        self.session = session

    @line_magic("nbqueue")
    def nbqueue_magic(self, line: str) -> Queue:
        """%nbqueue [PATH]: open (or create) the notebook's queue; without PATH, show it."""
        path = line.strip()
        try:
            if path:
                parts = shlex.split(path)
                if len(parts) != 1:
                    raise UsageError("%nbqueue takes one path (quote it if it has spaces)")
                return self.session.open(parts[0])
            return self.session.current()
        except NbqueueError as exc:
            raise UsageError(str(exc)) from None

    @magic_arguments(name="enqueue")
    @_options
    @argument("--wait", "-w", action="store_true", help="block until the job finishes")
    @argument("--notebook", default=None, help="queue a run of this notebook instead of a call")
    @argument(
        "--parameter",
        action="append",
        default=[],
        type=notebooks.parameter,
        help="a notebook parameter: NAME=VALUE (with --notebook, -p means this, not --priority)",
    )
    @argument("call", nargs="*", help="a call: f(args)")
    @no_var_expand  # the call is Python: {x} and $x must reach it as written
    @line_magic("enqueue")
    def enqueue_line(self, line: str) -> Job:
        """%enqueue [options] f(args): queue a call of a notebook function; returns the Job.

        ``%enqueue --notebook PATH -p name=value`` queues a run of a whole notebook instead.
        """
        parser = self.enqueue_line.parser
        options, source = _split_options(line, parser)
        if "--notebook" in options or any(option.startswith("--notebook=") for option in options):
            # papermill's habit: -p name=value; a call's -p stays its priority
            options = ["--parameter" if option == "-p" else option for option in options]
        args = parser.parse_args(options)
        if args.call:
            raise UsageError(f"%enqueue: unexpected {' '.join(args.call)!r} before the call")
        source = source.strip()
        if args.notebook is not None:
            if source:
                raise UsageError(f"%enqueue --notebook takes no call; {source!r} is left over")
            try:
                job = self.session.current().enqueue_notebook(
                    args.notebook, dict(args.parameter), **from_flags(args)
                )
            except NbqueueError as exc:
                raise UsageError(f"%enqueue --notebook: {exc}") from None
            return self._maybe_wait(job, args.wait)
        if args.parameter:
            raise UsageError("%enqueue: --parameter gives a notebook's parameters; use it with --notebook")
        if not source:
            raise UsageError("%enqueue needs a call, like: %enqueue fetch('https://example.org')")
        task, call_args, call_kwargs = self._parse_call(source)
        return self._schedule(task, call_args, call_kwargs, args, f"%enqueue {source}")

    @magic_arguments(name="enqueue")
    @_options
    @argument("--wait", "-w", action="store_true", help="block until the job finishes")
    @argument("--name", "-n", default="cell", help="a label for the job")
    @no_var_expand
    @cell_magic("enqueue")
    def enqueue_cell(self, line: str, cell: str) -> Job:
        """%%enqueue [options] [--name NAME]: the cell's code becomes one job in this namespace."""
        args = _parse(self.enqueue_cell, line)
        if not cell.strip():
            raise UsageError("%%enqueue needs code in the cell")
        try:
            compile(cell, f"<%%enqueue {args.name}>", "exec")
        except SyntaxError as exc:
            raise UsageError(f"%%enqueue: the cell does not parse: {exc}") from None
        queue = self.session.current()
        task = queue.cell_task(self.shell.user_ns)
        return self._schedule(task, (cell, args.name), {}, args, "%%enqueue")

    @magic_arguments(name="worker")
    @argument("action", nargs="?", default="status", choices=["start", "stop", "status"])
    @argument("--concurrency", "-c", type=int, default=1, help="jobs at once")
    @argument("--queues", default=None, help="comma-separated queue names (default all)")
    @argument("--lease", type=float, default=60.0, help="claim lease in seconds")
    @argument("--async-concurrency", type=int, default=64, help="coroutine jobs in flight at once")
    @line_magic("worker")
    def worker_magic(self, line: str) -> WorkerStatus:
        """%worker start [--concurrency N] [--async-concurrency N] [--queues a,b] | stop | status."""
        args = _parse(self.worker_magic, line)
        if args.concurrency < 1:
            raise UsageError("--concurrency must be at least 1")
        if args.async_concurrency < 1:
            raise UsageError("--async-concurrency must be at least 1")
        if not 0 < args.lease < 10**7:
            raise UsageError("--lease must be a number of seconds above 0")
        queues = [q.strip() for q in args.queues.split(",") if q.strip()] if args.queues else None
        try:
            if args.action == "start":
                self.session.start_worker(args.concurrency, queues, args.lease, args.async_concurrency)
            elif args.action == "stop":
                self.session.stop_worker()
        except NbqueueError as exc:
            raise UsageError(str(exc)) from None
        worker = self.session.worker
        if worker is None:
            return WorkerStatus({"running": False})
        return WorkerStatus(worker.status())

    @magic_arguments(name="jobs")
    @argument("--status", "-s", default=None, choices=[s.value for s in State])
    @argument("--queue", "-q", default=None)
    @argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    @argument("--graph", "-g", type=int, default=None, help="draw the graph job ID belongs to, live")
    @argument("--follow", "-f", type=int, default=None, help="show what job ID emits, live until it ends")
    @line_magic("jobs")
    def jobs_magic(self, line: str) -> Any:
        """%jobs [--status S] [--queue Q]: the live job board. %jobs --graph ID: a job's graph.
        %jobs --follow ID: a job's stream (nbqueue.emit), growing until the job finishes."""
        args = _parse(self.jobs_magic, line)
        if not 0 < args.interval < 3600:
            raise UsageError("--interval must be a number of seconds above 0 (and under an hour)")
        if args.graph is not None and args.follow is not None:
            raise UsageError("%jobs: --graph and --follow show one thing each; give one of them")
        from .views import GraphView, JobBoard  # noqa: PLC0415 - ipywidgets loads on first view

        if args.follow is not None:
            from .stream_view import StreamView  # noqa: PLC0415

            try:
                follower = StreamView(self.session.current(), args.follow, interval=args.interval)
            except NbqueueError as exc:
                raise UsageError(f"%jobs --follow: {exc}") from None
            self.session.views.append(follower)
            return follower
        if args.graph is not None:
            view = GraphView(self.session.current(), args.graph, interval=args.interval)
            self.session.views.append(view)
            return view
        board = JobBoard(
            self.session.current(), status=args.status, queue_name=args.queue, interval=args.interval
        )
        self.session.views.append(board)
        return board

    @magic_arguments(name="deadletters")
    @argument("--queue", "-q", default=None)
    @line_magic("deadletters")
    def deadletters_magic(self, line: str) -> Any:
        """%deadletters [--queue Q]: dead jobs with Requeue and Delete buttons."""
        args = _parse(self.deadletters_magic, line)
        from .views import DeadLetterView  # noqa: PLC0415

        view = DeadLetterView(self.session.current(), queue_name=args.queue)
        self.session.views.append(view)
        return view

    @magic_arguments(name="send")
    @argument("id", type=int, help="a job id")
    @argument("name", help="the name it waits for (nbqueue.wait_for(NAME))")
    @argument("value", help="JSON when it reads as JSON (3, true, '{\"a\": 1}'), else text")
    @argument("--by", default=None, help="who sends (default: your user name and host)")
    @no_var_expand  # a JSON object's braces must reach the value as written
    @line_magic("send")
    def send_magic(self, line: str) -> None:
        """%send ID NAME VALUE [--by WHO]: answer a job's nbqueue.wait_for(NAME), as `nbqueue send`."""
        args = _parse(self.send_magic, line)
        value = sent_value(args.value)
        try:
            woke = self.session.current().send(args.id, args.name, value, by=args.by)
        except NbqueueError as exc:
            raise UsageError(f"%send: {exc}") from None
        print(sent_text(args.id, args.name, value, woke))

    # -- helpers ---------------------------------------------------------------

    def _parse_call(self, source: str) -> tuple[Task[Any, Any], tuple[Any, ...], dict[str, Any]]:
        """`f(a, b=c)` -> the task for f and the evaluated arguments."""
        try:
            node = ast.parse(source, mode="eval").body
        except SyntaxError as exc:
            raise UsageError(f"%enqueue: {source!r} is not a call: {exc.msg}") from None
        if not isinstance(node, ast.Call):
            raise UsageError(f"%enqueue takes a function call like f(1, x=2), not {source!r}")
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise UsageError("%enqueue: write the arguments out; *args and **kwargs are not supported")
        ns = self.shell.user_ns
        name = ast.unparse(node.func)
        try:
            fn = eval(compile(ast.Expression(node.func), "<%enqueue>", "eval"), ns)
        except NameError:
            raise UsageError(f"%enqueue: {name!r} is not defined in this notebook") from None
        except Exception as exc:
            raise UsageError(f"%enqueue: cannot find {name!r}: {exc!r}") from None
        try:
            call_args = tuple(eval(compile(ast.Expression(a), "<%enqueue>", "eval"), ns) for a in node.args)
            call_kwargs = {
                k.arg: eval(compile(ast.Expression(k.value), "<%enqueue>", "eval"), ns)
                for k in node.keywords
                if k.arg is not None
            }
        except Exception as exc:
            raise UsageError(f"%enqueue: evaluating the arguments failed: {exc!r}") from None
        return self._task_for(fn, ast.unparse(node.func)), call_args, call_kwargs

    def _task_for(self, fn: Any, name: str) -> Task[Any, Any]:
        if isinstance(fn, Task):
            return fn
        if not callable(fn):
            raise UsageError(f"%enqueue: {name} is a {type(fn).__name__}, not a function")
        # A plain function becomes a task on the fly, under its module-qualified name like
        # any task (`__main__.fetch` for one defined in the notebook). The handler looks the
        # name up when the job runs, so redefining the function in the notebook and
        # requeueing a dead job runs the fixed code.
        handler = _LatestDefinition(self.shell.user_ns, name if name.isidentifier() else "", fn)
        task: Task[Any, Any] = self.session.current().task(name=task_name(fn, name), signed=True)(handler)
        return task

    def _schedule(
        self,
        task: Task[Any, Any],
        call_args: tuple[Any, ...],
        call_kwargs: dict[str, Any],
        args: Any,
        what: str,
    ) -> Job:
        """Queue the call with the magic's options; a refusal is a UsageError, nothing queued."""
        try:
            job = task.schedule(call_args, call_kwargs, **from_flags(args))
        except NbqueueError as exc:
            raise UsageError(f"{what}: {exc}") from None
        return self._maybe_wait(job, args.wait)

    def _maybe_wait(self, job: Job, wait: bool) -> Job:
        if wait:
            if self.session.worker is None or not self.session.worker.running:
                raise UsageError(
                    f"%enqueue --wait: job {job.id} is queued, but no worker runs (%worker start)"
                )
            self.session.current().wait([job], progress=False)
            job.refresh()
        return job


class WorkerStatus(dict[str, Any]):
    """What `%worker` returns: the worker's status (a dict), shown as a line a person reads,
    with a warning for pending jobs this kernel has no function for."""

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(worker_status_text(self))

    def _repr_html_(self) -> str:
        return worker_status_html(self)
