"""`testbed watch` at its trust boundary, with generated inputs (Hypothesis): a real run's files
mutated in any way, written in any pieces, lines of any length and bytes; HTTP requests of any
method, path, query and headers; status payloads of any bytes. Each asserts: nothing escapes, the
page's JSON stays strict and within what the run declared, a damaged line is named on the page and
used for nothing, memory stays bounded, and the log holds no error or traceback."""

from __future__ import annotations

import json
import math
import tempfile
import tracemalloc
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.watch import lines
from testbed.watch.feed import MAX_METRIC_ROWS, RunFeed
from testbed.watch.lines import LineTail

from test_faults_watch import (  # noqa: F401 (real_run is a fixture)
    RUN_FILES,
    _Recorder,
    copy_run,
    data_rows,
    get,
    http,
    no_traceback,
    real_run,
    same_data,
    serving,
    shown,
    without_line,
)

NUM_NODES = 4  # the small experiment's (tests/conftest.py)


def declared(snap: dict) -> None:
    """What the page is shown stays within what the run declared, whatever the files held."""
    json.dumps(snap, allow_nan=False)
    num_nodes = snap["run"].get("num_nodes")  # None: no valid config.toml, so no node is shown
    rounds = [m["round"] for m in snap["metrics"]]
    assert all(r == int(r) >= 1 for r in rounds) and rounds == sorted(set(rounds))
    assert len(snap["metrics"]) <= MAX_METRIC_ROWS
    for m in snap["metrics"]:
        assert m["test_accuracy"] is None or 0 <= m["test_accuracy"] <= 1
        assert 0 <= m["stragglers"] <= (num_nodes or 2**63) and 0 <= m["wall_s"] <= 1e30
        assert m["cost_units"] is None or 0 <= m["cost_units"] <= 1e30
    assert len(snap["nodes"]) <= (num_nodes or 0) and all(0 <= n["id"] < num_nodes for n in snap["nodes"])
    for n in snap["nodes"]:
        for key in ("epsilon", "energy_j", "cost_units", "bytes", "mi_epsilon"):
            assert n[key] is None or (math.isfinite(n[key]) and n[key] >= 0), (key, n[key])
    error = snap["run"]["error"]
    errors = snap["run"]["errors"]
    assert error is None or ("\n" not in error and error == " · ".join(f"{k}: {v}" for k, v in errors.items()))


# ---------------------------------------------------------------- run files mutated in any way

_SPECIAL = ["", "nan", "-nan", "inf", "-inf", "1e308", "-1e308", "1e-308", "-1", "0", "1", "0.5", str(2**70),
            str(2**63), "-1e999", "True", "False", "compute", "privacy", "straggle", "communication",
            "mutual_info", "server", "none", "replace_one", "offline", "é", "\x00", '"', "1_000", " 1"]


@st.composite
def mutation(draw, real: Path) -> tuple[str, bytes]:
    """(a run file's name, its bytes mutated): spans inserted, deleted, duplicated or replaced by
    random bytes, the file cut anywhere, a huge line added, or a line's cells replaced."""
    name = draw(st.sampled_from(RUN_FILES))
    data = (real / name).read_bytes()
    kind = draw(st.sampled_from(["insert", "delete", "duplicate", "replace", "cut", "huge", "cells"]))
    i = draw(st.integers(0, len(data)))
    j = draw(st.integers(i, min(len(data), i + 200)))
    if kind == "insert":
        return name, data[:i] + draw(st.binary(max_size=100)) + data[i:]
    if kind == "delete":
        return name, data[:i] + data[j:]
    if kind == "duplicate":
        return name, data[:j] + data[i:j] + data[j:]
    if kind == "replace":
        return name, data[:i] + draw(st.binary(min_size=1, max_size=50)) + data[j:]
    if kind == "cut":
        return name, data[:i]
    if kind == "huge":
        return name, data[:i] + b"7" * draw(st.integers(lines.MAX_LINE_BYTES - 2, 3 * lines.MAX_LINE_BYTES)) + data[i:]
    rows = data.splitlines(keepends=True)
    k = draw(st.integers(0, len(rows) - 1))
    cells = rows[k].rstrip(b"\r\n").split(b",")
    for c in draw(st.lists(st.integers(0, len(cells) - 1), min_size=1, max_size=3)):
        cells[c] = draw(st.sampled_from(_SPECIAL) | st.text(max_size=12)).encode("utf-8", "surrogatepass")
    rows[k] = b",".join(cells) + b"\r\n"
    return name, b"".join(rows)


@given(data=st.data())
def test_any_mutation_of_a_run_file_is_shown_safely(real_run, caplog, data):
    name, mutated = data.draw(mutation(real_run))
    with tempfile.TemporaryDirectory() as tmp:
        run = copy_run(real_run, Path(tmp))
        feed = RunFeed(run)
        shown(feed)
        (run / name).write_bytes(mutated)
        snap = shown(feed)  # read live: the file changed under the page
        declared(snap)
        fresh = shown(RunFeed(run))  # and afresh
        declared(fresh)
        if len(mutated) != len((real_run / name).read_bytes()):
            # A file that changed under the page is read again (or only its new lines are), so the
            # page shows what a fresh reader shows. (A rewrite of the same size that leaves the last
            # bytes read alike is not noticed: a run only appends or truncates its logs.)
            assert same_data(snap, fresh) and snap["run"]["errors"].keys() == fresh["run"]["errors"].keys()
    no_traceback(caplog)


