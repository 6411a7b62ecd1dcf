"""What a node released each round on, across the sessions of a run: one input digest per round.

A node's noise for a round depends only on (its secret or the run's seed, node, round, purpose),
not on the session: a resumed coordinator (a new session of the same run) that asks a round again
makes the node compute it again, with the same noise. On the same input that is the same release
again (the step is deterministic given its input and its streams): nothing new is given away. On
another input (a server resuming with another model: the server is whom node secrets protect
against) two releases would share one noise draw and their difference would carry none, a loss
no Gaussian accountant bounds (issue 39, part 2). So the node records, write-ahead, a digest of
everything its step's output depends on besides its own data and streams, and a later ask of the
round on any other input gets nothing.

Example::

    >>> import numpy as np
    >>> rec = ReleaseRecord(node=1)
    >>> d = input_digest("round", 0, "cfg", (0, 1), {"model": np.zeros(2)})
    >>> rec.allows("r", "round", 0, d), rec.record("r", "round", 0, d)
    (True, None)
    >>> rec.allows("r", "round", 0, input_digest("round", 0, "cfg", (0, 1), {"model": np.ones(2)}))
    False
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

log = logging.getLogger(__name__)

_LINE = re.compile(r"([a-z_]+) (-?[0-9]+) ([0-9a-f]{64})")


def input_digest(kind: str, round_index: int, experiment_key: str, nodes: Sequence[int],
                 tensors: Mapping[str, np.ndarray]) -> str:
    """SHA-256 (hex) of a step's input besides the node's data and streams: the message's kind
    (a round, a setup, an over-the-air round's received signal), its round, the experiment file's
    sha256 (seed, sizes, hyper-parameters, budgets), the nodes it names (a round's expected, a
    received signal's senders) and every tensor it carries (name, dtype, shape, bytes)."""
    h = hashlib.sha256()
    h.update(f"{kind}\x00{int(round_index)}\x00{experiment_key}\x00{','.join(map(str, nodes))}\x00".encode())
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        h.update(f"{name}\x00{array.dtype.str}\x00{array.shape}\x00".encode())
        h.update(array.tobytes())
    return h.hexdigest()


class ReleaseRecord:
    """A node's record of the input digest of each (run, message kind, round) it released.

    With a state directory it is ``releases-{run}-node{node}.txt`` there (one line per release,
    appended and fsynced before the release is logged or sent), read back when the node restarts;
    a damaged file (a bad whole line) makes the node release nothing more in that run, since it
    can no longer tell which input a round was released on. A cut last line (killed while writing
    it) was never released and is left out. Without a state directory (sim, emulated hosts) the
    record lives as long as the process: such nodes draw from the run's seed, so their noise is
    derivable by whoever holds it anyway.

    Args:
        node: the node's global id.
        state_dir: where the node keeps its files; None: in memory only.
    """

    def __init__(self, node: int, state_dir: Path | None = None):
        self.node = int(node)
        self.state_dir = state_dir
        self._runs: dict[str, dict[tuple[str, int], str] | None] = {}  # None: a damaged file
        #: Asks refused for carrying another input than the one their round was released on.
        self.refused = 0

    def _path(self, run: str) -> Path | None:
        return None if self.state_dir is None else self.state_dir / f"releases-{run}-node{self.node}.txt"

    def _of(self, run: str) -> dict[tuple[str, int], str] | None:
        if run not in self._runs:
            self._runs[run] = self._read(run)
        return self._runs[run]

    def _read(self, run: str) -> dict[tuple[str, int], str] | None:
        path = self._path(run)
        if path is None or not path.exists():
            return {}
        text = path.read_bytes().decode("ascii", errors="replace")
        digests: dict[tuple[str, int], str] = {}
        for line in text.split("\n")[:-1]:  # the part after the last line end: cut in writing, never released
            match = _LINE.fullmatch(line)
            if match is None:
                log.warning("node %d: its release record %s is damaged; it releases nothing more in run %s",
                            self.node, path.name, run)
                return None
            digests.setdefault((match[1], int(match[2])), match[3])
        return digests

    def allows(self, run: str, kind: str, round_index: int, digest: str) -> bool:
        """Whether a step of ``kind`` for ``round_index`` of ``run`` on the input ``digest`` may
        release: never released, or released on this very input (then the step recomputes the
        same release from the same input and the same streams: nothing new). Logs a refusal."""
        digests = self._of(run)
        recorded = None if digests is None else digests.get((kind, round_index), digest)
        if recorded == digest:
            return True
        self.refused += 1
        log.warning("node %d refuses round %d of run %s: asked on a different model than the one released on "
                    "(a second release would share its noise)", self.node, round_index, run)
        return False

    def record(self, run: str, kind: str, round_index: int, digest: str) -> None:
        """Record that ``kind`` of ``round_index`` is released on ``digest``, on disk (fsynced)
        before the release is logged or sent (write-ahead); once per round."""
        digests = self._of(run)
        if digests is None or (kind, round_index) in digests:
            return
        path = self._path(run)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, f"{kind} {int(round_index)} {digest}\n".encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        digests[(kind, round_index)] = digest
