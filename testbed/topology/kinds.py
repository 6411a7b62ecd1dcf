"""The graph families of ``[topology] kind``, each drawn from a generator the caller keys.

Every generator is numpy only and vectorised (O(N + E) work, no loop over nodes or pairs), so a
board, the coordinator and the channel emulator draw the same graph from the run's seed.

- :func:`ring`: node i joined to i ± 1 (mod N).
- :func:`torus`: an R × C grid with wrap-around, R·C = N (4-regular for R, C >= 3).
- :func:`k_regular`: a random d-regular graph, the union of d/2 random Hamiltonian cycles (plus a
  random perfect matching when d is odd), each redrawn until it repeats no edge. This samples a
  subset of the d-regular graphs, not uniformly; every one of them is an expander with high
  probability (Friedman), which is what a k-regular baseline is for.
- :func:`erdos_renyi`: G(N, p), every pair independently with probability p.
- :func:`from_edge_list`: an edge list file, one ``i j`` pair per line (``#`` comments).

Example::

    >>> import numpy as np
    >>> ring(5).neighbours(0).tolist(), torus(9, rows=3).degrees.tolist()[:3]
    ([1, 4], [4, 4, 4])
    >>> g = k_regular(10, 3, np.random.default_rng(0))
    >>> set(g.degrees.tolist())
    {3}
"""

from __future__ import annotations

import math
from array import array
from pathlib import Path

import numpy as np

from testbed.errors import UserError
from testbed.topology.graph import Graph
from testbed.util.userfiles import bounded_chunks

__all__ = ["ring", "torus", "torus_rows", "k_regular", "erdos_renyi", "from_edge_list", "max_edge_list_bytes"]

#: Attempts at one random cycle or matching before k_regular gives up (each repeats an earlier edge
#: with probability about 1 − exp(−2j) for the j-th cycle: a few hundred tries for d = 8).
_MAX_TRIES = 10_000
#: Geometric gaps drawn at once by erdos_renyi (the expected count, capped: 32 MB of int64).
_MAX_CHUNK = 2**22


def ring(num_nodes: int) -> Graph:
    """The cycle 0 − 1 − … − (N−1) − 0 (N >= 3)."""
    if num_nodes < 3:
        raise ValueError(f"a ring needs at least 3 nodes, got {num_nodes}")
    i = np.arange(num_nodes, dtype=np.int64)
    return Graph.from_edges(num_nodes, np.column_stack([i, (i + 1) % num_nodes]))


def torus_rows(num_nodes: int) -> int:
    """The most square factorisation's rows: the largest R <= sqrt(N) dividing N."""
    return max(r for r in range(1, math.isqrt(num_nodes) + 1) if num_nodes % r == 0)


def torus(num_nodes: int, rows: int | None = None) -> Graph:
    """An R × C grid with wrap-around (node r·C + c), R·C = N, both at least 3 (with 2 the wrap
    edge is the grid edge, and the graph is not a torus). R: ``rows``, or the most square."""
    r = torus_rows(num_nodes) if rows is None else rows
    if num_nodes % r:
        raise ValueError(f"rows = {r} does not divide the {num_nodes} nodes")
    c = num_nodes // r
    if r < 3 or c < 3:
        raise ValueError(f"a torus needs at least 3 rows and 3 columns; {num_nodes} nodes give {r} x {c}")
    grid = np.arange(num_nodes, dtype=np.int64).reshape(r, c)
    right = np.column_stack([grid.ravel(), np.roll(grid, -1, axis=1).ravel()])
    down = np.column_stack([grid.ravel(), np.roll(grid, -1, axis=0).ravel()])
    return Graph.from_edges(num_nodes, np.concatenate([right, down]))


