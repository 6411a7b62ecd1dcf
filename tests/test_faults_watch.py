"""`testbed watch` at its trust boundary, by example: every run file damaged in each way (garbage,
a field out of range, cut mid-line, a line of megabytes, deleted, replaced, shrunk), status payloads
that are not the declared ones, and HTTP requests the page never makes. Each: a visible error naming
the file and what is wrong, what is valid still shown, nothing of the damaged row used, and no
traceback in the log. The helpers here (a real run made once, a server on loopback) serve
test_trust_watch.py's property-based tests too."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="the 'watch' extra (aiohttp, aiohttp-sse) is not installed")

from aiohttp import web  # noqa: E402

from testbed.assembly.config import load_config_text  # noqa: E402
from testbed.ledger.events import GaussianEvent  # noqa: E402
from testbed.ledger.files import LedgerWriter  # noqa: E402
from testbed.orchestration.runner import run_experiment  # noqa: E402
from testbed.reports.summary_file import summary_digest  # noqa: E402
from testbed.watch import lines  # noqa: E402
from testbed.watch.feed import RunFeed  # noqa: E402
from testbed.watch.server import IDLE_CHECK_S, MAX_PAGES, WatchApp  # noqa: E402
from testbed.watch.status import StatusRouter  # noqa: E402

RUN_FILES = ("config.toml", "metrics.csv", "ledger.csv", "summary.json")
_REAL: dict[str, Path] = {}


@pytest.fixture
def real_run(small_config_text, tmp_path_factory) -> Path:
    """A finished sim run of the small experiment, made once for the session (read, never written)."""
    if "run" not in _REAL:
        out = tmp_path_factory.mktemp("real") / "run"
        _REAL["run"] = run_experiment(load_config_text(small_config_text), out_dir=out, quiet=True).run_dir
    return _REAL["run"]


def copy_run(src: Path, dst: Path, files=RUN_FILES) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in files:
        shutil.copyfile(src / name, dst / name)
    return dst


def shown(feed: RunFeed) -> dict:
    """The feed's snapshot after reading everything there is, as the page gets it (strict JSON)."""
    for _ in range(3):
        feed.poll()
    return json.loads(json.dumps(feed.snapshot(), allow_nan=False))


def data_rows(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def without_line(run: Path, dst: Path, name: str, index: int) -> dict:
    """What the page shows of ``run`` with data line ``index`` (0: the first after the header) of
    ``name`` removed: the oracle for a line that must be used for nothing."""
    copy_run(run, dst)
    rows = data_rows(run / name)
    (dst / name).write_bytes(b"".join(rows[:1 + index] + rows[2 + index:]))
    return shown(RunFeed(dst))


def same_data(a: dict, b: dict) -> bool:
    """Whether two snapshots show the same metrics and nodes (their run info may differ)."""
    return a["metrics"] == b["metrics"] and a["nodes"] == b["nodes"]


def no_traceback(caplog) -> None:
    """Nothing at WARNING or above carries a traceback, and nothing is an ERROR."""
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or (r.levelno >= logging.WARNING and r.exc_info)]
    assert not bad, [r.getMessage() for r in bad]


POSITIONS = {"first": 0, "middle": 1, "last": -1}


def _line_index(run: Path, name: str, position: str) -> int:
    count = len(data_rows(run / name)) - 1
    return POSITIONS[position] % count if position != "middle" else count // 2


# ---------------------------------------------------------------- the logs: a line of garbage

@pytest.mark.parametrize("name", ["metrics.csv", "ledger.csv"])
@pytest.mark.parametrize("position", list(POSITIONS))
@pytest.mark.parametrize("garbage", [b"\xff\xfe not UTF-8 \x00\n", b'"an open quote,1,2\n', b"1,2,3\n"])
def test_a_garbage_line_is_named_and_used_for_nothing(real_run, tmp_path, caplog, name, position, garbage):
    index = _line_index(real_run, name, position)
    expected = without_line(real_run, tmp_path / "oracle", name, index)
    run = copy_run(real_run, tmp_path / "run")
    rows = data_rows(run / name)
    rows[1 + index] = garbage
    (run / name).write_bytes(b"".join(rows))
    snap = shown(RunFeed(run))
    assert snap["run"]["errors"][name].startswith(f"line {index + 2}: ")
    assert name in snap["run"]["error"] and "\n" not in snap["run"]["error"]
    assert same_data(snap, expected)
    no_traceback(caplog)