_GARBAGE_CELL = st.text(alphabet="§xyz!?<>", min_size=1, max_size=8)


@given(data=st.data())
def test_a_line_of_garbage_anywhere_is_named_and_the_rest_shown(real_run, caplog, data):
    """A data line of a log replaced by cells one of which is no number, no choice and no blank:
    the page names the file and the line and shows exactly what the file holds without it."""
    name = data.draw(st.sampled_from(["metrics.csv", "ledger.csv"]))
    rows = data_rows(real_run / name)
    index = data.draw(st.integers(0, len(rows) - 2))
    cells = rows[1 + index].decode().rstrip("\r\n").split(",")
    cells[data.draw(st.integers(0, len(cells) - 1))] = data.draw(_GARBAGE_CELL)
    with tempfile.TemporaryDirectory() as tmp:
        expected = without_line(real_run, Path(tmp) / "oracle", name, index)
        run = copy_run(real_run, Path(tmp) / "run")
        rows[1 + index] = (",".join(cells) + "\r\n").encode()
        (run / name).write_bytes(b"".join(rows))
        snap = shown(RunFeed(run))
    assert snap["run"]["errors"][name].startswith(f"line {index + 2}: ")
    assert same_data(snap, expected)
    declared(snap)
    no_traceback(caplog)


@given(data=st.data())
def test_files_written_in_any_pieces_read_as_written_whole(real_run, data):
    """As a live run writes them, in pieces cut anywhere (mid-line, mid-character), polled between
    pieces: at the end the page shows what a reader of the finished files shows, and no error."""
    whole = shown(RunFeed(real_run))
    contents = {name: (real_run / name).read_bytes() for name in ("metrics.csv", "ledger.csv")}
    steps = data.draw(st.lists(st.tuples(st.sampled_from(sorted(contents)), st.integers(1, 1500), st.booleans()),
                               max_size=20))
    with tempfile.TemporaryDirectory() as tmp:
        run = copy_run(real_run, Path(tmp), files=("config.toml",))
        feed = RunFeed(run)
        written = dict.fromkeys(contents, 0)
        for name, size, poll in [*steps, *((n, len(c), True) for n, c in contents.items())]:  # then the rest
            end = min(written[name] + size, len(contents[name]))
            with open(run / name, "ab") as f:
                f.write(contents[name][written[name]:end])
            written[name] = end
            if poll:
                feed.poll()
                assert feed.snapshot()["run"]["errors"] == {}
                declared(feed.snapshot())
        (run / "summary.json").write_bytes((real_run / "summary.json").read_bytes())
        done = shown(feed)
    assert same_data(done, whole) and done["run"]["errors"] == {} and done["run"]["status"] == "completed"


# ---------------------------------------------------------------- the line reader, bounded

@given(chunks=st.lists(st.binary(max_size=300) | st.sampled_from([b"\n", b"h,1\n", b"\xff\n", b"a" * 90]),
                       max_size=30),
       header_ok=st.booleans())
def test_line_reader_returns_exactly_the_whole_short_text_lines(chunks, header_ok):
    """Any bytes appended in any pieces: the reader returns each whole line of at most its limit
    that is UTF-8 (after a right header), names every other, and never holds more than its limit
    of an unfinished line."""
    header, limit = "h,1", 64
    content = (b"h,1\n" if header_ok else b"") + b"".join(chunks)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "log.csv"
        tail = LineTail(path, header, max_line_bytes=limit, piece_bytes=50)
        got, problems = [], []
        path.write_bytes(b"")
        for chunk in ([b"h,1\n"] if header_ok else []) + chunks:
            with open(path, "ab") as f:
                f.write(chunk)
            while True:
                piece = tail.read()
                assert not piece.restarted and tail.pending_bytes <= limit
                got += piece.lines
                problems += piece.problems
                if not piece.more:
                    break
    ended = content.split(b"\n")[:-1]
    expected, bad = [], 0
    for number, raw in enumerate(ended, start=1):
        try:
            text = raw.decode("utf-8").removesuffix("\r") if len(raw) <= limit else None
        except UnicodeDecodeError:
            text = None
        if number == 1:
            if text != header:
                expected = None
                bad += 1
            continue
        if text is None:
            bad += 1
        elif expected is not None:
            expected.append((number, text))
    assert got == (expected or [])
    # each bad line said once (a too-long last line is said before it ends)
    unfinished_long = len(content) - len(b"\n".join(ended)) - (1 if ended else 0) > limit
    assert len(problems) == bad + unfinished_long


