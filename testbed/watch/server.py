"""`testbed watch`'s web server: aiohttp, the page and its scripts from the package, server-sent events.

Routes:

    GET /                 the page (static/index.html)
    GET /static/NAME      its script, style and the bundled uPlot (no CDN: labs are often offline)
    GET /api/snapshot     everything the page shows, as JSON (:meth:`RunFeed.snapshot`)
    GET /api/events       server-sent events: ``snapshot`` once, then a ``delta`` per change

One task polls the run directory every ``poll_s`` (in a worker thread: reading the files and
accounting ε must not hold up the page) and sends each delta to every open page. A page that falls
behind is dropped; its EventSource reconnects and starts again from a snapshot. There are no control
actions: nothing here writes to the run.

Every request is checked before it is served: the API takes no query parameters (any is a 400
naming it), other methods than GET and HEAD are a 405, unknown paths a 404, and at most
:data:`MAX_PAGES` event streams are open at once (a 503 past that). A page closed mid-stream is
normal (a debug line); anything that fails while serving is one warning line and a 500, never a
traceback in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from pathlib import Path
from typing import Any, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp_sse import sse_response

from testbed.watch.feed import RunFeed

log = logging.getLogger(__name__)

STATIC = Path(__file__).with_name("static")
#: Deltas a page may have unsent before it is dropped (it reconnects and takes a snapshot).
BACKLOG = 32
#: Seconds between checks that an idle page is still connected (aiohttp-sse pings it every 15 s).
IDLE_CHECK_S = 5.0
#: Event streams open at once: each holds up to BACKLOG deltas.
MAX_PAGES = 64


def _json(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), allow_nan=False)


class WatchApp:
    """The watch page of one run directory.

    Args:
        feed: the run's :class:`RunFeed`.
        poll_s: seconds between reads of the run's files.
        on_config: called once with the run's config as soon as config.toml has been read (in a
            worker thread), e.g. to follow the MQTT status topics.
        on_stop: called (no arguments) when the server stops.
    """

    def __init__(self, feed: RunFeed, poll_s: float = 0.5, on_config: Callable[[Any], None] | None = None,
                 on_stop: Callable[[], None] | None = None):
        self.feed = feed
        self.poll_s = poll_s
        self._pages: set[asyncio.Queue] = set()
        self._lock = asyncio.Lock()
        self._on_config, self._on_stop = on_config, on_stop
        self.app = web.Application(middlewares=[_checked], handler_args={"logger": _OneLineLog(log)})
        self.app.add_routes([
            web.get("/", self._index),
            web.get("/api/snapshot", self._snapshot),
            web.get("/api/events", self._events),
            web.static("/static", STATIC),
        ])
        self.app.on_startup.append(self._startup)
        self.app.on_shutdown.append(self._shutdown)

    async def _feed(self, method: Callable[[], Any]) -> Any:
        async with self._lock:  # one reader of the feed at a time: poll and snapshot share its state
            return await asyncio.to_thread(method)

    async def _startup(self, app: web.Application) -> None:
        self._poller = asyncio.create_task(self._poll_forever())

    async def _shutdown(self, app: web.Application) -> None:
        self._poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._poller
        for page in list(self._pages):
            page.put_nowait(None)
        if self._on_stop is not None:
            await asyncio.to_thread(self._on_stop)

    async def _poll_forever(self) -> None:
        said: str | None = None  # the failure last logged: one that repeats every poll is logged once
        while True:
            try:
                await self._poll_once()
                said = None
            except Exception as exc:  # the feed checks what it reads; this is a bug, not a file
                what = f"reading the run failed: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
                if what != said:
                    log.warning("%s: %s", self.feed.run_dir, what)
                    said = what
                with contextlib.suppress(Exception):  # on the pages too, not only here, if it can be
                    self._send(await self._feed(lambda: self.feed.reading_failed(what)))
            await asyncio.sleep(self.poll_s)

    async def _poll_once(self) -> None:
        delta = await self._feed(self.feed.poll)
        if self._on_config is not None and self.feed.config is not None:
            on_config, self._on_config = self._on_config, None
            await asyncio.to_thread(on_config, self.feed.config)
        if delta is not None:
            self._send(delta)

    def _send(self, delta: dict) -> None:
        """Queue a delta for every open page; a page too far behind is closed (it reconnects)."""
        item = (delta["version"], _json(delta))
        for page in list(self._pages):
            try:
                page.put_nowait(item)
            except asyncio.QueueFull:
                self._pages.discard(page)
                page.get_nowait()
                page.put_nowait(None)  # tells the page's handler to close it

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html")

    async def _snapshot(self, request: web.Request) -> web.Response:
        return web.Response(text=_json(await self._feed(self.feed.snapshot)), content_type="application/json")

    async def _events(self, request: web.Request) -> web.StreamResponse:
        if len(self._pages) >= MAX_PAGES:
            raise web.HTTPServiceUnavailable(text=f"{MAX_PAGES} pages already follow this run; close one\n")
        page: asyncio.Queue = asyncio.Queue(maxsize=BACKLOG)
        self._pages.add(page)  # before the snapshot: a delta after it is queued, older ones are skipped by version
        try:
            async with sse_response(request) as resp:
                snapshot = await self._feed(self.feed.snapshot)
                await resp.send(_json(snapshot), event="snapshot")
                while resp.is_connected():  # false once a ping failed: the page is gone
                    try:
                        item = await asyncio.wait_for(page.get(), timeout=IDLE_CHECK_S)
                    except asyncio.TimeoutError:
                        continue  # a finished run sends nothing: look again whether the page is there
                    if item is None:
                        break
                    version, text = item
                    if version > snapshot["version"]:  # a poll between joining and the snapshot is in it
                        await resp.send(text, event="delta")
            return resp
        except ConnectionResetError:  # the page was closed: its stream ends, nothing went wrong
            log.debug("a page of %s closed its event stream", self.feed.run_dir)
            return web.Response()  # never sent: the connection is gone
        finally:
            self._pages.discard(page)


class _OneLineLog(logging.LoggerAdapter):
    """aiohttp's request-handling log: what it logs with a traceback (a request line or header too
    long, a malformed request, a failure past the middleware) is one line without it; a malformed
    request (its 400 says why) or a client gone mid-answer is the client's doing, so a debug line."""

    def exception(self, msg: object, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        level = logging.DEBUG if isinstance(exc, (HttpProcessingError, ConnectionResetError)) else logging.WARNING
        text = " ".join(str(exc).split())[:200] if exc is not None else ""
        self.log(level, "%s: %s%s", str(msg) % args if args else msg, type(exc).__name__ if exc else "",
                 f": {text}" if text else "")

    def debug(self, msg: object, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("exc_info", None)
        self.log(logging.DEBUG, msg, *args, **kwargs)


@web.middleware
async def _checked(request: web.Request, handler: Callable) -> web.StreamResponse:
    """Refuses a query string on the API (it declares no parameters) in one line, and turns any
    failure while serving into one warning line and a 500 (a closed connection into a debug line)."""
    if request.path.startswith("/api/") and request.query_string:
        names = ", ".join(sorted({repr(k[:40]) for k in request.query}))[:200] or repr(request.query_string[:40])
        raise web.HTTPBadRequest(text=f"{request.path} takes no query parameters, got {names}\n")
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except ConnectionResetError:
        log.debug("%s %s: the client went away", request.method, request.path)
        raise
    except Exception as exc:
        log.warning("%s %s: %s: %s", request.method, request.path, type(exc).__name__, exc)
        raise web.HTTPInternalServerError(text=f"{type(exc).__name__}: {exc}"[:300] + "\n") from None


def serve(run_dir: Path, host: str = "127.0.0.1", port: int = 8765, poll_s: float = 0.5,
          follow_mqtt: bool = True, print_url: Callable[[str], None] = print) -> None:
    """Serve the watch page of ``run_dir`` until interrupted (Ctrl-C, SIGTERM).

    Over MQTT (``run.mode = "mqtt"`` with a ``mqtt.broker_url``; an embedded broker lives and dies
    inside the run) it also follows the nodes' status topics, once config.toml is there.
    """
    feed = RunFeed(run_dir)
    listener: list = []

    def follow(config: Any) -> None:
        if not follow_mqtt or config.run.mode != "mqtt" or config.mqtt.broker_url is None:
            return
        from testbed.watch.status import StatusListener

        try:
            listener.append(StatusListener(config.mqtt, feed.node_status, feed.coordinator_status,
                                           feed.status_malformed).start())
        except Exception as exc:  # the files still show the run: say why the status topics do not
            log.warning("not following the status topics of %s: %s", config.mqtt.broker_url, exc)

    def unfollow() -> None:
        for item in listener:
            item.close()

    app = WatchApp(feed, poll_s=poll_s, on_config=follow, on_stop=unfollow)
    web.run_app(app.app, host=host, port=port, print=lambda _: print_url(f"http://{host}:{port}/"),
                handle_signals=True, shutdown_timeout=1.0)
