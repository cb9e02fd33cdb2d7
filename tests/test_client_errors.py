"""The real clients' errors: 429/503/529 snoozes, NETWORK_ERRORS retries, step values.

Each client (openai and anthropic with `max_retries=0`, httpx sync and async, requests,
aiohttp, urllib) calls a real HTTP server on 127.0.0.1 that answers 429 with Retry-After
(seconds, an HTTP date, 0, retry-after-ms), 503 and Anthropic's 529, resets the
connection, or hangs; a closed port refuses. First what each client raises is checked
against nbqueue's rules (no job needed), then the same calls run inside real jobs on a
real worker, both backends: a snooze counts no attempt and pauses the job's limit keys,
`retry_on=nbqueue.NETWORK_ERRORS` retries, a step value that is not JSON is dead at once.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# openai, anthropic and aiohttp are imported in the calls that use them: at the top they cost every
# test process ~2.5 s of collection.
import httpx
import pytest
import requests

import nbqueue
from nbqueue import NETWORK_ERRORS, Backoff, Queue
from nbqueue.payload import error_text
from nbqueue.retry import retry_after
from tests.helpers import wait_until

NOW = Backoff(base=0, cap=0, jitter=0)  # a retry is due at once
HANG = 3.0  # seconds a hanging answer takes; the clients give up after TIMEOUT
TIMEOUT = 0.5
# Every other answer is waited for longer: on a loaded machine the server thread can take more
# than half a second to accept or answer (httpx then raised ConnectTimeout for a 503).
PATIENT = 10.0


def limit(mode: str) -> float:
    """The clients' timeout for an answer of that mode."""
    return TIMEOUT if mode == "hang" else PATIENT


CHAT = {
    "id": "c1",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
}
MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "content": [{"type": "text", "text": "hi"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 1, "output_tokens": 1},
}


def _soon() -> str:
    return format_datetime(datetime.now(UTC) + timedelta(seconds=3), usegmt=True)


#: The first path segment picks the answer: (status, headers).
ANSWERS: dict[str, tuple[int, Callable[[], dict[str, str]]]] = {
    "429": (429, lambda: {"Retry-After": "2"}),
    "429-date": (429, lambda: {"Retry-After": _soon()}),
    "429-zero": (429, lambda: {"Retry-After": "0"}),
    "429-ms": (429, lambda: {"retry-after-ms": "1500"}),
    "503": (503, lambda: {"Retry-After": "2"}),
    "529": (529, lambda: {"Retry-After": "2"}),
    "never": (429, lambda: {"Retry-After": "0"}),  # a server that always says "now"
    "ok": (200, dict),
}
#: The delay each answer asks for, as nbqueue reads it (a date: about 3 s).
ASKED = {"429": 2.0, "429-date": 3.0, "429-zero": 1.0, "429-ms": 1.5, "503": 2.0, "529": 2.0}


class Server:
    """A real HTTP server on 127.0.0.1 whose answer depends on the path's first segment,
    or, once `script` is set, on the n-th request (so a job's retry meets another answer)."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.script: list[str] = []  # answers for the next requests, in order, whatever the path
        self.seen: set[str] = set()  # the tags of "mode~tag" paths answered once already
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def answer(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                if size:
                    self.rfile.read(size)
                mode = self.path.strip("/").split("/")[0]
                with outer.lock:
                    if outer.script:
                        mode = outer.script.pop(0)
                    elif "~" in mode:  # "reset~tag": the first request with that tag only
                        mode, tag = mode.split("~", 1)
                        mode = "ok" if tag in outer.seen else mode
                        outer.seen.add(tag)
                    outer.requests[mode] += 1
                if mode == "reset":  # no answer: the connection is reset (RST)
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    return
                if mode == "garbage":  # not HTTP: a protocol error
                    self.wfile.write(b"HELLO THERE\r\n\r\n")
                    self.close_connection = True
                    return
                if mode == "hang":
                    time.sleep(HANG)
                status, headers = ANSWERS[mode]
                anthropic_call = "/messages" in self.path
                if status == 200:
                    body = json.dumps(MESSAGE if anthropic_call else CHAT).encode()
                elif anthropic_call:
                    kind = "overloaded_error" if status == 529 else "rate_limit_error"
                    body = json.dumps({"type": "error", "error": {"type": kind, "message": "wait"}}).encode()
                else:
                    body = json.dumps({"error": {"type": "rate_limit", "message": "slow down"}}).encode()
                self.send_response(status)
                for name, value in {**headers(), "Content-Type": "application/json"}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = answer

        class Quiet(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a reset connection's last flush fails: expected

        self.http = Quiet(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    running = Server()
    yield running
    running.close()


@pytest.fixture(autouse=True)
def _fresh(server: Server) -> None:
    server.requests.clear()
    server.script.clear()
    server.seen.clear()


def closed_port() -> str:
    """A URL nobody listens on: connection refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# One call per client: (url of the server, answer) -> "hi". Sync or async, as the client is.


