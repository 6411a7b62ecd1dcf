"""``file``: an edge list, one ``i j`` pair per line (``path``; testbed.topology.kinds.from_edge_list)."""

from pathlib import Path

from testbed.errors import ConfigError, UserError
from testbed.topology import kinds
from testbed.topology.registry import Kind

#: The shortest line that holds an edge ("0 1\\n"): a file's size bounds its edges by this.
_MIN_EDGE_LINE_BYTES = 4
#: Bytes held per edge at the peak of reading an edge list (its ids, both directions, the sort's
#: keys and copies, the CSR rows): an estimate that errs high.
_EDGE_PEAK_BYTES = 96


def _draw(topology, block, rng):
    from testbed.topology.topology import MAX_ADJACENCY_ENTRIES

    # The path is resolved against the experiment file's folder by testbed.assembly.config.
    return kinds.from_edge_list(topology.num_nodes, topology.section.path, MAX_ADJACENCY_ENTRIES // 2)


def _entries(topology) -> float | None:
    """The most directed entries an edge list file can give, from its size before a byte is read
    (its lines are at least "i j\\n"), refused if the graph would not fit in the memory this
    machine has available (ConfigError naming topology.path)."""
    from testbed.topology.topology import MAX_ADJACENCY_ENTRIES
    from testbed.util import memory
    from testbed.util.userfiles import regular_file

    path, n = topology.section.path, topology.num_nodes
    if path is None:
        return None
    try:
        size = regular_file(Path(path), kinds.max_edge_list_bytes(n, MAX_ADJACENCY_ENTRIES // 2), "")
    except UserError as exc:
        raise ConfigError("topology.path", str(exc).strip()) from None
    edges = min(size // _MIN_EDGE_LINE_BYTES, n * (n - 1) // 2)
    need, have = edges * _EDGE_PEAK_BYTES, memory.available_bytes()
    if have is not None and need > have:
        raise ConfigError("topology.path", f"{path}: up to {edges:,} edges need about {need / 2**20:,.0f} MiB to "
                                           f"read, this machine has {have / 2**20:,.0f} MiB available")
    return 2.0 * edges


def _check(section) -> str | None:
    return 'path: kind = "file" needs the edge list\'s path' if section.path is None else None


REGISTRATION = Kind("file", _draw, keys=("path",), size_key="path", expected_entries=_entries, check=_check, order=6)
