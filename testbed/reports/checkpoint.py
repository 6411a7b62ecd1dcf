"""A run's checkpoint.npz: the algorithm's state after the last completed round and what it covers
(config.toml's sha256, and the marks of ledger.csv and metrics.csv), written atomically with a
sha256 over all of it, and read back only once every check passed (testbed.reports.results'
RunDirectory resumes from it)."""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Mapping

import numpy as np

from testbed.errors import UserError
from testbed.ledger.files import LedgerMark
from testbed.util import jsontext
from testbed.util.appendlog import Mark, swap_file, write_swapping
from testbed.util.oneline import one_line

CHECKPOINT_FORMAT = 3  # 1: one "state" array, no digest; 2: no rounds_ahead (neither can be resumed)
_MAX_ROUNDS_AHEAD = 10_000
_ARRAY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_STATE_PREFIX = "state."

# What an algorithm's state must look like: array name → (shape, dtype).
StateSpec = Mapping[str, "tuple[tuple[int, ...], np.dtype | str | type]"]


@dataclass(frozen=True)
class Checkpoint:
    """A checked checkpoint.

    Attributes:
        rounds_done: rounds completed when it was written, 0 <= rounds_done <= the planned rounds.
        state: the algorithm's state, array name → array (finite, the shapes and dtypes expected).
        ledger_mark: what ledger.csv held then. metrics_mark: what metrics.csv held then.
        config_sha256: sha256 of config.toml then.
        rounds_ahead: how many rounds may run before the next checkpoint: ledger rows past the mark
            may be of rounds ``rounds_done .. rounds_done + rounds_ahead - 1``.
    """

    rounds_done: int
    state: dict[str, np.ndarray]
    ledger_mark: LedgerMark
    metrics_mark: Mark
    config_sha256: str
    rounds_ahead: int = 1


