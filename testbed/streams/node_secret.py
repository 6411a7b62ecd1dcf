"""A node's secret: the key of its private draws, which the coordinator never holds.

Every draw a privacy guarantee rests on (DP noise, the mini-batch selection amplification needs, a
noised quality score, DWFL's artificial noise: :data:`testbed.streams.rng.PRIVATE_PURPOSES`) is keyed by
the node's secret when it has one, so nobody holding the run's seed (whoever runs the coordinator,
anyone who reads the experiment a round carries) can regenerate it and subtract it from a release.
Public draws (data, initialisation, channel, topology, sampling of clients...) stay keyed by the
run's seed alone, so a board with a secret still trains on the same data and the same plan.

A real board makes its secret once, on the board, at the first start of `testbed node`
(:func:`load_or_make`): 256 bits of ``os.urandom`` in ``node-secret.key`` of its state directory,
mode 0600. It is never sent and never logged (its repr hides it); the board's owner can reproduce
the board's draws from it. Emulated nodes (sim, `testbed nodes`, a virtual board, `testbed node
--reproducible`) have none: their private streams keep the run-seed key, so sim and MQTT agree bit
for bit, and the run says its ε does not hold against anyone holding the seed (:data:`RUN_SEED`).

A stream's key under a secret is HMAC-SHA256(secret, tag ‖ seed ‖ node ‖ round ‖ purpose): a
pseudo-random function of the secret, so knowing the seed and every other stream's key (a board's
other rounds, another board's secret) says nothing of it.

Example::

    >>> a, b = NodeSecret(bytes(32)), NodeSecret(bytes([1]) * 32)
    >>> a.stream_words(7, 3, 0, 4) != b.stream_words(7, 3, 0, 4)
    True
    >>> repr(a)
    'NodeSecret(<hidden>)'
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import stat
import struct
from pathlib import Path
from typing import Mapping, Optional

from testbed.errors import UserError

log = logging.getLogger(__name__)

#: A node's randomness, as it tells the coordinator and as the summary says it.
NODE_SECRET = "node_secret"  # a key made on the board that the coordinator never holds
RUN_SEED = "run_seed"  # derived from the run's seed: reproducible, and derivable by whoever holds the seed
RANDOMNESS = (NODE_SECRET, RUN_SEED)
#: The server's noise under a secret of the coordinator's (summary.json's ``server_randomness``).
SERVER_SECRET = "server_secret"

#: Bytes of a secret: 256 bits.
SECRET_BYTES = 32
#: The key file's name in a board's state directory.
KEY_FILE = "node-secret.key"
#: The coordinator's secret for the server's own noise, in the run directory (mode 0600): a resume
#: draws each round's server noise again from it, so a round re-run releases the same broadcast.
SERVER_KEY_FILE = "server-secret.key"

_STREAM_TAG = b"testbed.streams.rng.stream\x00"  # domain separation: a stream key (numpy's SeedSequence)
_PHILOX_TAG = b"testbed.streams.counter_rng\x00"  # and a Philox key (a microcontroller's round)
_RUN_TAG = b"testbed.run\x00"  # and a run's own secret (NodeSecret.for_run)


class NodeSecret:
    """A node's 256-bit secret. Its bytes are never part of its repr or str (a log line, a
    traceback's locals), and it is never pickled or sent: nothing of the node that leaves it
    carries one."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes):
        if not isinstance(key, bytes) or len(key) != SECRET_BYTES:
            raise ValueError(f"a node secret is {SECRET_BYTES} bytes")
        self._key = key

    def __repr__(self) -> str:
        return "NodeSecret(<hidden>)"

    __str__ = __repr__

    def __reduce__(self):  # a secret crosses no process boundary, not even to a worker
        raise TypeError("a node secret is not pickled")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NodeSecret) and hmac.compare_digest(self._key, other._key)

    def __hash__(self) -> int:
        return hash(hmac.new(self._key, b"hash", hashlib.sha256).digest()[:8])

    def _mac(self, tag: bytes, seed: int, node: int, round_index: int, purpose: int) -> bytes:
        # Signed 64-bit fields: node and round may be the -1 sentinels; a seed is < 2^64 (limits.py).
        message = tag + struct.pack(">Qqqq", int(seed) & (2**64 - 1), int(node), int(round_index), int(purpose))
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def for_run(self, run: str) -> "NodeSecret":
        """The secret of this board's draws in the run ``run``: HMAC-SHA256(secret, tag ‖ run id).
        A server that opens another run (same seed, another model) gets other noise, so two
        releases of one round in two runs never share a draw; within a run, a round is released on
        one input only (nodes/release_record.py). The board's owner derives it from the key file."""
        return NodeSecret(hmac.new(self._key, _RUN_TAG + run.encode("utf-8"), hashlib.sha256).digest())

    def stream_words(self, seed: int, node: int, round_index: int, purpose: int) -> list[int]:
        """The eight 32-bit words that key ``node``'s (seed, round, purpose) stream under this
        secret (:func:`testbed.streams.rng.stream`)."""
        return list(struct.unpack(">8I", self._mac(_STREAM_TAG, seed, node, round_index, purpose)))

    def philox_seed(self, seed: int, node: int, round_index: int) -> int:
        """The 64-bit Philox key of ``node``'s round on a microcontroller (testbed.streams.counter_rng):
        what the bridge sends the board in place of the run's seed, the board's firmware unchanged.
        Its counter still carries (block, node, round, purpose), so BATCH and NOISE stay apart."""
        return struct.unpack(">Q", self._mac(_PHILOX_TAG, seed, node, round_index, 0)[:8])[0]