def call_openai(base: str, mode: str) -> Any:
    import openai

    client = openai.AsyncOpenAI(base_url=f"{base}/{mode}/v1", api_key="k", max_retries=0, timeout=limit(mode))

    async def ask() -> str:
        async with client:
            done = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
        return str(done.choices[0].message.content)

    return ask()


def call_anthropic(base: str, mode: str) -> str:
    import anthropic

    with anthropic.Anthropic(
        base_url=f"{base}/{mode}", api_key="k", max_retries=0, timeout=limit(mode)
    ) as client:
        done = client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    return str(done.content[0].text)  # type: ignore[union-attr]


def call_httpx(base: str, mode: str) -> str:
    answer = httpx.get(f"{base}/{mode}", timeout=limit(mode)).raise_for_status()
    return str(answer.json()["choices"][0]["message"]["content"])


async def call_httpx_async(base: str, mode: str) -> str:
    async with httpx.AsyncClient(timeout=limit(mode)) as client:
        answer = (await client.get(f"{base}/{mode}")).raise_for_status()
    return str(answer.json()["choices"][0]["message"]["content"])


def call_requests(base: str, mode: str) -> str:
    answer = requests.get(f"{base}/{mode}", timeout=limit(mode))
    answer.raise_for_status()
    return str(answer.json()["choices"][0]["message"]["content"])


async def call_aiohttp(base: str, mode: str) -> str:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=limit(mode))
    async with aiohttp.ClientSession(raise_for_status=True, timeout=timeout) as session:
        # POST, as a model API call is: aiohttp retries a reset GET by itself, once
        async with session.post(f"{base}/{mode}", json={"prompt": "hi"}) as answer:
            return str((await answer.json())["choices"][0]["message"]["content"])


def call_urllib(base: str, mode: str) -> str:
    with urllib.request.urlopen(f"{base}/{mode}", timeout=limit(mode)) as answer:
        return str(json.load(answer)["choices"][0]["message"]["content"])


CLIENTS: dict[str, Callable[[str, str], Any]] = {
    "openai": call_openai,
    "anthropic": call_anthropic,
    "httpx": call_httpx,
    "httpx-async": call_httpx_async,
    "requests": call_requests,
    "aiohttp": call_aiohttp,
    "urllib": call_urllib,
}


def raised(client: str, base: str, mode: str) -> BaseException:
    """What the client raises for that answer (called here, outside any job)."""
    try:
        value = CLIENTS[client](base, mode)
        if asyncio.iscoroutine(value):
            asyncio.run(value)
    except Exception as exc:
        return exc
    raise AssertionError(f"{client} raised nothing for {mode}")


@pytest.mark.parametrize("mode", sorted(ASKED))
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_every_client_s_429_503_529_is_a_snooze(server: Server, client: str, mode: str) -> None:
    before = time.time()
    error = raised(client, server.url, mode)
    snooze = retry_after(error)
    after = time.time()
    assert snooze is not None, f"{client}: {type(error).__module__}.{type(error).__qualname__}: {error}"
    assert not isinstance(error, NETWORK_ERRORS)  # an answer, not a network failure
    assert snooze.pause_limits
    if mode == "429-date":  # whole seconds, written between before and after, read until after
        assert math.floor(before) + 3 - after <= snooze.seconds <= after + 3 - before
    else:
        assert snooze.seconds == ASKED[mode]
    assert server.requests[mode] == 1  # max_retries=0: the SDKs did not retry by themselves


