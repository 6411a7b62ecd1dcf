"""End-to-end message authentication of the MQTT transport, independent of the broker.

Every frame a client publishes (a whole wire message, each chunk frame of a chunked one, a status
and the last will) is sealed; a receiver opens it before anything else (before the payload is
parsed, before a chunk is buffered, before a replay window or an online status moves) and drops
it, counted, when it does not verify. Layout of a sealed frame (integers little-endian)::

    0   4 bytes   magic b"TBA1"
    4   uint8     S, the session's length (0..64)
    5   S bytes   session (ASCII, testbed.mqtt.wire.ID_PATTERN, or empty: a board's status)
    ..  uint64    round (the wire message's; a status's: its connection epoch)
    ..  uint16    T, the number of tags (>= 1)
    ..  T x       [uint8 L, L bytes key id (a node id or "channel"), 16-byte tag]
    ..            the body: a wire message, a chunk frame, or b"online" / b"offline"

    digest = SHA-256("tb-mac-v1" | len(topic) | topic | S | session | round | body)
    tag    = HMAC-SHA256(session key of the key id, digest)[:16]

Keys: a 32-byte base key per node (and one for the channel emulator), which the node and the
coordinator's process share; the key of a session is HMAC-SHA256(base, "tb-session-key-v1" | run |
0 | session), so every run and every session MACs with its own key (a frame of another run or
session does not verify). A node's frames carry one tag (its own key); the coordinator's carry one
per reader: on a node's downlink that node's, on the broadcast every node's (each checks its own;
SHA-256 of the body once, then 32-byte HMACs: ~1 µs per node). Truncated to 128 bits as in RFC
4868. HMAC, not signatures: Python's standard library has it on every board (Ed25519 needs the
`cryptography` wheel, which the node extra does not require), and a symmetric key per node is
what provisioning already distributes (docs/wire-protocol.md, "Authentication").

Statuses and wills are fixed at connect time, so they carry a connection epoch (a process-wide
increasing number of nanoseconds) in the round field: a reader keeps each writer's latest epoch
(:class:`StatusEpochs`), takes an ``online`` of a newer one and an ``offline`` of the current or a
newer one; a replayed will of an earlier connection (or session: another key) moves nothing.

Example::

    >>> keys = Keys("r1", {"3": bytes(32)})
    >>> frame = seal(keys, "tb/v1/r1/up/3", ["3"], "s1", 7, b"body")
    >>> opened = open_sealed(keys, "tb/v1/r1/up/3", "3", frame)
    >>> opened.session, opened.round, bytes(opened.body)
    ('s1', 7, b'body')
    >>> open_sealed(keys, "tb/v1/r1/up/4", "3", frame)
    Traceback (most recent call last):
    ...
    testbed.mqtt.auth.Forged: forged: the tag for '3' does not verify
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import struct
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from testbed.errors import UserError
from testbed.mqtt import topics
from testbed.mqtt.wire import ID_PATTERN, WireError
from testbed.util.frozen import frozen

log = logging.getLogger(__name__)

MAGIC = b"TBA1"
KEY_BYTES = 32
TAG_BYTES = 16
MAX_SESSION_CHARS = 64
_ROUND = struct.Struct("<QH")  # round (or epoch), tag count
_ROUND_ONLY = struct.Struct("<Q")
_TOPIC_LENGTH = struct.Struct("<H")
_KEY_DOMAIN = b"tb-node-key-v1\x00"
_SESSION_DOMAIN = b"tb-session-key-v1\x00"
_MAC_DOMAIN = b"tb-mac-v1\x00"
_SESSION = re.compile(rb"(?:[A-Za-z0-9][A-Za-z0-9_.-]{0,63})?")
#: The environment variable through which a run hands the nodes it starts their keys file.
KEYS_ENV = "TESTBED_NODE_KEYS"
#: Set to "1" by a run with mqtt.authenticate = false for the nodes it starts: they go unsealed too.
NO_AUTH_ENV = "TESTBED_NO_AUTH"
_HEX_KEY = re.compile(r"[0-9a-f]{64}")


class Forged(WireError):
    """A frame that does not verify: no seal, a malformed one, no tag for the reader, a wrong tag."""

    def __init__(self, reason: str):
        super().__init__("forged", reason)


class Keys:
    """The base keys one party holds (principal -> 32 bytes) for one run, and the session keys
    derived from them (kept for the last few sessions). Never printed: ``repr`` names principals only."""

    def __init__(self, run: str, base: Mapping[str, bytes]):
        for principal, key in base.items():
            if not ID_PATTERN.fullmatch(principal) or len(key) != KEY_BYTES:
                raise ValueError(f"a key for {principal!r} must be {KEY_BYTES} bytes under an id")
        self.run = run
        self._base = dict(base)
        self._derived: collections.OrderedDict[tuple[str, str], bytes] = collections.OrderedDict()
        self._pads: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_run_key(cls, run: str, run_key: bytes, principals: Iterable[str]) -> Keys:
        """Each principal's base key derived from one run key (the run's own emulated boards)."""
        return cls(run, {p: node_key(run_key, p) for p in principals})

    def __repr__(self) -> str:
        return f"Keys(run={self.run!r}, principals={len(self._base)})"

    def principals(self) -> list[str]:
        return list(self._base)

    def holds(self, principal: str) -> bool:
        return principal in self._base

    def only(self, principals: Iterable[str]) -> Keys:
        """The keys of ``principals`` alone (what one host of the run is given)."""
        return Keys(self.run, {p: self._base[p] for p in principals})

    def with_key(self, principal: str, key: bytes) -> Keys:
        """These keys and ``principal``'s."""
        return Keys(self.run, {**self._base, principal: key})

    def session_key(self, principal: str, session: str) -> bytes:
        """HMAC-SHA256(base key, domain | run | 0 | session); KeyError if the principal's key is not held."""
        key = self._derived.get((principal, session))  # a dict read is atomic: the lock only guards a derivation
        if key is not None:
            return key
        with self._lock:
            key = self._derived.get((principal, session))
            if key is None:
                key = hmac.new(self._base[principal], _SESSION_DOMAIN + self.run.encode() + b"\x00" + session.encode(),
                               hashlib.sha256).digest()
                self._derived[(principal, session)] = key
                while len(self._derived) > 4 * max(16, len(self._base)):
                    self._derived.popitem(last=False)
            return key

    def pads(self, principal: str, session: str) -> tuple[Any, Any]:
        """SHA-256 states of the session key XOR ipad and XOR opad (HMAC's inner and outer hash, RFC 2104)."""
        got = self._pads.get((principal, session))
        if got is None:
            key = self.session_key(principal, session).ljust(64, b"\x00")
            got = (hashlib.sha256(bytes(b ^ 0x36 for b in key)), hashlib.sha256(bytes(b ^ 0x5C for b in key)))
            with self._lock:
                self._pads[(principal, session)] = got
                while len(self._pads) > 4 * max(16, len(self._base)):
                    self._pads.pop(next(iter(self._pads)))
        return got

    def to_json(self) -> str:
        """The keys file's text: {principal: 64 hex digits}."""
        return json.dumps({p: k.hex() for p, k in self._base.items()}, indent=2, allow_nan=False) + "\n"


