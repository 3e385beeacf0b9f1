"""The console's web app: Starlette routes, Jinja2 pages, htmx fragments and SSE streams.

Every view is served twice from the same dict of :class:`~eventlane.console.data.ConsoleData`:
as an HTML page at ``PATH`` and as JSON at ``/api`` + ``PATH`` (docs/console.md lists them).
Live views are server-sent events: the live tail (``/topics/{name}/tail/stream``) and a
rebuild's progress (``/rebuilds/{id}/stream``).

Security invariants:

* every request passes :class:`~eventlane.console.guard.Guard` before any route runs
  (Datasette's included): the ``Host`` check, the access token where there is one, the
  read-only refusal and, in a ``--read-write`` console, the same-origin and CSRF-token
  checks of every state change (each a ``POST``); no answer may be framed;
* templates autoescape everything (keys, values, headers are text, never markup);
* names from URLs reach the file system only after validation (topic and group names by
  Kafka's rule, projector names by lookup in the app), and Datasette serves only the app's
  read-model files, with arbitrary SQL off unless ``--read-write``;
* a malformed parameter is answered 4xx before a stream starts, never with a 5xx or an
  aborted stream.

Live tails hold no thread while idle: they await :class:`~eventlane.console.wake.Waker`,
whose one thread sleeps on the log's wake-up word; a worker thread is taken only to read
what was appended.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import orjson
from jinja2 import Environment, FileSystemLoader, select_autoescape
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from eventlane.console.data import ConsoleData, Filters
from eventlane.console.guard import Guard
from eventlane.console.lag import LagSampler
from eventlane.console.wake import Waker
from eventlane.errors import (
    AggregateNotFoundError,
    ConfigError,
    FrameworkError,
    UnknownTopicError,
)
from eventlane.observability import get_logger

log = get_logger("eventlane.console")

__all__ = ["create_app"]

HERE = Path(__file__).parent
ID_MAX = (1 << 63) - 1
"""Largest id a URL may name (SQLite's INTEGER); larger ones are answered 400."""
BAD_REQUEST = (FrameworkError, ValueError)
"""Errors answered 400 (404 for an unknown topic or aggregate) with the message, never 500:
framework errors name what was wrong; ``ValueError`` covers a malformed number in a URL."""


def _json_default(value: object) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(type(value).__name__)


def _dumps(value: object) -> bytes:
    return orjson.dumps(
        value, default=_json_default, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_INDENT_2
    )


class _Json(JSONResponse):
    def render(self, content: Any) -> bytes:
        return _dumps(content)


def _templates(read_write: bool) -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )

    def pretty(value: object) -> str:
        return _dumps(value).decode()

    def when(ms: int | None) -> str:
        if ms is None:
            return "-"
        from datetime import UTC, datetime  # noqa: PLC0415

        return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")

    def ago(ms: int | None) -> str:
        if ms is None:
            return "-"
        seconds = ms / 1000
        for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
            if seconds >= size:
                return f"{seconds / size:.1f} {unit}"
        return f"{seconds:.1f} s"

    env.filters.update(pretty=pretty, when=when, ago=ago)
    env.globals.update(read_write=read_write)
    return env


View = Callable[[Request], dict[str, Any]]