@pytest.mark.parametrize("ended", [True, False])
def test_a_50_mb_line_is_read_in_bounded_memory(real_run, tmp_path, ended):
    """One line of 50 MB in metrics.csv: the page reads past it holding at most a piece and a line,
    says so, and shows the rows after it."""
    run = copy_run(real_run, tmp_path / "run")
    rows = data_rows(run / "metrics.csv")
    with open(run / "metrics.csv", "wb") as f:
        f.write(rows[0] + rows[1])
        for _ in range(50):
            f.write(b"1" * (1024 * 1024))
        f.write(b"\n" + b"".join(rows[2:]) if ended else b"")
    feed = RunFeed(run)
    tracemalloc.start()
    try:
        feed.poll()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024, peak
    snap = shown(feed)
    assert "line 3: longer than" in snap["run"]["errors"]["metrics.csv"]
    assert len(snap["metrics"]) == (len(rows) - 1 if ended else 1)
    assert feed._metrics_tail.pending_bytes <= lines.MAX_LINE_BYTES


# ---------------------------------------------------------------- HTTP requests of any kind

_METHODS = st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"]) | \
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=1, max_size=12)
_PATHS = st.sampled_from(["/", "/api/snapshot", "/api/events", "/static/watch.js", "/static/../feed.py",
                          "/static/", "/api", "/api/", "//api/snapshot", "/index.html"]) | \
    st.text(max_size=60).map(lambda t: "/" + quote(t, safe="/?&=%"))
_VALUES = st.sampled_from(["-1", "0", "1e308", "nan", "NaN", "inf", "-inf", str(2**70), "epsilon", "id", "''",
                           "<script>", "%00"]) | st.text(max_size=30) | st.integers().map(str)
_QUERY = st.dictionaries(st.sampled_from(["page", "sort", "dir", "node", "filter", "version"]) | st.text(max_size=10),
                         _VALUES, max_size=4).map(lambda q: "&".join(f"{quote(k)}={quote(v)}" for k, v in q.items()))
_HEADERS = st.lists(st.tuples(st.text(alphabet="abcdefghij-XYZ", min_size=1, max_size=20),
                              st.integers(0, 20_000)), max_size=3)


@pytest.fixture
def watch_server(real_run, tmp_path):
    with serving(copy_run(real_run, tmp_path / "run")) as (port, app):
        yield port


@given(method=_METHODS, path=_PATHS, query=_QUERY, headers=_HEADERS, body_bytes=st.integers(0, 100_000))
def test_any_http_request_gets_an_answer_and_no_traceback(watch_server, caplog, method, path, query, headers,
                                                          body_bytes):
    target = path + ("?" + query if query else "")
    lines_ = "".join(f"{name}: {'v' * size}\r\n" for name, size in headers)
    body = b"b" * body_bytes if method not in ("GET", "HEAD") else b""
    status, text = http(watch_server, f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{lines_}"
                                      f"Content-Length: {len(body)}\r\n\r\n".encode() + body, timeout_s=1.0)
    assert 200 <= status < 600 and status != 500, (status, text[:200])
    known = {"/": b"<!doctype html>", "/api/snapshot": b'"version"'}
    if method == "GET" and path in known and status == 200:
        assert known[path] in text
    parsed = all(size < 8000 for _, size in headers)  # else aiohttp refuses the request before routing it
    if method == "GET" and path in ("/api/snapshot", "/api/events") and query:
        assert status in (400, 431)  # a query is refused, never read
        if parsed:
            assert b"takes no query parameters" in text and text.count(b"\n") <= 1
    if method not in ("GET", "HEAD") and path in known and not query:
        assert status in (400, 404, 405, 413, 431, 501) and known[path] not in text
    assert get(watch_server, "/api/snapshot")[0] == 200  # the server goes on
    no_traceback(caplog)


# ---------------------------------------------------------------- status payloads of any bytes

@given(kind=st.sampled_from(["status", "coord"]), node=st.sampled_from(["0", "1", "3", "4", "-1", "channel"]) |
       st.text(max_size=8), payloads=st.lists(st.binary(max_size=20) | st.sampled_from([b"online", b"offline"]),
                                               min_size=1, max_size=6))
def test_only_declared_status_payloads_change_a_state(real_run, tmp_path_factory, caplog, kind, node, payloads):
    rec = _Recorder(RunFeed(real_run))
    before = shown(rec.feed)
    for payload in payloads:
        rec.listener.handle(kind, node if kind == "status" else None, payload)
    after = shown(rec.feed)
    declared_payloads = [p for p in payloads if p in (b"online", b"offline")]
    assert after["run"]["status_dropped"] >= len(payloads) - len(declared_payloads)
    is_node = node.isdigit() and node.isascii() and int(node) < NUM_NODES
    if kind == "coord":
        assert after["run"]["coordinator"] == (declared_payloads[-1].decode() if declared_payloads else None)
    if kind == "status" and is_node and declared_payloads:
        state = next(n["state"] for n in after["nodes"] if n["id"] == int(node))
        last = declared_payloads[-1]
        assert state == "offline" if last == b"offline" else state != "offline"
    else:
        assert after["nodes"] == before["nodes"]  # garbage, or not one of the run's nodes: nothing moves
    no_traceback(caplog)