#: node id → its secret; a node absent (an emulated one) draws from the run seed.
Secrets = Mapping[int, NodeSecret]


def randomness_of(secrets: Optional[Secrets], node: int) -> str:
    """:data:`NODE_SECRET` when ``node`` draws from a secret of ``secrets``, else :data:`RUN_SEED`."""
    return NODE_SECRET if secrets and int(node) in secrets else RUN_SEED


def load_or_make(state_dir: Path, key_file: str = KEY_FILE) -> NodeSecret:
    """The board's secret from ``state_dir/node-secret.key`` (the coordinator's server secret:
    ``key_file`` :data:`SERVER_KEY_FILE` in the run directory), made there on first use
    (``os.urandom``, mode 0600). It is written whole under a temporary name and then linked into
    place, so a node started beside it (two node ids of one board) reads a whole key or makes it.

    Raises:
        UserError: one line, never the key: the file is readable by the group or others, is not
            exactly 32 bytes, is not a regular file, or cannot be read or made.
    """
    path = Path(state_dir) / key_file
    if os.path.lexists(path):
        return _read(path)
    partial = path.with_name(f".{key_file}.{os.getpid()}.{os.urandom(4).hex()}")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(os.urandom(SECRET_BYTES))
            out.flush()
            os.fsync(out.fileno())
        os.link(partial, path)  # fails if another node made it meanwhile: that one is used
        log.info("made the %s in %s (mode 0600): the private draws it keys are its holder's own", _what(path), path)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UserError(f"{_what(path)} {path}: cannot make it ({exc.strerror or exc})") from None
    finally:
        with contextlib.suppress(OSError):
            partial.unlink()
    return _read(path)


def _what(path: Path) -> str:
    """How a one-line refusal names the key: "node secret" or "server secret"."""
    return "server secret" if path.name == SERVER_KEY_FILE else "node secret"


def _read(path: Path) -> NodeSecret:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise UserError(f"{_what(path)} {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"{_what(path)} {path}: not a regular file; remove it and the node makes a new one")
        if info.st_mode & 0o077:
            raise UserError(f"{_what(path)} {path}: mode {stat.S_IMODE(info.st_mode):04o} lets others read it; "
                            f"it may be known, so it is not used: remove it (a new one is made) or chmod 600 it "
                            f"if nobody else could have read it")
        key = os.read(fd, SECRET_BYTES + 1) if info.st_size == SECRET_BYTES else b""
    except OSError as exc:
        raise UserError(f"{_what(path)} {path}: cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(key) != SECRET_BYTES:
        raise UserError(f"{_what(path)} {path}: {info.st_size} bytes, not {SECRET_BYTES}; remove it and the node "
                        f"makes a new one")
    return NodeSecret(key)