# ---------------------------------------------------------------- the logs: a field out of range

@pytest.mark.parametrize("name,column,value,words", [
    ("metrics.csv", "wall_s", "1e308", "wall_s must be in 0..1e+30"),
    ("metrics.csv", "round", "nan", "round must be in"),
    ("metrics.csv", "stragglers", str(2**70), "stragglers must be a whole number in 0..4"),
    ("metrics.csv", "test_accuracy", "1.5", "test_accuracy must be in 0..1"),
    ("metrics.csv", "cost_units", "-1", "cost_units must be in"),
    ("metrics.csv", "round", "5", "round 5 is past the run's 4 rounds"),
    ("ledger.csv", "energy_j", "1e308", "energy_j must be <= 8.64e+07"),  # the ledger's physical bound
    ("ledger.csv", "node", str(2**70), "node"),
    ("ledger.csv", "node", "7", "node 7 is not one of the run's 4 nodes"),
    ("ledger.csv", "round", "99", "round 99 is past the run's 4 rounds"),
    ("ledger.csv", "cost_units", "nan", "cost_units"),
])
def test_a_field_out_of_range_is_named_and_its_row_used_for_nothing(real_run, tmp_path, caplog, name, column,
                                                                     value, words):
    rows = data_rows(real_run / name)
    header = rows[0].decode().strip().split(",")
    index = _line_index(real_run, name, "middle")
    # A compute event of the ledger has energy_j; every row of metrics has every column.
    while name == "ledger.csv" and not rows[1 + index].startswith(b"compute"):
        index += 1
    expected = without_line(real_run, tmp_path / "oracle", name, index)
    run = copy_run(real_run, tmp_path / "run")
    cells = rows[1 + index].decode().rstrip("\r\n").split(",")
    cells[header.index(column)] = value
    rows[1 + index] = (",".join(cells) + "\r\n").encode()
    (run / name).write_bytes(b"".join(rows))
    snap = shown(RunFeed(run))
    assert snap["run"]["errors"][name].startswith(f"line {index + 2}: ") and words in snap["run"]["errors"][name]
    if not (name == "metrics.csv" and index + 1 < len(rows) - 1):
        assert same_data(snap, expected)
    else:  # a refused metrics row: the rows after it still follow the one before it
        assert snap["metrics"] == expected["metrics"]
    no_traceback(caplog)


# ---------------------------------------------------------------- the logs: cut mid-line

@pytest.mark.parametrize("name", ["metrics.csv", "ledger.csv"])
@pytest.mark.parametrize("position", list(POSITIONS))
def test_a_line_cut_short_waits_for_its_end_then_counts(real_run, tmp_path, caplog, name, position):
    """As a live run leaves its files: the rows before the cut are shown, the cut one is not (and
    no error while the run writes); once the line is ended, all of it is shown as in the finished run."""
    whole = shown(RunFeed(real_run))
    run = copy_run(real_run, tmp_path / "run", files=("config.toml", "metrics.csv", "ledger.csv"))
    rows = data_rows(real_run / name)
    index = _line_index(real_run, name, position)
    cut = sum(len(r) for r in rows[:1 + index]) + len(rows[1 + index]) // 2
    (run / name).write_bytes(b"".join(rows)[:cut])
    feed = RunFeed(run)
    partial = shown(feed)
    assert name not in partial["run"]["errors"]
    if name == "metrics.csv":
        assert partial["metrics"] == whole["metrics"][:index]
    with open(run / name, "ab") as f:
        f.write(b"".join(rows)[cut:])
    shutil.copyfile(real_run / "summary.json", run / "summary.json")
    done = shown(feed)
    assert same_data(done, whole) and done["run"]["errors"] == {}
    no_traceback(caplog)


@pytest.mark.parametrize("name", ["metrics.csv", "ledger.csv"])
def test_a_last_line_cut_short_in_a_finished_run_is_said(real_run, tmp_path, name):
    run = copy_run(real_run, tmp_path / "run")
    with open(run / name, "ab") as f:
        f.write(b"4,5,0.1")
    snap = shown(RunFeed(run))
    assert snap["run"]["errors"][name] == "its last line is cut short (7 bytes), not used"
    assert same_data(snap, shown(RunFeed(real_run)))


# ---------------------------------------------------------------- the logs: lines of megabytes