def state_spec(state: Mapping[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The spec (name → (shape, dtype)) a state has, e.g. of the algorithm's initial state.

    Example::

        >>> state_spec({"model": np.zeros(3)})
        {'model': ((3,), dtype('float64'))}
    """
    return {name: (tuple(a.shape), a.dtype) for name, a in state.items()}


def write_checkpoint(path: Path, ckpt: Checkpoint, sync: bool = True) -> None:
    """Write ``ckpt`` to ``path`` atomically: an npz of the arrays ("state.NAME") and a "meta" JSON
    (format, rounds_done, arrays' shapes and dtypes, file marks, config digest, and a sha256 over
    all of it and the arrays' bytes)."""
    arrays = {}
    for name, value in ckpt.state.items():
        arr = np.ascontiguousarray(value)
        if not isinstance(name, str) or not _ARRAY_NAME.fullmatch(name):
            raise ValueError(f"state array name {name!r} is not an identifier")
        if arr.dtype.kind not in "biufc":
            raise ValueError(f"state array {name!r} has dtype {arr.dtype}; only numbers are checkpointed")
        arrays[name] = arr
    meta = {
        "format": CHECKPOINT_FORMAT,
        "rounds_done": int(ckpt.rounds_done),
        "arrays": {n: {"shape": list(a.shape), "dtype": a.dtype.str} for n, a in arrays.items()},
        "ledger": ckpt.ledger_mark.to_dict(),
        "metrics": ckpt.metrics_mark.to_dict(),
        "config_sha256": ckpt.config_sha256,
        "rounds_ahead": int(ckpt.rounds_ahead),
    }
    meta["sha256"] = checkpoint_digest(meta, arrays)
    members = {_STATE_PREFIX + n: a for n, a in arrays.items()}
    members["meta"] = np.frombuffer(jsontext.dumps(meta).encode(), dtype=np.uint8)
    write_swapping(path, lambda f: np.savez(f, **members), sync=sync)


def checkpoint_digest(meta: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over the metadata (without its digest) and every array's bytes, in name order."""
    # json-ok: a digest, never printed; a forged checkpoint's metadata may hold NaN, which must not raise here
    h = hashlib.sha256(json.dumps({k: v for k, v in meta.items() if k != "sha256"}, sort_keys=True).encode())
    for name in sorted(arrays):
        h.update(b"\0" + name.encode() + b"\0")
        h.update(memoryview(np.ascontiguousarray(arrays[name])).cast("B"))
    return h.hexdigest()


def load_checkpoint(run_dir: Path, expected: StateSpec | None, max_rounds: int | None,
                    unset: Collection[str] = ()) -> Checkpoint:
    """``run_dir``'s checkpoint.npz (or what its swap left), checked: a stored npz of our members
    whose metadata and arrays match its sha256, of this format, ``rounds_done`` within
    ``max_rounds``, the arrays ``expected`` (name → (shape, dtype)), all finite but the NaN of the
    ``unset`` ones; UserError naming the file and what failed otherwise."""
    path = swap_file(run_dir / "checkpoint.npz")
    if not path.exists():
        raise UserError(f"{path}: missing: no checkpoint (the run finished no round, or it was deleted); "
                        "refusing to resume")

    def damaged(how: str) -> UserError:
        return UserError(f"{path}: damaged: {how}; refusing to resume")

    try:
        with zipfile.ZipFile(path) as archive:
            unpacked_bytes = sum(info.file_size for info in archive.infolist())
        if unpacked_bytes > path.stat().st_size:  # what save_checkpoint writes is stored, not compressed
            raise ValueError(f"its members unpack to {unpacked_bytes} bytes, more than the file's "
                             f"{path.stat().st_size} (a compressed or forged archive)")
        with np.load(path, allow_pickle=False) as saved:
            members = {name: saved[name] for name in saved.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, RuntimeError) as exc:
        raise damaged(f"not a readable npz ({one_line(exc) or type(exc).__name__})") from None
    except Exception as exc:  # zlib.error and other codec errors of a mangled member
        raise damaged(f"not a readable npz ({type(exc).__name__}: {one_line(exc)})") from None
    raw_meta = members.pop("meta", None)
    if raw_meta is None or raw_meta.dtype != np.uint8 or raw_meta.ndim != 1:
        raise damaged("no metadata (a checkpoint of an older testbed, or not one of ours)")
    try:
        meta = json.loads(raw_meta.tobytes().decode())
        if not isinstance(meta, dict):
            raise ValueError("not an object")
        ledger_mark = LedgerMark.from_dict(meta.get("ledger"))
        metrics_mark = Mark.from_dict(meta.get("metrics"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise damaged(f"unreadable metadata ({one_line(exc)})") from None
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise damaged(f"format {meta.get('format')!r}, this testbed reads {CHECKPOINT_FORMAT}")
    state = {}
    for key, arr in members.items():
        if not key.startswith(_STATE_PREFIX):
            raise damaged(f"an unexpected member {key!r}")
        state[key[len(_STATE_PREFIX):]] = arr
    listed = meta.get("arrays")
    if not isinstance(listed, dict) or set(listed) != set(state):
        raise damaged("its arrays are not the ones its metadata lists")
    if meta.get("sha256") != checkpoint_digest(meta, state):
        raise damaged("its content does not match its sha256")
    # The digest matched: the file is what save_checkpoint wrote. What follows checks that it fits.
    rounds_done = meta.get("rounds_done")
    if not isinstance(rounds_done, int) or isinstance(rounds_done, bool) or rounds_done < 0 or (
            max_rounds is not None and rounds_done > max_rounds):
        raise UserError(f"{path}: rounds_done = {rounds_done!r} is outside 0..{max_rounds} of the planned "
                        "rounds; refusing to resume")
    config_sha = meta.get("config_sha256")
    if not isinstance(config_sha, str):
        raise damaged("no config.toml digest")
    rounds_ahead = meta.get("rounds_ahead")
    if not isinstance(rounds_ahead, int) or isinstance(rounds_ahead, bool) or not 1 <= rounds_ahead <= _MAX_ROUNDS_AHEAD:
        raise damaged(f"rounds_ahead = {rounds_ahead!r} is outside 1..{_MAX_ROUNDS_AHEAD}")
    if expected is not None:
        if set(expected) != set(state):
            raise UserError(f"{path}: holds arrays {sorted(state)}, the algorithm's state is {sorted(expected)}; "
                            "refusing to resume")
        for name, (shape, dtype) in expected.items():
            arr = state[name]
            if tuple(arr.shape) != tuple(shape) or arr.dtype != np.dtype(dtype):
                raise UserError(f"{path}: array {name!r} is {arr.dtype}{list(arr.shape)}, the algorithm expects "
                                f"{np.dtype(dtype)}{list(shape)}; refusing to resume")
    for name, arr in state.items():
        bad = ~np.isfinite(arr) if arr.dtype.kind in "fc" else None
        if bad is not None and name in unset:
            bad &= ~np.isnan(arr)  # its "not set yet"
        if bad is not None and bad.any():
            raise UserError(f"{path}: array {name!r} holds {int(bad.sum())} non-finite values "
                            "(a diverged run cannot be resumed); refusing to resume")
    return Checkpoint(rounds_done, state, ledger_mark, metrics_mark, config_sha, rounds_ahead)