def create_app(
    data: ConsoleData,
    *,
    read_write: bool = False,
    lag_interval: float = 5.0,
    datasette: bool = True,
    token: str | None = None,
    hosts: Collection[str] = (),
) -> Starlette:
    """The console as an ASGI app over ``data`` (which it closes on shutdown).

    ``token``: the access token every request must carry (``None``: none); ``hosts``: the
    names, beyond IP addresses and ``localhost``, that the ``Host`` header may give
    (:class:`~eventlane.console.guard.Guard`)."""
    env = _templates(read_write)
    sampler = LagSampler(data.group_lags, interval=lag_interval)
    waker = Waker(data.wait_seq, data.wait)

    def html(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        csrf = getattr(request.state, "csrf_token", "")
        body = env.get_template(template).render(backend=data.backend(), csrf_token=csrf, **context)
        return HTMLResponse(body, status_code=status)

    def error_response(request: Request, exc: BaseException) -> Response:
        status = 404 if isinstance(exc, UnknownTopicError | AggregateNotFoundError) else 400
        if request.url.path.startswith("/api/"):
            return _Json({"error": str(exc)}, status_code=status)
        return html(request, "error.html", status=status, error=str(exc))

    def page(template: str, view: View) -> tuple[Callable[[Request], Awaitable[Response]], ...]:
        """The HTML endpoint and the JSON endpoint of one view function."""

        async def as_html(request: Request) -> Response:
            try:
                context = await run_in_threadpool(view, request)
            except BAD_REQUEST as exc:
                return error_response(request, exc)
            return html(request, template, **context)

        async def as_json(request: Request) -> Response:
            try:
                context = await run_in_threadpool(view, request)
            except BAD_REQUEST as exc:
                return error_response(request, exc)
            return _Json(context.get("api", context))

        return as_html, as_json

    def path_id(request: Request, name: str) -> int:
        """An id from the path (digits, by the route); beyond SQLite's range it names
        nothing: a 400, not an overflow."""
        value = int(request.path_params[name])
        if value > ID_MAX:
            raise ConfigError(f"no {name} {value}: ids are below 2**63")
        return value

    def q(request: Request, name: str) -> str | None:
        value = request.query_params.get(name)
        return value if value not in (None, "") else None

    def qint(request: Request, name: str, default: int) -> int:
        value = q(request, name)
        if value is None:
            return default
        if not value.lstrip("-").isdigit():
            raise FrameworkError(f"{name} must be an integer, got {value!r}")
        return int(value)

    def filters(request: Request) -> Filters:
        return Filters(
            key=q(request, "key"),
            header=q(request, "header"),
            text=q(request, "text"),
            jpath=q(request, "jpath"),
        )

    # ------------------------------------------------------------------ views
    def overview(_request: Request) -> dict[str, Any]:
        doc = data.overview()
        return {"api": doc, "o": doc}

    def topics(_request: Request) -> dict[str, Any]:
        rows = data.topics()
        return {"api": rows, "topics": rows}

    def topic(request: Request) -> dict[str, Any]:
        doc = data.topic(request.path_params["name"])
        return {"api": doc, "t": doc}

    def browse(request: Request) -> dict[str, Any]:
        name = data.topic_name(request.path_params["name"])
        key = q(request, "key")
        partition_text = q(request, "partition")
        if partition_text is None and key is not None:
            partition = data.partition_of(name, key)  # the key's own partition
        else:
            partition = qint(request, "partition", 0)
        page_ = data.browse(
            name,
            partition,
            start=q(request, "start") or "oldest",
            value=q(request, "value"),
            filters=filters(request),
            limit=qint(request, "limit", 100),
        )
        desc = data.topic(name, details=False)
        return {"api": page_, "page": page_, "t": desc, "args": dict(request.query_params)}

    def partition_or_all(request: Request) -> int | None:
        """``?partition=N`` (checked against the topic later), or ``None``: every one."""
        return None if q(request, "partition") is None else qint(request, "partition", 0)

    def tail_page(request: Request) -> dict[str, Any]:
        name = data.topic_name(request.path_params["name"])
        positions = data.tail_positions(name, {}, partition_or_all(request))
        desc = data.topic(name, details=False)
        args = dict(request.query_params)
        start = ",".join(f"{p}:{o}" for p, o in positions.items())
        return {"api": {"positions": positions}, "t": desc, "args": args, "start": start}

    def aggregate(request: Request) -> dict[str, Any]:
        type_name = q(request, "type")
        agg_id = q(request, "id")
        doc = None
        if type_name and agg_id:
            version = qint(request, "version", 0)
            doc = data.aggregate(type_name, agg_id, version or None, q(request, "as_of"))
        types = data.aggregate_types()
        return {"api": doc, "a": doc, "types": types, "args": dict(request.query_params)}

    def groups(request: Request) -> dict[str, Any]:
        rows = data.groups()
        state = q(request, "state")
        min_lag = qint(request, "min_lag", 0)
        rows = [r for r in rows if (state is None or r["state"] == state) and r["lag"] >= min_lag]
        sort = q(request, "sort") or "group"
        if sort not in ("group", "state", "lag", "lag_ms", "members"):
            raise FrameworkError(f"cannot sort groups by {sort!r}")
        rows.sort(key=lambda r: (r[sort], r["group"]), reverse=sort in ("lag", "lag_ms"))
        return {"api": rows, "groups": rows, "args": dict(request.query_params)}

    def group(request: Request) -> dict[str, Any]:
        doc = data.group(request.path_params["group"])
        doc["lag_history"] = sampler.history(doc["group"])
        return {"api": doc, "g": doc}

    def projectors(_request: Request) -> dict[str, Any]:
        rows = data.projectors()
        return {"api": rows, "projectors": rows, "readmodels": sorted(data.readmodel_files())}

    def projector(request: Request) -> dict[str, Any]:
        doc = data.projector(request.path_params["name"])
        letters = data.dead_letters(doc["projector"], q(request, "status") or "all")
        return {"api": doc, "p": doc, "letters": letters, "readmodels": data.readmodel_files()}

    def dead_letters(request: Request) -> dict[str, Any]:
        name = request.path_params["name"]
        rows = data.dead_letters(name, q(request, "status") or "all")
        return {"api": rows, "letters": rows, "name": name}

    def dead_letter(request: Request) -> dict[str, Any]:
        name = request.path_params["name"]
        doc = data.dead_letter(name, path_id(request, "letter"))
        return {"api": doc, "d": doc, "name": name}

    def schedules(request: Request) -> dict[str, Any]:
        state = q(request, "state") or "all"
        rows = data.schedules(state)
        return {"api": rows, "schedules": rows, "state": state, "has_app": data.app is not None}

    def rebuild_job(request: Request) -> dict[str, Any]:
        doc = data.job(path_id(request, "job")).to_json()
        return {"api": doc, "j": doc}

    views: list[tuple[str, str, View]] = [
        ("/", "overview.html", overview),
        ("/topics", "topics.html", topics),
        ("/topics/{name}", "topic.html", topic),
        ("/topics/{name}/records", "browse.html", browse),
        ("/topics/{name}/tail", "tail.html", tail_page),
        ("/aggregates", "aggregate.html", aggregate),
        ("/groups", "groups.html", groups),
        ("/groups/{group}", "group.html", group),
        ("/projectors", "projectors.html", projectors),
        ("/projectors/{name}", "projector.html", projector),
        ("/projectors/{name}/dead-letters", "dead_letters.html", dead_letters),
        ("/projectors/{name}/dead-letters/{letter:int}", "dead_letter.html", dead_letter),
        ("/schedules", "schedules.html", schedules),
        ("/rebuilds/{job:int}", "rebuild.html", rebuild_job),
    ]
    routes: list[BaseRoute] = []
    for path, template, view in views:
        as_html, as_json = page(template, view)
        routes.append(Route(path, as_html, methods=["GET"]))
        routes.append(Route("/api/overview" if path == "/" else "/api" + path, as_json))

    # ------------------------------------------------------------------ fragments & streams
    async def group_fragment(request: Request) -> Response:
        try:
            context = await run_in_threadpool(group, request)
        except BAD_REQUEST as exc:
            return error_response(request, exc)
        return html(request, "group_body.html", **context)

    async def session(request: Request) -> Response:
        """This session's CSRF token, for API clients (the pages carry it themselves)."""
        return _Json(
            {"csrf_token": getattr(request.state, "csrf_token", ""), "read_write": read_write}
        )

    async def export(request: Request) -> Response:
        try:
            name = data.topic_name(request.path_params["name"])
            partition = qint(request, "partition", 0)
            chunks = data.export(name, partition, filters(request))
            first = await run_in_threadpool(next, chunks, b"")
        except BAD_REQUEST as exc:
            return error_response(request, exc)

        async def body() -> AsyncIterator[bytes]:
            chunk: bytes | None = first
            while chunk is not None:
                yield chunk
                chunk = await run_in_threadpool(next, chunks, None)

        filename = f"{name}-{partition}.ndjson"
        return StreamingResponse(
            body(),
            media_type="application/x-ndjson",
            headers={"content-disposition": f'attachment; filename="{filename}"'},
        )

    async def tail_stream(request: Request) -> Response:
        try:
            name = data.topic_name(request.path_params["name"])
            wanted = filters(request)
            positions = await run_in_threadpool(
                data.tail_positions, name, _positions(q(request, "from")), partition_or_all(request)
            )
        except BAD_REQUEST as exc:
            return error_response(request, exc)
        row = env.get_template("record_row.html")
        as_json = q(request, "format") == "json"

        async def events() -> AsyncIterator[dict[str, str]]:
            """Read what is new (a worker thread), else await the waker (no thread)."""
            while True:
                seen = data.wait_seq()
                try:
                    records = await run_in_threadpool(data.read_new, name, positions, wanted)
                except BAD_REQUEST as exc:  # the topic went away under the tail
                    yield {"event": "tail-error", "data": str(exc)}
                    return
                for r in records:
                    body = orjson.dumps(r).decode() if as_json else row.render(r=r)
                    yield {"event": "record", "data": body, "id": f"{r['partition']}:{r['offset']}"}
                if not records:
                    await waker.wait(seen)

        return EventSourceResponse(events(), ping=15)

    async def rebuild_stream(request: Request) -> Response:
        try:
            job = data.job(path_id(request, "job"))
        except BAD_REQUEST as exc:
            return error_response(request, exc)
        bar = env.get_template("rebuild_progress.html")

        async def events() -> AsyncIterator[dict[str, str]]:
            last = None
            while not await request.is_disconnected():
                doc = job.to_json()
                if doc != last:
                    yield {"event": "progress", "data": bar.render(j=doc)}
                    last = doc
                if doc["state"] != "running":
                    yield {"event": "done", "data": doc["state"]}
                    return
                await asyncio.sleep(0.25)

        return EventSourceResponse(events(), ping=15)

    # ------------------------------------------------------------------ state changes (POST)
    async def form(request: Request) -> dict[str, str]:
        body = await request.body()
        if request.headers.get("content-type", "").startswith("application/json"):
            try:
                doc = orjson.loads(body or b"{}")
            except orjson.JSONDecodeError as exc:
                raise FrameworkError(f"request body is not JSON: {exc}") from None
            if not isinstance(doc, dict):
                raise FrameworkError("request body must be a JSON object")
            return {k: "" if v is None else str(v) for k, v in doc.items()}
        return {k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}

    def wants_html(request: Request) -> bool:
        return request.headers.get("hx-request") == "true"

    async def change(
        request: Request,
        work: Callable[[dict[str, str]], dict[str, Any]],
        template: str,
        status: int = 200,
    ) -> Response:
        """A state change: JSON for API clients, an htmx fragment (``r``) for the pages."""
        try:
            args = await form(request)
            doc = await run_in_threadpool(work, args)
        except BAD_REQUEST as exc:
            if wants_html(request):  # htmx swaps only 2xx answers in
                return html(request, "error_fragment.html", error=str(exc))
            return error_response(request, exc)
        if wants_html(request):
            return html(request, template, r=doc, args=args, stream=True)
        return _Json(doc, status_code=status)

    def truthy(text: str | None) -> bool:
        return (text or "").lower() in ("1", "true", "yes", "on")

    async def reset_offsets(request: Request) -> Response:
        group_id = request.path_params["group"]

        def work(args: dict[str, str]) -> dict[str, Any]:
            execute = truthy(args.get("execute"))
            rows = data.reset_offsets(
                group_id,
                args.get("topic", ""),
                args.get("mode", ""),
                args.get("value") or None,
                execute=execute,
            )
            return {"group": group_id, "executed": execute, "offsets": rows}

        return await change(request, work, "reset_result.html")

    async def retry(request: Request) -> Response:
        def work(args: dict[str, str]) -> dict[str, Any]:
            ids = [int(x) for x in args.get("ids", "").replace(",", " ").split()]
            return data.retry_dead_letters(request.path_params["name"], ids)

        return await change(request, work, "retry_result.html")

    async def start_rebuild(request: Request) -> Response:
        def work(args: dict[str, str]) -> dict[str, Any]:
            engine = args.get("engine") or "local"
            return data.start_rebuild(request.path_params["name"], engine).to_json()

        return await change(request, work, "rebuild_progress.html", status=202)

    routes += [
        Route("/groups/{group}/body", group_fragment, methods=["GET"]),
        Route("/api/session", session, methods=["GET"]),
        Route("/topics/{name}/export.ndjson", export, methods=["GET"]),
        Route("/topics/{name}/tail/stream", tail_stream, methods=["GET"]),
        Route("/rebuilds/{job:int}/stream", rebuild_stream, methods=["GET"]),
        Route("/api/groups/{group}/reset-offsets", reset_offsets, methods=["POST"]),
        Route("/api/projectors/{name}/dead-letters/retry", retry, methods=["POST"]),
        Route("/api/projectors/{name}/rebuild", start_rebuild, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]
    files = data.readmodel_files()
    if datasette and files:
        routes.append(Mount("/readmodels", app=_datasette(files, read_write=read_write)))

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        sampler.start()
        waker.start()
        try:
            yield
        finally:
            waker.stop()
            sampler.stop()
            data.close()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(Guard, read_write=read_write, token=token, hosts=hosts)
    app.state.sampler = sampler
    app.state.waker = waker
    return app


def _positions(text: str | None) -> dict[int, int]:
    """``"0:12,1:40"`` -> ``{0: 12, 1: 40}`` (where a live tail starts)."""
    out: dict[int, int] = {}
    for item in (text or "").split(","):
        if item.strip():
            p, _, o = item.partition(":")
            out[int(p)] = int(o)
    return out


def _datasette(files: dict[str, Path], *, read_write: bool) -> ASGIApp:
    """Datasette over the read-model files, under ``/readmodels/``; SQL only if read-write.

    Paths are tidied before Datasette sees them: an empty segment (``//evil.example``) is a
    404, and a trailing slash is redirected to the same path without it, under the mount
    (Datasette's own redirect forgets the mount: ``/readmodels/x/`` went to ``/x``)."""
    # heavy: imported only when mounted; datasette.app first (it registers the default
    # plugins, datasette.handle_exception among them, which must not be half-imported then)
    import datasette.app  # noqa: PLC0415
    import datasette.handle_exception  # noqa: PLC0415

    # Datasette's default error handler prints every error's traceback, with its local
    # variables (read-model rows: personal data), on standard error through rich whenever
    # rich is importable (it is: the CLI uses it); outside an ``except`` block rich raises
    # instead, turning a 404 into a 500. Without rich it answers the same pages, silently.
    datasette.handle_exception.rich = None
    ds = datasette.app.Datasette(
        files=[str(p) for p in files.values()],
        settings={"base_url": "/readmodels/", "default_allow_sql": read_write},
    )
    inner: ASGIApp = ds.app()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        # Datasette expects what a proxy hands it: the path without the mount prefix (it
        # adds base_url to the links it makes itself).
        if scope["type"] == "http":
            root = scope.get("root_path", "")
            path = scope["path"].removeprefix(root) or "/"
            if "//" in path:
                await _Json({"error": "no such read-model page"}, status_code=404)(
                    scope, receive, send
                )
                return
            if path != "/" and path.endswith("/"):
                query = scope.get("query_string", b"").decode("latin-1")
                where = root + path.rstrip("/") + ("?" + query if query else "")
                await RedirectResponse(where, status_code=308)(scope, receive, send)
                return
            raw = scope.get("raw_path") or scope["path"].encode()
            scope = {
                **scope,
                "root_path": "",
                "path": path,
                "raw_path": raw.removeprefix(root.encode()) or b"/",
            }
        await inner(scope, receive, send)

    return app