@pytest.mark.parametrize("name", ["metrics.csv", "ledger.csv"])
@pytest.mark.parametrize("size_bytes,ended", [(3 * 1024 * 1024, True), (lines.MAX_LINE_BYTES + 1, True),
                                              (5 * 1024 * 1024, False)])
def test_a_line_of_megabytes_is_skipped_and_never_held(real_run, tmp_path, caplog, name, size_bytes, ended):
    index = _line_index(real_run, name, "middle")
    expected = without_line(real_run, tmp_path / "oracle", name, index)
    run = copy_run(real_run, tmp_path / "run")
    rows = data_rows(run / name)
    rows[1 + index] = b"9" * size_bytes + (b"\n" if ended else b"")
    if not ended:  # the file ends inside the line: what follows it never comes
        rows = rows[:2 + index]
    (run / name).write_bytes(b"".join(rows))
    feed = RunFeed(run)
    snap = shown(feed)
    assert f"line {index + 2}: longer than {lines.MAX_LINE_BYTES} bytes, skipped" in snap["run"]["errors"][name]
    tail = feed._metrics_tail if name == "metrics.csv" else feed._ledger_tail
    assert tail.pending_bytes <= lines.MAX_LINE_BYTES
    if ended:
        assert same_data(snap, expected)
    no_traceback(caplog)


# ---------------------------------------------------------------- a file deleted, replaced, shrunk

@pytest.mark.parametrize("name", RUN_FILES)
def test_a_file_deleted_while_watched_is_said(real_run, tmp_path, caplog, name):
    run = copy_run(real_run, tmp_path / "run")
    feed = RunFeed(run)
    before = shown(feed)
    (run / name).unlink()
    after = shown(feed)
    assert "deleted while watched" in after["run"]["errors"][name]
    if name == "summary.json":  # the run's end is no longer known: not shown as completed
        assert after["run"]["status"] != "completed" and before["run"]["status"] == "completed"
    else:
        assert same_data(after, before)
    no_traceback(caplog)