@pytest.mark.parametrize("mode", ["refused", "reset", "hang", "garbage"])
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_every_client_s_network_errors_are_network_errors(server: Server, client: str, mode: str) -> None:
    base = closed_port() if mode == "refused" else server.url
    error = raised(client, base, mode)
    assert isinstance(error, NETWORK_ERRORS), f"{client}: {type(error).__module__}.{type(error).__qualname__}"
    assert retry_after(error) is None


def test_network_errors_match_no_answer_and_no_other_error() -> None:
    import openai

    assert not isinstance(ValueError("x"), NETWORK_ERRORS)
    assert not isinstance(urllib.error.URLError("unknown url type: ftp2"), NETWORK_ERRORS)
    assert issubclass(httpx.ConnectError, NETWORK_ERRORS) and issubclass(
        openai.APITimeoutError, NETWORK_ERRORS
    )
    assert not issubclass(openai.RateLimitError, NETWORK_ERRORS) and not issubclass(KeyError, NETWORK_ERRORS)
    reset = ConnectionResetError("reset")
    assert isinstance(ExceptionGroup("all network", [reset, TimeoutError()]), NETWORK_ERRORS)
    assert not isinstance(ExceptionGroup("mixed", [reset, ValueError()]), NETWORK_ERRORS)
    # What the README used to say matches none of what the clients raise:
    request = httpx.Request("GET", "http://127.0.0.1")
    for error in (openai.APIConnectionError(request=request), httpx.ConnectError("refused")):
        assert not isinstance(error, (ConnectionError, TimeoutError))
        assert isinstance(error, NETWORK_ERRORS)