def node_key(run_key: bytes, principal: str) -> bytes:
    """A principal's base key derived from a run key."""
    return hmac.new(run_key, _KEY_DOMAIN + principal.encode(), hashlib.sha256).digest()


def new_key() -> bytes:
    """A fresh random 32-byte key."""
    return secrets.token_bytes(KEY_BYTES)


def write_keys(path: Path, keys: Keys) -> Path:
    """Write a keys file, created with mode 0600 (its folder is the caller's to protect)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(keys.to_json())
    return path


def load_keys(path: str | Path, run: str, what: str = "keys") -> Keys:
    """A keys file ({principal: 64 hex digits}); one line (UserError) if it is missing or malformed,
    never echoing a key."""
    path = Path(path)
    try:
        if path.stat().st_size > 1 << 24:
            raise UserError(f"{what} {path}: over 16 MiB, not a keys file")
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{what} {path}: cannot read it ({getattr(exc, 'strerror', None) or type(exc).__name__})") from None
    if not isinstance(data, dict) or not data:
        raise UserError(f"{what} {path}: not a keys file of `testbed provision` (a JSON object of node id -> key)")
    base = {}
    for principal, value in data.items():
        if not ID_PATTERN.fullmatch(principal) or not isinstance(value, str) or not _HEX_KEY.fullmatch(value):
            raise UserError(f"{what} {path}: the entry {principal[:64]!r} is not a node id with 64 hex digits")
        base[principal] = bytes.fromhex(value)
    return Keys(run, base)


# ---- sealing and opening --------------------------------------------------------------------------

# The last frame's digest in this process: a broadcast reaches every client of a host, each with its
# own copy of the same bytes; SHA-256 of a large body is computed once for all of them.
_last_digest: tuple[bytes, str, bytes] | None = None


def _digest(topic: str, session: bytes, round_index: int, body: bytes | memoryview) -> bytes:
    t = topic.encode()
    h = hashlib.sha256(b"".join((_MAC_DOMAIN, _TOPIC_LENGTH.pack(len(t)), t, bytes((len(session),)), session,
                                 _ROUND_ONLY.pack(round_index))))
    h.update(body)
    return h.digest()


def tag(keys: Keys, principal: str, session: str, digest: bytes) -> bytes:
    """HMAC-SHA256(session key, digest)[:16] (RFC 2104) from the key's inner and outer states, hashed
    once per key: 2 µs a tag where hmac.digest takes 3.3 (a broadcast carries one per node)."""
    inner, outer = keys.pads(principal, session)
    i = inner.copy()
    i.update(digest)
    o = outer.copy()
    o.update(i.digest())
    return o.digest()[:TAG_BYTES]


def overhead(principals: Sequence[str], session: str) -> int:
    """Bytes a seal adds to a body."""
    return len(MAGIC) + 1 + len(session) + _ROUND.size + sum(1 + len(p) + TAG_BYTES for p in principals)


def seal(keys: Keys, topic: str, principals: Sequence[str], session: str, round_index: int,
         body: bytes | memoryview) -> bytes:
    """``body`` sealed for the readers of ``principals`` (one tag each, with its session key)."""
    s = session.encode()
    if not _SESSION.fullmatch(s) or not 0 <= round_index < 2**64 or not principals:
        raise ValueError(f"cannot seal session {session!r}, round {round_index}, for {len(principals)} reader(s)")
    digest = _digest(topic, s, round_index, body)
    parts = [MAGIC, bytes([len(s)]), s, _ROUND.pack(round_index, len(principals))]
    for p in principals:
        pid = p.encode()
        parts += [bytes([len(pid)]), pid, tag(keys, p, session, digest)]
    parts.append(body)
    return b"".join(parts)


@dataclasses.dataclass(frozen=True)
class Opened:
    """A frame that verified: its session, round (a status's epoch) and body."""

    session: str
    round: int
    body: bytes


def open_sealed(keys: Keys, topic: str, principal: str, frame: bytes) -> Opened:
    """Verify ``frame`` received on ``topic`` with ``principal``'s key; Forged (changing nothing)
    unless its seal is well formed and the tag for ``principal`` verifies."""
    global _last_digest
    if not keys.holds(principal):
        raise Forged(f"no key for {principal!r} here")
    view = memoryview(frame)
    if len(frame) < len(MAGIC) + 1 or view[:4] != MAGIC:
        raise Forged("not sealed")
    n = frame[4]
    at = 5 + n
    session_raw = bytes(view[5:at])
    if n > MAX_SESSION_CHARS or len(session_raw) != n or not _SESSION.fullmatch(session_raw):
        raise Forged("malformed seal (session)")
    if len(frame) < at + _ROUND.size:
        raise Forged("malformed seal (truncated)")
    round_index, count = _ROUND.unpack_from(frame, at)
    at += _ROUND.size
    want = principal.encode()
    got = None
    for _ in range(count):
        if at >= len(frame):
            raise Forged("malformed seal (truncated tags)")
        length = frame[at]
        end = at + 1 + length + TAG_BYTES
        if length == 0 or end > len(frame):
            raise Forged("malformed seal (truncated tags)")
        if got is None and view[at + 1:at + 1 + length] == want:
            got = bytes(view[end - TAG_BYTES:end])
        at = end
    if got is None:
        raise Forged(f"no tag for {principal!r}")
    body = frame[at:] if isinstance(frame, bytes) else bytes(view[at:])
    session = session_raw.decode()
    last = _last_digest
    if last is not None and last[1] == topic and last[0] == frame:
        digest = last[2]
    else:
        digest = _digest(topic, session_raw, round_index, body)
        if isinstance(frame, bytes):
            _last_digest = (frame, topic, digest)
    if not hmac.compare_digest(got, tag(keys, principal, session, digest)):
        raise Forged(f"the tag for {principal!r} does not verify")
    return frozen(Opened, {"session": session, "round": round_index, "body": body})  # its __init__ 3x slower


def unverified_body(frame: bytes) -> bytes:
    """The body of a sealed frame, NOT verified (what anyone on the broker reads: seals protect
    integrity and origin, not secrecy); ``frame`` itself if it is not sealed. For tools and tests
    that watch a run, never for a receiver."""
    if frame[:4] != MAGIC or len(frame) < 5:
        return frame
    at = 5 + frame[4]
    if len(frame) < at + _ROUND.size:
        return frame
    _, count = _ROUND.unpack_from(frame, at)
    at += _ROUND.size
    for _ in range(count):
        if at >= len(frame):
            return frame
        at += 1 + frame[at] + TAG_BYTES
    return frame[at:]


# ---- who tags what --------------------------------------------------------------------------------

def readers(kind: str, node: str | None, keys: Keys, nodes_only: Iterable[str]) -> list[str]:
    """The key ids a writer tags a frame on a topic of ``kind`` (and ``node``) with: the node's own on
    its topics (up, tx, status, and what the coordinator or channel sends it alone: down, rx); every
    node's on the broadcast (``nodes_only``); every key held on the coordinator's status; the
    channel's on its round notices."""
    if node is not None:
        return [node]
    if kind == topics.CHAN:
        return [topics.CHANNEL]
    if kind == topics.BCAST:
        return list(nodes_only)
    return keys.principals()  # coord: every node and the channel


def reader_key(kind: str, node: str | None, me: str | None) -> str | None:
    """Whose key a frame received on a topic of ``kind`` (and ``node``) is checked with: the topic's
    node where it names one, the channel's on its round notices, else the receiver's own (a
    broadcast, the coordinator's status)."""
    if node is not None:
        return node
    if kind == topics.CHAN:
        return topics.CHANNEL
    return me


# ---- statuses: connection epochs ------------------------------------------------------------------

_epoch_lock = threading.Lock()
_last_epoch = 0


def new_epoch() -> int:
    """A connection epoch: nanoseconds since 1970, and above every epoch this process made before."""
    global _last_epoch
    with _epoch_lock:
        _last_epoch = max(_last_epoch + 1, time.time_ns())
        return _last_epoch


#: StatusEpochs.take of a copy of the writer's current state: dropped without a word.
SAME = ""


class StatusEpochs:
    """Each status writer's latest connection epoch: an ``online`` of a newer epoch is taken, an
    ``offline`` of a newer one or of the current one while it is online (its will, or its clean
    close); anything else is a replay (a will of an earlier connection, a copy) and moves nothing.
    Bounded by the writers (each must have verified)."""

    def __init__(self) -> None:
        self._latest: dict[str, tuple[int, bool]] = {}  # writer -> (epoch, online)

    def take(self, writer: str, epoch: int, online: bool) -> str | None:
        """None if the status is taken (and remembered), :data:`SAME` for a copy of the current one,
        else why not."""
        latest = self._latest.get(writer)
        if latest == (epoch, online):
            return SAME
        if latest is not None and (epoch < latest[0] or (epoch == latest[0] and (online or not latest[1]))):
            return f"status of connection epoch {epoch} is not newer than what epoch {latest[0]} said (a replay)"
        self._latest[writer] = (epoch, online)
        return None


# ---- rejections: counted, logged at a bounded rate --------------------------------------------------

class RejectLog:
    """Counts rejected frames and logs them at most once per ``interval_s`` per (sender, kind), with
    how many came since the last line: a flood of forged frames writes a few lines, not one each.
    At most ``max_keys`` (sender, kind) pairs are told apart (beyond, they share one line)."""

    def __init__(self, who: str, interval_s: float = 10.0, max_keys: int = 256, clock=time.monotonic):
        self.who = who
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._clock = clock
        self._last: dict[tuple[str, str], tuple[float, int]] = {}  # key -> (when logged, suppressed since)
        self.count = 0

    def reject(self, sender: str, kind: str, reason: str) -> None:
        self.count += 1
        key = (sender, kind) if (sender, kind) in self._last or len(self._last) < self.max_keys else ("*", "*")
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last[0] < self.interval_s:
            self._last[key] = (last[0], last[1] + 1)
            return
        more = f" (and {last[1]} more since the last line)" if last is not None and last[1] else ""
        log.warning("%s: dropped a frame on %s claiming to be from %s that does not authenticate: %s%s; "
                    "at most one such line per %g s per sender", self.who, kind, sender, reason, more, self.interval_s)
        self._last[key] = (now, 0)