@pytest.mark.parametrize("how", ["shrunk", "replaced", "rewritten in place"])
@pytest.mark.parametrize("name", ["metrics.csv", "ledger.csv", "config.toml"])
def test_a_file_of_another_run_resets_the_page(real_run, tmp_path, small_config_text, name, how):
    """A new run in the same folder: the page starts again from a snapshot of the new files."""
    other = run_experiment(load_config_text(small_config_text.replace("seed = 1", "seed = 7")
                                            .replace("num_nodes = 4", "num_nodes = 3")),
                           out_dir=tmp_path / "other", quiet=True).run_dir
    run = copy_run(real_run, tmp_path / "run")
    feed = RunFeed(run)
    shown(feed)
    new = (other / name).read_bytes()
    if how == "shrunk":
        new = new[: len(new) // 2]
        new = new[: new.rfind(b"\n") + 1]
    if how == "replaced":
        (tmp_path / "new").write_bytes(new)
        os.replace(tmp_path / "new", run / name)
    else:
        with open(run / name, "r+b") as f:
            f.write(new)
            f.truncate()
    assert feed.poll()["reset"] is True
    snap = shown(feed)
    assert snap["version"] >= 1
    oracle = copy_run(real_run, tmp_path / "oracle")
    (oracle / name).write_bytes(new)
    assert same_data(snap, shown(RunFeed(oracle)))
    if name == "config.toml" and how != "shrunk":  # the other run's 3 nodes: node 3's rows are not its
        assert len(snap["nodes"]) == 3
        assert "node 3 is not one of the run's 3 nodes" in snap["run"]["errors"]["ledger.csv"]
    elif name != "config.toml":
        assert snap["run"]["errors"] == {}


# ---------------------------------------------------------------- summary.json

def _signed(summary) -> str:
    if isinstance(summary, dict):
        summary = {k: v for k, v in summary.items() if k != "sha256"}
        summary["sha256"] = summary_digest(summary)
    return json.dumps(summary)


@pytest.mark.parametrize("damage,words", [
    (lambda s: "[1, 2, 3]", "damaged: not a JSON object"),
    (lambda s: '"completed"', "damaged: not a JSON object"),
    (lambda s: "[" * 20_000 + "]" * 20_000, "damaged: nested too deeply"),
    (lambda s: "{" + '"a": 1,' * 10, "damaged: not JSON"),
    (lambda s: _signed({**s, "rounds": "four"}), "rounds must be a count"),
    (lambda s: _signed({**s, "rounds": 2**70}), "rounds must be a count"),
    (lambda s: _signed({**s, "status": ["completed"]}), "status must be one of"),
    (lambda s: _signed({**s, "wall_s": "1"}), "wall_s must be a number"),
    (lambda s: _signed({**s, "stopped": {"node": -1, "budget": "epsilon", "would_be": 1, "limit": 1}}),
     "stopped.node"),
    (lambda s: _signed({**s, "stopped": {"node": 0, "budget": "epsilon", "would_be": "x", "limit": 1}}),
     "would_be must be a number"),
    (lambda s: _signed({**s, "failure": {"a": 1}}), "failure must be a string"),
    (lambda s: json.dumps({**s, "rounds": 3}), "does not match its sha256"),
    (lambda s: " " * (3 * 1024 * 1024), "not read"),
])
def test_a_damaged_summary_is_named_and_not_shown_as_the_runs(real_run, tmp_path, caplog, damage, words):
    run = copy_run(real_run, tmp_path / "run")
    feed = RunFeed(run)
    assert shown(feed)["run"]["status"] == "completed"
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(damage(summary))
    snap = shown(feed)
    assert words in snap["run"]["errors"]["summary.json"] and feed.summary is None
    assert snap["run"]["status"] != "completed"
    (run / "summary.json").write_text(_signed(summary))  # a good one again: shown, the error gone
    snap = shown(feed)
    assert snap["run"]["status"] == "completed" and "summary.json" not in snap["run"]["errors"]
    no_traceback(caplog)


# ---------------------------------------------------------------- config.toml

@pytest.mark.parametrize("text,words", [
    (b"\xff\xfe garbage", "not UTF-8 text (byte 0)"),
    (b"[run]\nname = ", "not valid TOML"),
    (b"a = " + b"[" * 50_000 + b"]" * 50_000, "nested too deep"),
    (b"# " + b"x" * (2 * 1024 * 1024), "more than an experiment file holds"),
    (b'[run]\nalgorithm = "fedavg"\nseed = 1\n[data]\nnum_nodes = 1000000000\n', "more than the page follows"),
    (b"[data]\nnum_nodes = 4\n", "lacks run.algorithm: not the config.toml a run writes"),
])
def test_a_damaged_config_is_named_and_nothing_read_against_it(real_run, tmp_path, caplog, text, words):
    run = copy_run(real_run, tmp_path / "run", files=("metrics.csv", "ledger.csv"))
    (run / "config.toml").write_bytes(text)
    snap = shown(RunFeed(run))
    assert words in snap["run"]["errors"]["config.toml"]
    assert snap["nodes"] == [] and snap["run"]["status"] == "waiting"
    no_traceback(caplog)


# ---------------------------------------------------------------- MQTT status payloads

class _Recorder:
    """A feed and the router of a StatusListener's messages into it, as `testbed watch` wires them
    (no broker: the messages are handed to the router)."""

    def __init__(self, feed: RunFeed):
        self.feed = feed
        self.listener = StatusRouter(feed.node_status, feed.coordinator_status, feed.status_malformed)


@pytest.mark.parametrize("payload", [b"", b"garbage", b"OFFLINE", b"offline\x00", b"online " * 10_000])
@pytest.mark.parametrize("kind", ["status", "coord"])
def test_a_status_payload_other_than_online_or_offline_is_dropped_and_counted(real_run, tmp_path, caplog,
                                                                              payload, kind):
    rec = _Recorder(RunFeed(copy_run(real_run, tmp_path / "run")))
    before = shown(rec.feed)
    rec.listener.handle(kind, "1" if kind == "status" else None, payload)
    rec.listener.handle(kind, "1" if kind == "status" else None, payload)
    after = shown(rec.feed)
    assert same_data(after, before) and after["run"]["coordinator"] is None
    assert after["run"]["status_dropped"] == rec.listener.dropped == 2
    assert "is neither online nor offline" in after["run"]["status_dropped_last"]
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1  # one line, not a flood
    rec.listener.handle(kind, "1" if kind == "status" else None, b"offline")  # the declared value counts
    after = shown(rec.feed)
    if kind == "status":
        assert [n["state"] for n in after["nodes"] if n["id"] == 1] == ["offline"]
    else:
        assert after["run"]["coordinator"] == "offline"
    no_traceback(caplog)


@pytest.mark.parametrize("node", ["4", "-1", str(2**70), "channel", "x"])
def test_a_status_of_a_node_not_in_the_run_changes_nothing(real_run, tmp_path, node):
    rec = _Recorder(RunFeed(copy_run(real_run, tmp_path / "run")))
    before = shown(rec.feed)
    rec.listener.handle("status", node, b"offline")
    after = shown(rec.feed)
    assert same_data(after, before)
    assert after["run"]["status_dropped"] == (0 if node == "channel" else 1)


# ---------------------------------------------------------------- HTTP

@contextlib.contextmanager
def serving(run_dir: Path, poll_s: float = 0.05):
    """The watch server of ``run_dir`` on a free loopback port, in a thread: (port, app)."""
    loop = asyncio.new_event_loop()
    app = WatchApp(RunFeed(run_dir), poll_s=poll_s)
    runner = web.AppRunner(app.app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield runner.addresses[0][1], app
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def http(port: int, request: bytes, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """Send raw bytes, read the answer until the server closes: (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        with contextlib.suppress(OSError):  # the server may answer and close before reading it all
            s.sendall(request)
        data = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    return status, body


def get(port: int, target: str, method: str = "GET", headers: str = "", body: bytes = b"") -> tuple[int, bytes]:
    return http(port, f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n".encode() + body)


@pytest.mark.parametrize("target,status,words", [
    ("/api/snapshot?page=-1", 400, b"takes no query parameters, got 'page'"),
    ("/api/snapshot?sort=nan&node=1e308", 400, b"'node', 'sort'"),
    ("/api/events?x=" + "9" * 5000, 400, b"'x'"),
    ("/nothing/here", 404, b"Not Found"),
    ("/static/../server.py", 404, b"Not Found"),
    ("/static/%2e%2e/feed.py", 404, b"Not Found"),
    ("/?page=NaN", 200, b"<!doctype html>"),
])
def test_requests_the_page_never_makes_get_a_one_line_4xx(real_run, caplog, target, status, words):
    caplog.set_level(logging.DEBUG)
    with serving(real_run) as (port, _):
        got, body = get(port, target)
    assert got == status and words in body
    if status >= 400:
        assert body.count(b"\n") <= 1
    no_traceback(caplog)


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
@pytest.mark.parametrize("target", ["/", "/api/snapshot", "/api/events"])
def test_methods_other_than_get_are_refused(real_run, caplog, method, target):
    with serving(real_run) as (port, _):
        got, _ = get(port, target, method, headers="Content-Length: 5\r\n", body=b"hello")
    assert got == 405
    no_traceback(caplog)


@pytest.mark.parametrize("header", ["X-Big: " + "a" * 100_000, "Cookie: " + "; ".join(f"c{i}=1" for i in range(5000))])
def test_huge_headers_are_refused(real_run, caplog, header):
    with serving(real_run) as (port, _):
        got, _ = get(port, "/api/snapshot", headers=header + "\r\n")
        assert got in (400, 431)
        assert get(port, "/api/snapshot")[0] == 200  # and the server goes on
    no_traceback(caplog)


def _open_stream(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"GET /api/events HTTP/1.1\r\nHost: x\r\n\r\n")
    assert s.recv(65536).startswith(b"HTTP/1.1 200")
    return s


@pytest.mark.parametrize("when", ["before the snapshot", "between deltas"])
def test_a_closed_tab_is_not_an_error(real_run, tmp_path, caplog, when):
    caplog.set_level(logging.DEBUG)
    run = copy_run(real_run, tmp_path / "run")
    with serving(run) as (port, app):
        for i in range(5):
            if when == "before the snapshot":
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    s.sendall(b"GET /api/events HTTP/1.1\r\nHost: x\r\n\r\n")
            else:
                s = _open_stream(port)
                s.close()
                with open(run / "ledger.csv", "ab") as f:  # a delta for the closed page
                    f.write(b"privacy,0,3,garbage\r\n")
        # A finished run sends no delta: an idle page's handler sees its connection gone at its
        # next check, IDLE_CHECK_S after its last (it had waited 5 s, as long as one check: under
        # load the check came after it).
        deadline = time.monotonic() + 3 * IDLE_CHECK_S
        while app._pages and time.monotonic() < deadline:
            threading.Event().wait(0.05)
        assert not app._pages and get(port, "/api/snapshot")[0] == 200
    messages = [r.getMessage() for r in caplog.records if "watch" in r.name]
    assert not any(r.exc_info for r in caplog.records if "watch" in r.name), messages
    no_traceback(caplog)


def test_too_many_open_pages_get_a_503(real_run, caplog):
    with serving(real_run) as (port, _):
        streams = [_open_stream(port) for _ in range(MAX_PAGES)]
        try:
            got, body = get(port, "/api/events")
            assert got == 503 and b"pages already follow this run" in body
        finally:
            for s in streams:
                s.close()
    no_traceback(caplog)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("abuse", ["requests and closed tabs", "files damaged while watched"])
def test_testbed_watch_logs_no_traceback(real_run, tmp_path, abuse):
    """The real command, as a user runs it: whatever the pages and the files do, its stderr holds
    no traceback, and it goes on serving."""
    import subprocess
    import sys
    import time

    from conftest import REPO

    run = copy_run(real_run, tmp_path / "run")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "watch", str(run), "--port", str(port)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                if get(port, "/api/snapshot")[0] == 200:
                    break
            assert time.monotonic() < deadline and proc.poll() is None, "the page did not come up"
            time.sleep(0.1)
        if abuse == "requests and closed tabs":
            for _ in range(5):
                _open_stream(port).close()
            for request in (b"GARBAGE\r\n\r\n", b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n",
                            b"GET / HTTP/1.1\r\nX: " + b"b" * 20_000 + b"\r\n\r\n",
                            b"POST /api/snapshot HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
                            b"GET /api/snapshot?page=nan HTTP/1.1\r\nConnection: close\r\n\r\n"):
                assert 400 <= http(port, request)[0] < 500
        else:
            stream = _open_stream(port)
            with open(run / "ledger.csv", "ab") as f:
                f.write(b"\xff" * (3 * lines.MAX_LINE_BYTES) + b"\n" + b"compute,9,9\r\n")
            (run / "summary.json").write_text('{"status": 1}')
            time.sleep(1.5)  # a few polls of the page
            (run / "metrics.csv").unlink()
            time.sleep(1.5)
            stream.close()
            errors = json.loads(get(port, "/api/snapshot")[1])["run"]["errors"]
            assert set(errors) == {"ledger.csv", "summary.json", "metrics.csv"}
        time.sleep(1.0)
        assert get(port, "/api/snapshot")[0] == 200 and proc.poll() is None
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert b"Traceback" not in err and b"Error handling request" not in err, err.decode()


# ---------------------------------------------------------------- what the page keeps is capped

def _more_sigmas(run: Path) -> None:
    """Privacy rows of node 0 with noise levels the run never used."""
    events = [GaussianEvent(node=0, round=3, sigma=sigma, sensitivity=0.25, count=5, observer="server")
              for sigma in (2.0, 3.0)]
    writer = LedgerWriter(run / "ledger.csv")  # rows as the ledger writes them, whatever its columns
    writer.write(events)
    writer.close()


@pytest.mark.parametrize("module,cap,value,damage,name,words", [
    ("feed", "MAX_METRIC_ROWS", 2, None, "metrics.csv", "more than 2 rounds: the page shows the first 2"),
    ("feed", "MAX_METRIC_ROWS", 3, None, "metrics.csv", "more than 3 rounds: the page shows the first 3"),
    ("feed", "MAX_NODES", 3, None, "config.toml", "data.num_nodes = 4: more than the page follows (3)"),
    ("checks", "MAX_SIGNATURES", 1, _more_sigmas, "ledger.csv", "node 0 has more than 1 distinct noise settings"),
    ("checks", "MAX_SIGNATURES", 2, _more_sigmas, "ledger.csv", "node 0 has more than 2 distinct noise settings"),
])
def test_what_the_page_keeps_is_capped_and_said(real_run, tmp_path, monkeypatch, module, cap, value, damage, name,
                                                words):
    import importlib

    monkeypatch.setattr(importlib.import_module(f"testbed.watch.{module}"), cap, value)
    run = copy_run(real_run, tmp_path / "run")
    if damage is not None:
        damage(run)
    snap = shown(RunFeed(run))
    assert words in snap["run"]["errors"][name]
    if cap == "MAX_METRIC_ROWS":
        assert len(snap["metrics"]) == value
    if cap == "MAX_NODES":
        assert snap["nodes"] == []


# ---------------------------------------------------------------- no honest row refused

@pytest.mark.parametrize("name", ["dp_pasgd", "dwfl", "fedavg", "acfl", "padpfl"])
def test_every_algorithms_honest_run_is_shown_without_an_error(tmp_path, name):
    """The checks refuse nothing a run of any registered algorithm writes: each node's figures are
    its summary's."""
    from test_algorithm_contract import _text

    result = run_experiment(load_config_text(_text(name)), out_dir=tmp_path / "run", quiet=True)
    snap = shown(RunFeed(result.run_dir))
    assert snap["run"]["errors"] == {} and snap["run"]["status"] == result.summary["status"]
    assert len(snap["metrics"]) == result.summary["rounds"]
    for row in snap["nodes"]:
        node = result.summary["nodes"][str(row["id"])]
        # A run without (ε, δ) noise (FedAvg; ACFL's ε-MI-DP) has no finite ε on the page either.
        assert row["epsilon"] == (None if node["epsilon"] is None else pytest.approx(node["epsilon"], rel=1e-9))
        assert row["cost_units"] == pytest.approx(node["cost_units"], rel=1e-9)


@pytest.mark.parametrize("error", [RuntimeError("a bug"), OSError(5, "Input/output error")])
def test_a_failure_of_the_reader_is_one_warning_and_on_the_page(real_run, tmp_path, caplog, error):
    run = copy_run(real_run, tmp_path / "run")
    with serving(run) as (port, app):
        stream = _open_stream(port)  # an open page is told too, not only a new one
        poll, calls, seen = app.feed.poll, [], threading.Event()

        def failing_until_seen():
            # The second poll fails, and so does every one after it until the test has seen the
            # error: a poll every 50 ms would otherwise clear it before a loaded machine looks.
            calls.append(1)
            if len(calls) >= 2 and not seen.is_set():
                raise error
            return poll()

        app.feed.poll = failing_until_seen
        deadline = time.monotonic() + 30.0  # a deadline, not a count of waits: a loaded machine polls late
        while time.monotonic() < deadline:
            errors = json.loads(get(port, "/api/snapshot")[1])["run"]["errors"]
            if "watch" in errors:
                break
            threading.Event().wait(0.05)
        assert errors["watch"].startswith(f"reading the run failed: {type(error).__name__}")
        told = b""
        while b'"watch":"reading the run failed' not in told:
            told += stream.recv(65536)  # times out (a failure) if the page is never told
        stream.close()
        while len(calls) < 4:  # the failure repeated: still logged once (below)
            threading.Event().wait(0.05)
        seen.set()
        deadline = time.monotonic() + 30.0  # the next poll succeeds: the page is current again, and says so
        while time.monotonic() < deadline:
            errors = json.loads(get(port, "/api/snapshot")[1])["run"]["errors"]
            if "watch" not in errors:
                break
            threading.Event().wait(0.05)
        assert errors == {}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and not warnings[0].exc_info
    no_traceback(caplog)


@pytest.mark.parametrize("pieces_per_poll", [1, 2])
def test_a_huge_log_is_read_over_several_polls(real_run, tmp_path, monkeypatch, pieces_per_poll):
    """Each poll reads a bounded number of pieces: a log of 40,000 rounds (3 MB) shows up over
    several polls, whole in the end."""
    from testbed.watch import feed as feed_module

    monkeypatch.setattr(feed_module, "MAX_PIECES_PER_POLL", pieces_per_poll)
    run = copy_run(real_run, tmp_path / "run", files=("config.toml",))
    config = (run / "config.toml").read_text()
    (run / "config.toml").write_text(config.replace("\nsteps = 20\n", "\nsteps = 200000\n"))  # 40,000 rounds
    rows = data_rows(real_run / "metrics.csv")
    rest = rows[1].split(b",", 1)[1]
    (run / "metrics.csv").write_bytes(rows[0] + b"".join(b"%d," % r + rest for r in range(1, 40_001)))
    feed = RunFeed(run)
    seen = []
    while not seen or seen[-1] < 40_000:
        feed.poll()
        seen.append(len(feed.metrics))
    assert len(seen) >= 3 // pieces_per_poll + 1 and seen == sorted(seen)
    assert feed.snapshot()["run"]["errors"] == {}