def k_regular(num_nodes: int, degree: int, rng: np.random.Generator) -> Graph:
    """A random ``degree``-regular simple graph (N·d even, 2 <= d < N; d = 1: a perfect matching)."""
    if not 1 <= degree < num_nodes or (num_nodes * degree) % 2:
        raise ValueError(f"no {degree}-regular graph on {num_nodes} nodes (need 1 <= degree < N and N*degree even)")
    keys = np.zeros(0, dtype=np.int64)
    parts = [_cycle] * (degree // 2) + ([_matching] if degree % 2 else [])
    for part in parts:
        for _ in range(_MAX_TRIES):
            pairs = part(num_nodes, rng)
            new = np.sort(pairs, axis=1) @ np.array([num_nodes, 1], dtype=np.int64)
            if np.unique(new).size == new.size and not np.isin(new, keys).any():
                keys = np.concatenate([keys, new])
                break
        else:
            raise ValueError(f"could not draw a {degree}-regular graph on {num_nodes} nodes; lower the degree")
    return Graph.from_edges(num_nodes, np.column_stack(np.divmod(keys, num_nodes)))


def _cycle(num_nodes: int, rng: np.random.Generator) -> np.ndarray:
    order = rng.permutation(num_nodes)
    return np.column_stack([order, np.roll(order, -1)])


def _matching(num_nodes: int, rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(num_nodes).reshape(-1, 2)


def erdos_renyi(num_nodes: int, p: float, rng: np.random.Generator) -> Graph:
    """G(N, p): every pair independently with probability p, drawn by geometric skipping
    (Batagelj & Brandes 2005): the gaps between chosen pairs of the upper triangle, in row order,
    are Geometric(p). O(N + E) time and memory: sampling the E pairs out of N(N − 1)/2 without
    replacement (numpy's choice) permutes all of them once p > 2 %, 3.6 GB for N = 30,000."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be in [0, 1], got {p}")
    pairs = num_nodes * (num_nodes - 1) // 2
    if p == 0.0 or pairs == 0:
        return Graph.from_edges(num_nodes, np.zeros((0, 2), dtype=np.int64))
    mean = pairs * p
    chunk = int(min(max(1024.0, mean + 6.0 * math.sqrt(mean) + 16.0), _MAX_CHUNK))  # one chunk, nearly always
    parts, last = [], -1
    while True:
        chosen = last + np.cumsum(rng.geometric(p, size=chunk))
        inside = chosen[chosen < pairs]
        parts.append(inside)
        if inside.size < chunk:
            break
        last = int(chosen[-1])
    return Graph.from_edges(num_nodes, _pair_of(np.concatenate(parts), num_nodes))


def _pair_of(index: np.ndarray, num_nodes: int) -> np.ndarray:
    """(K, 2) the pair (i, j), i < j, of each index into the upper triangle in row order."""
    # Row i starts at s(i) = i·N − i(i+1)/2; invert by the quadratic formula, then fix rounding.
    n = float(num_nodes)
    i = np.floor((2 * n - 1 - np.sqrt((2 * n - 1) ** 2 - 8.0 * index)) / 2).astype(np.int64)
    start = i * num_nodes - i * (i + 1) // 2
    i = np.where(start > index, i - 1, i)
    start = i * num_nodes - i * (i + 1) // 2
    nxt = (i + 1) * num_nodes - (i + 1) * (i + 2) // 2
    i = np.where(index >= nxt, i + 1, i)
    start = i * num_nodes - i * (i + 1) // 2
    return np.column_stack([i, i + 1 + index - start])


#: Bytes an edge list may spend per edge it can hold: two ids, separators and a short comment.
EDGE_LINE_BYTES = 128
#: Bytes an edge list may hold besides its edges (a header of comments).
EDGE_HEADER_BYTES = 64 * 1024


def max_edge_list_bytes(num_nodes: int, max_edges: int) -> int:
    """The largest edge list file of N nodes read at all: as many lines as the graph can have
    edges (at most N(N − 1)/2, and ``max_edges``) of :data:`EDGE_LINE_BYTES` each, plus a header."""
    return min(num_nodes * (num_nodes - 1) // 2, max_edges) * EDGE_LINE_BYTES + EDGE_HEADER_BYTES


def from_edge_list(num_nodes: int, path: str | Path, max_edges: int | None = None) -> Graph:
    """The graph of an edge list file: ``i j`` per line, whitespace or comma separated, ``#``
    comments. The file is checked before it is read (a regular file of at most
    :func:`max_edge_list_bytes`: never /dev/zero or a 1.6 GB list for 16 nodes) and read a piece at
    a time with a running count of its edges (at most N(N − 1)/2 and ``max_edges``); a piece of
    plain ``i j`` lines is parsed by numpy, any other line by line.

    Raises:
        ValueError: anything else, one line (naming the line).
    """
    cap = num_nodes * (num_nodes - 1) // 2 if max_edges is None else min(max_edges, num_nodes * (num_nodes - 1) // 2)
    parts: list[np.ndarray] = []
    edges, first_line = 0, 1
    try:
        for chunk in bounded_chunks(Path(path), max_edge_list_bytes(num_nodes, cap), "edge list"):
            pairs = _plain_pairs(chunk)
            if pairs is None or (pairs.size and pairs.max() >= num_nodes):  # the slow path names the line
                pairs = _pairs_by_line(chunk, first_line, num_nodes, path)
            edges += len(pairs)
            if edges > cap:  # duplicates included: a list longer than any graph of N nodes
                raise ValueError(f"{path}: more than the {cap:,} edges a graph of {num_nodes} nodes may hold")
            parts.append(pairs)
            first_line += chunk.count(b"\n")
    except UserError as exc:
        raise ValueError(str(exc).removeprefix("edge list ")) from None
    pairs = np.concatenate(parts) if parts else np.zeros((0, 2), dtype=np.int64)
    del parts  # the pieces' memory back before the graph is built
    try:
        return Graph.from_edges(num_nodes, pairs)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


#: Bytes an edge list may hold besides its digits: a space, a tab, CR and LF.
_PLAIN = b"0123456789 \t\r\n"
#: Digits of a node id numpy parses (an int64 holds 18 of them whatever they are).
_MAX_DIGITS = 18


def _plain_pairs(chunk: bytes) -> np.ndarray | None:
    """(K, 2) the pairs of a piece of lines that hold two ids each (blank lines between), parsed
    without a Python loop; None for anything else (a comment, a comma, a third id), which the line
    parser reads or names."""
    if chunk.translate(None, _PLAIN):
        return None
    raw = np.frombuffer(chunk, dtype=np.uint8)
    digit = (raw >= 48) & (raw <= 57)
    starts = digit.copy()
    starts[1:] &= ~digit[:-1]
    line = np.cumsum(raw == 10) - (raw == 10)  # each byte's line, its newline included
    per_line = np.bincount(line[starts], minlength=int(line[-1]) + 1 if raw.size else 0)
    if np.any((per_line != 0) & (per_line != 2)):
        return None
    lengths = np.diff(np.flatnonzero(np.diff(np.concatenate([[False], digit, [False]]).astype(np.int8))))[::2]
    if lengths.size and lengths.max() > _MAX_DIGITS:
        return None
    ids = np.fromstring(chunk, dtype=np.int64, sep=" ")  # text mode: any whitespace separates
    return ids.reshape(-1, 2) if ids.size == lengths.size else None


def _pairs_by_line(chunk: bytes, first_line: int, num_nodes: int, path: str | Path) -> np.ndarray:
    """(K, 2) the pairs of a piece of lines, line by line; ValueError naming the first bad line."""
    ids = array("q")
    for number, raw in enumerate(chunk.split(b"\n"), start=first_line):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{path}:{number}: not UTF-8 text") from None
        words = line.split("#", 1)[0].replace(",", " ").split()
        if not words:
            continue
        # ASCII digits only: str.isdigit also takes "²", which int() refuses.
        if len(words) != 2 or not all(w.isascii() and w.isdigit() for w in words):
            raise ValueError(f"{path}:{number}: expected two node ids, got {line.strip()[:60]!r}")
        i, j = int(words[0]), int(words[1])
        if max(i, j) >= num_nodes:  # checked here, with the line: a huge id would not fit an int64
            raise ValueError(f"{path}:{number}: a node id outside 0..{num_nodes - 1}")
        ids.append(i)
        ids.append(j)
    return np.frombuffer(ids, dtype=np.int64).reshape(-1, 2)
