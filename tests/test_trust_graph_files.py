"""Edge list files (``[topology] kind = "file"``) as a careless or hostile user gives them: a device
(/dev/zero), a folder, a FIFO, a file far longer than any graph of the run's N nodes, any bytes at
all. Each is refused in one line naming topology.path before it is read whole (or read at all),
by `testbed topology show` and by the watch page, whose error names it; a good list gives its graph."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from testbed.errors import ConfigError
from testbed.topology import Topology, TopologySection
from testbed.topology.kinds import EDGE_HEADER_BYTES, EDGE_LINE_BYTES, from_edge_list, max_edge_list_bytes
from testbed.watch.feed import RunFeed

from test_faults_cli import _fails
from topology_cases import dwfl_text, dwfl_topology  # noqa: F401  (a fixture)

N = 6


def _topology(path: Path | str, n: int = N) -> Topology:
    return Topology(TopologySection(kind="file", path=str(path)), num_nodes=n, seed=0)


def _experiment(tmp_path: Path, path: str) -> Path:
    text = dwfl_text(num_nodes=N, topology=f'kind = "file"\npath = "{path}"')
    (tmp_path / "e.toml").write_text(text)
    return tmp_path / "e.toml"


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/urandom", "/"])
def test_a_device_or_folder_is_refused_before_it_is_read(path):
    with pytest.raises(ConfigError) as caught:
        _topology(path).graph(0)
    assert "topology.path" in str(caught.value) and "not a regular file" in str(caught.value)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "edges"
    os.mkfifo(fifo)  # opened for reading, it would wait for a writer forever
    with pytest.raises(ConfigError, match="not a regular file"):
        _topology(fifo)


def test_a_list_longer_than_any_graph_of_n_nodes_is_refused_by_its_size(tmp_path):
    """10⁵ edges for 6 nodes (at most 15 distinct): refused by stat, nothing read."""
    big = tmp_path / "big.txt"
    big.write_text("0 1\n" * 100_000)
    with pytest.raises(ConfigError, match="more than the"):
        _topology(big)
    assert max_edge_list_bytes(N, 10**9) == 15 * EDGE_LINE_BYTES + EDGE_HEADER_BYTES


def test_duplicates_within_the_size_are_counted_as_they_are_read(tmp_path):
    """Under the size cap but more lines than N(N − 1)/2: the running count refuses it at the line."""
    dup = tmp_path / "dup.txt"
    dup.write_text("0 1\n" * 16)
    with pytest.raises(ValueError, match=r"dup.txt: more than the 15 edges"):
        from_edge_list(N, dup)


def test_a_list_whose_graph_would_not_fit_in_memory_is_refused(tmp_path, monkeypatch):
    from testbed.util import memory

    ok = tmp_path / "ok.txt"
    ok.write_text("".join(f"{i} {i + 1}\n" for i in range(99)))
    monkeypatch.setattr(memory, "available_bytes", lambda: 1000)
    with pytest.raises(ConfigError, match="MiB available"):
        _topology(ok, n=100)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=400) | st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=30).map(
    lambda pairs: "".join(f"{i} {j}\n" for i, j in pairs).encode()))
def test_any_bytes_give_a_graph_or_one_line(tmp_path, body):
    path = tmp_path / "any.txt"
    path.write_bytes(body)
    try:
        g = _topology(path).graph(0)
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("config error: topology.path: ")
        return
    assert g.num_nodes == N and g.num_edges <= N * (N - 1) // 2
    assert np.all(g.indices < N)


def test_topology_show_refuses_dev_zero_in_one_line(capsys, tmp_path, dwfl_topology):
    err = _fails(capsys, ["topology", "show", str(_experiment(tmp_path, "/dev/zero"))])
    assert "topology.path" in err and "/dev/zero" in err and "not a regular file" in err


def test_the_watch_page_names_an_unreadable_edge_list(tmp_path, dwfl_topology):
    """The page shows the error (it used to stay stale with "error": null after a MemoryError)."""
    text = dwfl_text(num_nodes=N, topology='kind = "file"\npath = "/dev/zero"')
    (tmp_path / "config.toml").write_text(text)
    feed = RunFeed(tmp_path)
    first = json.loads(json.dumps(feed.poll(), allow_nan=False))
    assert "topology.path" in first["run"]["error"] and "/dev/zero" in first["run"]["error"]
    assert feed.snapshot()["graph"] is None


_LINES = st.one_of(
    st.tuples(st.integers(0, N - 1), st.integers(0, N - 1)).map(lambda p: f"{p[0]} {p[1]}"),
    st.tuples(st.integers(0, N - 1), st.integers(0, N - 1)).map(lambda p: f"{p[0]},\t{p[1]}  # a comment"),
    st.sampled_from(["", "   ", "# header", "\r"]))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_LINES, max_size=20), chunk=st.integers(1, 40), end=st.sampled_from(["\n", "\r\n"]))
def test_numpys_pieces_and_the_line_parser_read_the_same_graph(tmp_path, monkeypatch, lines, chunk, end):
    """Pieces of plain lines go through numpy, others line by line, wherever the pieces are cut."""
    import functools

    from testbed.topology import kinds
    from testbed.topology.graph import Graph
    from testbed.util.userfiles import bounded_chunks

    path = tmp_path / "mixed.txt"
    path.write_text(end.join(lines) + (end if lines else ""))
    pairs = [tuple(int(w) for w in line.split("#")[0].replace(",", " ").split()) for line in lines
             if line.split("#")[0].strip()]
    monkeypatch.setattr(kinds, "bounded_chunks", functools.partial(bounded_chunks, chunk_bytes=chunk))
    try:
        got = from_edge_list(N, path)
    except ValueError as exc:  # a self loop, or more lines than 15 edges: as the reference says
        assert "itself" in str(exc) or "more than the" in str(exc)
        assert any(i == j for i, j in pairs) or len(pairs) > 15
        return
    assert got == Graph.from_edges(N, np.array(pairs, dtype=np.int64).reshape(-1, 2))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(nodes=st.integers(2, 40), extra=st.integers(-64, 64))
def test_the_size_cap_is_exact_and_derived_from_n(tmp_path, nodes, extra):
    """A file of comments of exactly the cap for N nodes is read; one byte more is refused unread."""
    cap = max_edge_list_bytes(nodes, 10**9)
    size = cap + extra
    path = tmp_path / f"sized-{nodes}.txt"
    path.write_bytes(b"#" * (size - 1) + b"\n")
    try:
        g = from_edge_list(nodes, path)
    except ValueError as exc:
        assert extra > 0 and f"{size:,} bytes, more than the {cap:,}" in str(exc)
        return
    assert extra <= 0 and g.num_edges == 0