def test_network_errors_import_no_client_library() -> None:
    """A plain install stays small and `import nbqueue` fast: the check looks only at the
    libraries already imported, and sees one imported after the task was defined."""
    clients = ["openai", "anthropic", "httpx", "httpx2", "requests", "aiohttp", "urllib3"]
    script = f"""
import sys
import nbqueue
clients = {clients!r}
assert not isinstance(ValueError(), nbqueue.NETWORK_ERRORS)
assert isinstance(ConnectionRefusedError(), nbqueue.NETWORK_ERRORS)
assert not [m for m in clients if m in sys.modules], [m for m in clients if m in sys.modules]
import httpx
assert isinstance(httpx.ConnectError("refused"), nbqueue.NETWORK_ERRORS)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def _job(queue: Queue, client: str, server: Server, mode: str = "ok", **options: Any) -> nbqueue.Task:
    """A task that makes one call with `client` (the server's script says what it answers)."""

    def call() -> Any:
        return CLIENTS[client](server.url, mode)

    call.__name__ = f"call_{client.replace('-', '_')}"
    return queue.task(name=f"clients.{client}", **options)(call)


#: The answer each client meets in a job: every shape once or more.
JOB_SHAPES = {
    "openai": "429-ms",
    "anthropic": "529",
    "httpx": "503",
    "httpx-async": "429",
    "requests": "429-date",
    "aiohttp": "503",
    "urllib": "429",
}


@pytest.mark.slow
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_client_s_429_in_a_job_snoozes_and_pauses_its_key(
    make_queue: Callable[..., Queue], server: Server, client: str
) -> None:
    queue = make_queue(backoff=NOW)
    queue.limit("api", concurrency=10)
    shape = JOB_SHAPES[client]
    server.script.append(shape)  # the first call meets it, the next one is answered
    task = _job(queue, client, server, limits=["api"], max_retries=0, retry_on=NETWORK_ERRORS)
    job = task.enqueue()
    with queue.worker(lease=10):
        wait_until(lambda: queue.get(job.id).snoozes == 1, 15, f"{client}'s {shape} snoozing the job")
        row = queue.limits().set_index("key").loc["api"]
        assert row["paused_until"] is not None and "HTTP" in str(row["paused_why"])
        assert job.result(timeout=20) == "hi"
    done = queue.get(job.id)
    assert (done.retries, done.snoozes, done.attempts) == (0, 1, 2)
    assert server.requests[shape] == 1 and server.requests["ok"] == 1


def test_retry_after_zero_waits_a_second_each_time(make_queue: Callable[..., Queue], server: Server) -> None:
    """A server that always says "Retry-After: 0" once burned the 100 snoozes in 4 s. The queue's
    clock moves instead of the test waiting: no call before a whole second has passed on it."""
    clock = nbqueue.ManualClock()
    queue = make_queue(backoff=NOW, clock=clock)
    task = _job(queue, "httpx", server, max_retries=0)
    server.script.extend(["never"] * 50)
    job = task.enqueue()
    with queue.worker(lease=10, idle_interval=0.05):
        wait_until(lambda: queue.get(job.id).snoozes >= 1, 10, "the first snooze")
        time.sleep(0.2)  # four idle looks of the worker
        clock.advance(0.9)
        time.sleep(0.2)
        assert queue.get(job.id).snoozes == 1  # not a second yet: no call
        clock.advance(0.1)
        wait_until(lambda: queue.get(job.id).snoozes == 2, 10, "the call a second later")
        time.sleep(0.2)
        assert queue.get(job.id).snoozes == 2  # one call a second at most, not dozens
        queue.cancel(job)
    assert "the least" in (queue.get(job.id).error or "")


# A hang waits out the client's real read timeout on each attempt: slow.
@pytest.mark.parametrize("mode", ["refused", "reset", pytest.param("hang", marks=pytest.mark.slow)])
def test_network_errors_in_a_job_are_retried(
    make_queue: Callable[..., Queue], server: Server, mode: str
) -> None:
    """retry_on=NETWORK_ERRORS, as the README writes it, retries each client's network failures."""
    queue = make_queue(backoff=NOW)
    if mode == "refused":  # a closed port for the first call of each, the server for the retry
        tasks = {client: _refused_once(queue, client, server) for client in CLIENTS}
    else:  # the first call of each meets `mode`, its retry is answered
        options: dict[str, Any] = {"max_retries": 1, "retry_on": NETWORK_ERRORS}
        tasks = {c: _job(queue, c, server, f"{mode}~{c}", **options) for c in CLIENTS}
    jobs = {client: task.enqueue() for client, task in tasks.items()}
    with queue.worker(lease=10, concurrency=len(CLIENTS)):
        for client, job in jobs.items():
            assert job.result(timeout=30) == "hi", client
    for client, job in jobs.items():
        done = queue.get(job.id)
        assert (done.retries, done.attempts) == (1, 2), (client, done.error)


def _refused_once(queue: Queue, client: str, server: Server) -> nbqueue.Task:
    refused = closed_port()
    runs: list[int] = []

    def call() -> Any:
        runs.append(1)
        return CLIENTS[client](refused if len(runs) == 1 else server.url, "ok")

    call.__name__ = f"refused_{client.replace('-', '_')}"
    return queue.task(name=f"clients.refused.{client}", max_retries=1, retry_on=NETWORK_ERRORS)(call)


def test_give_up_on_network_errors_is_dead_at_once(make_queue: Callable[..., Queue], server: Server) -> None:
    queue = make_queue(backoff=NOW)
    task = _job(queue, "requests", server, max_retries=5, give_up_on=NETWORK_ERRORS)
    server.script.append("reset")
    job = task.enqueue()
    with queue.worker(lease=10), pytest.raises(nbqueue.JobFailed):
        job.result(timeout=20)
    done = queue.get(job.id)
    assert (done.status, done.attempts) == ("dead", 1) and "ConnectionError" in (done.error or "")


def test_a_task_group_s_429_snoozes_and_its_error_is_readable(
    make_queue: Callable[..., Queue], server: Server
) -> None:
    clock = nbqueue.ManualClock()
    queue = make_queue(backoff=NOW, clock=clock)
    queue.limit("api", concurrency=10)

    @queue.task(name="clients.group", limits=["api"], max_retries=0)
    async def fan_out(modes: list[str]) -> list[str]:
        async with asyncio.TaskGroup() as group:
            calls = [group.create_task(call_httpx_async(server.url, mode)) for mode in modes]
        return [c.result() for c in calls]

    @queue.task(name="clients.group_fails", max_retries=0)
    async def fails() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(call_httpx_async(closed_port(), "ok"))

    server.script.append("429-ms")
    job, bad = fan_out.enqueue(["ok", "ok"]), fails.enqueue()
    with queue.worker(lease=10, idle_interval=0.05):
        wait_until(lambda: queue.get(job.id).snoozes == 1, 15, "the group's 429 snoozing the job")
        assert queue.limits().set_index("key").loc["api", "paused_until"] is not None
        clock.advance(1.5)  # the 1500 ms the server asked for, on the queue's clock
        assert job.result(timeout=20) == ["hi", "hi"]
        with pytest.raises(nbqueue.JobFailed):
            bad.result(timeout=20)
    done = queue.get(job.id)
    assert (done.retries, done.snoozes) == (0, 1)
    last = (queue.get(bad.id).error or "").strip().splitlines()[-1]
    assert last.startswith("ExceptionGroup: unhandled errors in a TaskGroup (1 error): httpx.ConnectError: ")


def _ask_openai(url: str) -> Any:
    """The SDK's response object, as a step might carelessly return it."""
    import openai

    with openai.OpenAI(base_url=f"{url}/ok/v1", api_key="k", max_retries=0, timeout=PATIENT) as client:
        return client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


async def _ask_openai_async(url: str) -> Any:
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/ok/v1", api_key="k", max_retries=0, timeout=PATIENT)
    async with client:
        return await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_step_value_that_is_not_json_is_dead_at_once(
    make_queue: Callable[..., Queue], server: Server, kind: str
) -> None:
    """The call was made (and billed); a retry would only pay for it again."""
    queue = make_queue(backoff=NOW)
    url = server.url

    @queue.task(name="clients.careless_sync", max_retries=3)
    def careless_sync() -> str:
        return str(nbqueue.step("ask", _ask_openai, url))

    @queue.task(name="clients.careless_async", max_retries=3)
    async def careless_async() -> str:
        return str(await nbqueue.step("ask", _ask_openai_async, url))

    job = (careless_sync if kind == "sync" else careless_async).enqueue()
    with queue.worker(lease=10), pytest.raises(nbqueue.JobFailed, match="not JSON"):
        job.result(timeout=20)
    done = queue.get(job.id)
    assert (done.status, done.attempts, done.retries) == ("dead", 1, 0)
    assert "the value of step 'ask' is a openai.types.chat.chat_completion.ChatCompletion" in (
        done.error or ""
    )
    assert "Unretryable" in (done.error or "")
    assert server.requests["ok"] == 1  # called once, never again
    assert queue.steps(job).empty  # nothing recorded


@pytest.mark.slow  # a child process per run
def test_process_mode_snoozes_and_gives_up_like_threads(
    make_queue: Callable[..., Queue], server: Server
) -> None:
    queue = make_queue(backoff=NOW)
    queue.limit("api", concurrency=10)

    def in_child(url: str, what: str) -> Any:  # defined here: sent by value, the child imports httpx only
        if what == "step":  # an httpx.Response: not JSON
            return nbqueue.step("ask", httpx.get, f"{url}/ok", timeout=PATIENT)
        return httpx.get(f"{url}/ok", timeout=PATIENT).raise_for_status().json()["choices"][0]["index"]

    task = queue.task(name="clients.process", max_retries=3, limits=["api"])(in_child)
    server.script.append("429-ms")
    snoozed = task.enqueue(server.url, "call")
    with queue.worker(lease=10, mode="process"):
        wait_until(lambda: queue.get(snoozed.id).snoozes == 1, 20, "the child's 429 snoozing the job")
        assert queue.limits().set_index("key").loc["api", "paused_until"] is not None
        assert snoozed.result(timeout=30) == 0
        careless = task.enqueue(server.url, "step")
        with pytest.raises(nbqueue.JobFailed, match="not JSON"):
            careless.result(timeout=30)
    assert (queue.get(snoozed.id).retries, queue.get(snoozed.id).snoozes) == (0, 1)
    done = queue.get(careless.id)
    assert (done.status, done.attempts) == ("dead", 1)
    assert server.requests["ok"] == 2  # the snoozed job's second call, the careless step's one


def test_an_exception_group_s_stored_error_ends_in_its_members_messages() -> None:
    inner = ExceptionGroup("inner", [KeyError("k"), ValueError("two\nlines")])
    group = ExceptionGroup("outer", [inner, *(OSError(f"e{i}") for i in range(5))])
    text = error_text(group)
    last = text.splitlines()[-1]
    assert "+---" in text.splitlines()[-2]  # the frame art is kept above it
    assert last == (
        "ExceptionGroup: outer (7 errors): KeyError: 'k'; ValueError: two lines; OSError: e0; "
        "OSError: e1; OSError: e2; and 2 more"
    )
