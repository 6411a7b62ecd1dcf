"""A run's summary.json, the contract other tools read: its keys (:data:`SUMMARY_KEYS`), the
sha256 it carries over the rest of it, and :func:`read_summary`, which trusts none of it before
the file, its JSON, its digest and its fields' types and ranges are checked."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from testbed.errors import UserError
from testbed.util.jsontext import finite
from testbed.util.numbers import finite_real
from testbed.util.userfiles import read_text

SUMMARY_KEYS = ("algorithm", "mode", "seed", "status", "rounds", "final", "nodes", "budgets")
STATUSES = ("completed", "stopped_budget", "failed")


class UnverifiedSummary(UserError):
    """A summary.json without a sha256, or whose content does not match it: nothing in it is
    trusted (`testbed runs` lists the run as "unverified", with no figures)."""



#: Bytes of a summary.json read at most (about a million nodes' entries); past it, refused unread.
MAX_SUMMARY_BYTES = 1 << 30
#: The summary's figures that are shares (accuracies): in [0, 1] or null.
_SHARES = ("test_accuracy", "test_accuracy_pooled", "validation_accuracy")


def read_summary(run_dir: Path) -> dict[str, Any]:
    """A run's summary.json, checked: a regular file of at most MAX_SUMMARY_BYTES, JSON, a sha256
    that matches its content (else :class:`UnverifiedSummary`), the SUMMARY_KEYS with values of
    their types and ranges (a status of STATUSES, counts, accuracies in [0, 1]). Non-finite
    numbers (a diverged loss in a summary of an older testbed) come back as None, so whatever
    prints it prints valid JSON. UserError naming the file otherwise."""
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        raise UserError(f"{Path(run_dir)} has no summary.json; not a run directory")
    try:
        summary = json.loads(read_text(path, MAX_SUMMARY_BYTES, "summary"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: damaged: not JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:  # arrays nested thousands deep: the JSON parser recurses per level
        raise UserError(f"{path}: damaged: nested too deeply") from None
    except UserError as exc:
        raise UserError(f"{path}: unreadable ({str(exc).removeprefix(f'summary {path}: ')})") from None
    if not isinstance(summary, dict):
        raise UserError(f"{path}: damaged: not a JSON object")
    digest = summary.get("sha256")
    if digest is None:
        raise UnverifiedSummary(f"{path}: unverified: it has no sha256, so none of its figures is trusted")
    canonical = _canonical({k: v for k, v in summary.items() if k != "sha256"})
    if digest != hashlib.sha256(canonical.encode()).hexdigest():
        raise UnverifiedSummary(f"{path}: unverified: its content does not match its sha256, so none of its "
                                "figures is trusted")
    missing = [k for k in SUMMARY_KEYS if k not in summary]
    if missing:
        raise UserError(f"{path}: damaged: lacks {', '.join(missing)}")
    # A non-finite float is written NaN, Infinity or -Infinity in the digest's JSON: without
    # one, the walk that makes them None has nothing to do (10,000 nodes: 0.05 s of a 0.2 s read).
    if "NaN" in canonical or "Infinity" in canonical:
        summary = finite(summary)
    wrong = _wrong_field(summary)
    if wrong is not None:
        raise UserError(f"{path}: damaged: {wrong}")
    return summary


def _wrong_field(summary: dict[str, Any]) -> str | None:
    """What of a summary's SUMMARY_KEYS is not of its type or range (one phrase), or None."""
    for key in ("algorithm", "mode"):
        if not isinstance(summary[key], str):
            return f"{key} must be a name, got {type(summary[key]).__name__}"
    if summary["status"] not in STATUSES:
        return f"status must be one of {', '.join(STATUSES)}, got {str(summary['status'])[:20]!r}"
    for key in ("seed", "rounds"):
        value = summary[key]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            return f"{key} must be a count, got {str(value)[:20]!r}"
    for key in ("final", "nodes", "budgets"):
        if not isinstance(summary[key], dict):
            return f"{key} must be an object, got {type(summary[key]).__name__}"
    for key, value in summary["final"].items():
        if value is None:
            continue
        if finite_real(value) is None:
            return f"final.{key} must be a finite number, got {value!r:.40}"
        if key in _SHARES and not 0.0 <= value <= 1.0:
            return f"final.{key} must be in [0, 1], got {value:g}"
    return None


def summary_digest(body: dict[str, Any]) -> str:
    """The sha256 a summary carries, over the rest of it (canonical JSON: sorted keys, no spaces)."""
    return hashlib.sha256(_canonical(body).encode()).hexdigest()


def _canonical(body: dict[str, Any]) -> str:
    """The JSON :func:`summary_digest` hashes: sorted keys, no spaces, a non-finite float as json
    writes it (NaN, Infinity)."""
    # json-ok: a digest, never printed; a summary of an older testbed holds NaN (a diverged loss) under it
    return json.dumps(body, sort_keys=True, separators=(",", ":"))
