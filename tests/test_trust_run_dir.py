"""Run-directory files at resume, fuzzed: whatever damage a file of a killed run takes, `testbed run
--resume` either refuses in one line naming that file and leaves every file byte-identical, or
resumes correctly: the run completes, and its ledger under-counts neither what the uninterrupted
run charged nor what the damaged ledger held.

One tiny sim run per algorithm (3 synthetic nodes, 4 rounds) is killed while saving its third
checkpoint, so ledger.csv and metrics.csv hold a round past the checkpoint's mark; it is built once
per module and copied for every example. Damages are drawn per file: truncation at any byte or line end, random bytes
spliced in, a field set to an extreme (1e308, 2**70, NaN, inf, a wrong type), a line duplicated
or two swapped, the file deleted or emptied; a checkpoint's metadata and state are also forged with
a valid digest, so the checks after the digest see them.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from hypothesis import given, strategies as st

from testbed.assembly.config import load_config_text
from testbed.cli import main
from testbed.ledger.files import LEDGER_COLUMNS, parse_rows
from testbed.orchestration.runner import run_experiment
from testbed.reports.checkpoint import checkpoint_digest
from testbed.reports.results import read_checkpoint, read_summary

from run_dir_cases import DETERMINISTIC, ledger_rows, missed_twice, run_killed, snapshot, spent_once, under_counted

COMMON = """
[run]
name = "trust"
seed = 7
[data]
dataset = "synthetic"
num_nodes = 3
samples_per_node = 20
dim = 4
[privacy]
tight_accountant = "none"
[output]
figures = false
checkpoint_every = 1
"""
#: Each algorithm's section, for 4 rounds. Every file is fuzzed with DP-PASGD; the ledger and the
#: checkpoint with every algorithm too (setup uploads, mutual-information events, server events).
SECTIONS = {
    "dp_pasgd": "[dp_pasgd]\nsteps = 8\ntau = 2\nbatch = 4\nlr = 0.5\nsigma = 1.0\nclip = true\nlipschitz = 1.0\n",
    "fedavg": "[fedavg]\nrounds = 4\nlocal_steps = 2\nbatch = 4\nlr = 0.5\n",
    "dwfl": '[dwfl]\nrounds = 4\nbatch = 4\nlr = 0.2\nepsilon = 1.0\nfading = "none"\nc_scale = 0.6\n',
    "acfl": '[model]\nkind = "linear"\n[acfl]\niterations = 4\nlr = 0.01\nsigma1_sq = 0.5\nsigma2_sq = 0.5\n',
    "padpfl": '[padpfl]\nrounds = 4\nuploads = 4\nlocal_steps = 2\nbatch = 4\nlr = 0.5\nclip = 2.0\n'
              'epsilon = 20.0\nimpact = "given"\nweights = [0.2, 0.3, 0.5]\n',
}
KILLED_AT = 3  # killed while saving its third checkpoint: a round's rows lie past the mark
FILES = ("checkpoint.npz", "config.toml", "ledger.csv", "metrics.csv", "asked.csv", "summary.json", ".lock")
# Files a resume does not trust or need (it rewrites the summary; the lock holds no data): any
# damage to them must resume.
NOT_READ = ("summary.json", ".lock")
EXTREME_TEXT = ("1e308", "-1e308", "1.7976931348623157e308", "1e309", str(2**70), str(-2**70), "nan", "NaN",
                "inf", "-inf", "-0", "0", "-1", "1e-308", "5e-324", "", "True", "null", '"x"', "[]", "0x10", "1_0")
EXTREME_JSON = (1e308, -1e308, 2**70, -2**70, float("nan"), float("inf"), float("-inf"), -1, 0, 0.5, 2.0, None, True,
                "2", "", [], {}, [1, 2], "f" * 64, "0" * 64)


@pytest.fixture(scope="module")
def runs_of(tmp_path_factory) -> Callable[[str], dict[str, Path]]:
    """algorithm → its uninterrupted run ("full") and its killed one ("killed"), each built once."""
    built: dict[str, dict[str, Path]] = {}

    def runs(algorithm: str) -> dict[str, Path]:
        if algorithm not in built:
            base = tmp_path_factory.mktemp(algorithm)
            text = COMMON.replace("[run]\n", f'[run]\nalgorithm = "{algorithm}"\n') + SECTIONS[algorithm]
            config = load_config_text(text)
            run_experiment(config, out_dir=base / "full", quiet=True)
            run_killed(config, base / "killed", KILLED_AT)
            assert read_checkpoint(base / "killed").rounds_done < read_summary(base / "full")["rounds"]
            built[algorithm] = {"full": base / "full", "killed": base / "killed"}
        return built[algorithm]

    return runs


# --- damages: each draws what it does from ``data`` and returns the file's new bytes (None: deleted)

def _truncate(data: st.DataObject, raw: bytes) -> bytes:
    return raw[: data.draw(st.integers(0, len(raw)), label="keep bytes")]


def _truncate_at_line_end(data: st.DataObject, raw: bytes) -> bytes:
    """A write cut between two lines: what a kill leaves as often as a cut mid-line."""
    lines = _lines(raw)
    return b"".join(lines[: data.draw(st.integers(0, len(lines)), label="keep lines")])


def _splice(data: st.DataObject, raw: bytes) -> bytes:
    at = data.draw(st.integers(0, len(raw)), label="at")
    cut = data.draw(st.integers(0, 8), label="bytes replaced")
    junk = data.draw(st.binary(min_size=1, max_size=12) | st.sampled_from([b"\n", b",", b"\r\n", b"\x00", b'"']),
                     label="spliced")
    return raw[:at] + junk + raw[at + cut:]


def _lines(raw: bytes) -> list[bytes]:
    return raw.splitlines(keepends=True)


def _duplicate_line(data: st.DataObject, raw: bytes) -> bytes:
    lines = _lines(raw)
    if not lines:
        return raw
    i = data.draw(st.integers(0, len(lines) - 1), label="line duplicated")
    j = data.draw(st.integers(0, len(lines)), label="inserted at")
    return b"".join(lines[:j] + [lines[i]] + lines[j:])


def _swap_lines(data: st.DataObject, raw: bytes) -> bytes:
    lines = _lines(raw)
    if len(lines) < 2:
        return raw
    i, j = (data.draw(st.integers(0, len(lines) - 1), label=f"line {k}") for k in "ij")
    lines[i], lines[j] = lines[j], lines[i]
    return b"".join(lines)


def _extreme_cell(data: st.DataObject, raw: bytes) -> bytes:
    """A CSV cell, a TOML value or a JSON number set to an extreme or mistyped value, as text."""
    text = raw.decode("utf-8", errors="surrogateescape")
    spans = [m.span(1) for m in re.finditer(r"(?:^|[,=:\[]\s*)([-+0-9.eE]+|true|false|\"[^\"\n]*\")(?=\s*[,\n\r\]}]|$)",
                                            text, flags=re.M)]
    if not spans:
        return raw
    lo, hi = data.draw(st.sampled_from(spans), label="field")
    value = data.draw(st.sampled_from(EXTREME_TEXT), label="value")
    return (text[:lo] + value + text[hi:]).encode("utf-8", errors="surrogateescape")


def _emptied(data: st.DataObject, raw: bytes) -> bytes:
    return b""


def _deleted(data: st.DataObject, raw: bytes) -> None:
    return None


BYTE_DAMAGES: dict[str, Callable[[st.DataObject, bytes], bytes | None]] = {
    "truncate": _truncate, "truncate_at_line_end": _truncate_at_line_end, "splice": _splice,
    "extreme_field": _extreme_cell, "duplicate_line": _duplicate_line,
    "swap_lines": _swap_lines, "empty": _emptied, "delete": _deleted,
}


# A checkpoint forged with a valid digest is the checkpoint as written, as far as a resume can tell:
# one that does not fit another file (a mark, the config's digest, rounds the ledger's rows are past)
# may be refused naming that file.
_CHECKED_AGAINST = ("ledger.csv", "metrics.csv", "config.toml")


def _forge_checkpoint(data: st.DataObject, d: Path) -> tuple[str, ...]:
    """checkpoint.npz with one metadata field (or a state value) changed, and, when drawn, its
    digest recomputed: a hand-made file the digest does not catch. The files a refusal may name."""
    with np.load(d / "checkpoint.npz") as saved:
        members = {name: saved[name] for name in saved.files}
    meta = json.loads(members["meta"].tobytes())
    state = {k[len("state."):]: v for k, v in members.items() if k.startswith("state.")}
    paths = [(k,) for k in meta if k != "sha256"] + [(k, sub) for k in ("ledger", "metrics") for sub in meta[k]]
    paths += [("arrays", name, field) for name in meta["arrays"] for field in ("shape", "dtype")]
    target = data.draw(st.sampled_from(paths + [("state",)]), label="forged field")
    if target == ("state",):
        name = data.draw(st.sampled_from(sorted(state)), label="array")
        flat = state[name].reshape(-1).copy()
        flat[data.draw(st.integers(0, flat.size - 1), label="index")] = data.draw(
            st.sampled_from([np.nan, np.inf, -np.inf, 1e308, -1e308]), label="value")
        state[name] = flat.reshape(state[name].shape)
    else:
        holder = meta
        for key in target[:-1]:
            holder = holder[key]
        holder[target[-1]] = data.draw(st.sampled_from(EXTREME_JSON), label="value")
    names = ("checkpoint.npz",)
    if data.draw(st.booleans(), label="digest recomputed"):
        meta["sha256"] = checkpoint_digest(meta, state)
        names += _CHECKED_AGAINST
    members = {f"state.{k}": v for k, v in state.items()}
    members["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with open(d / "checkpoint.npz", "wb") as f:
        np.savez(f, **members)
    return names


def _damage(data: st.DataObject, d: Path, name: str) -> tuple[str, tuple[str, ...]]:
    """Damage ``name`` in ``d`` as drawn; what was done (for the failure message) and the files a
    refusal may name."""
    kinds = list(BYTE_DAMAGES) + (["forge"] if name == "checkpoint.npz" else [])
    kind = data.draw(st.sampled_from(kinds), label="damage")
    if kind == "forge":
        return kind, _forge_checkpoint(data, d)
    path = d / name
    raw = path.read_bytes()
    damaged = BYTE_DAMAGES[kind](data, raw)
    if damaged is None:
        path.unlink()
    else:
        path.write_bytes(damaged)
    return kind, (name,)


def _rows_held(ledger: Path) -> list[tuple] | None:
    """The deterministic fields of every whole, well-formed row the (damaged) ledger holds, or None
    when there is no such file or its last line is cut (a resume drops the rows past the mark then,
    and charges their round again)."""
    try:
        raw = ledger.read_bytes()
    except FileNotFoundError:
        return None
    if raw and not raw.endswith(b"\n"):
        return None
    held = []
    for line in _lines(raw)[1:]:
        try:
            held += [tuple(getattr(e, f, None) for f in DETERMINISTIC) for e in parse_rows(line.decode())]
        except (ValueError, UnicodeDecodeError):
            pass
    return held


def _resume(d: Path) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["run", "--resume", str(d), "--quiet"])
    return rc, err.getvalue().strip()


CASES = [("dp_pasgd", name) for name in FILES] + [
    (a, name) for a in SECTIONS if a != "dp_pasgd" for name in ("ledger.csv", "checkpoint.npz")]


@pytest.mark.parametrize("algorithm, name", CASES)
@given(data=st.data())
def test_a_damaged_file_is_refused_naming_it_and_nothing_changes_or_the_resume_is_correct(runs_of, algorithm, name,
                                                                                          data):
    runs = runs_of(algorithm)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "run"
        shutil.copytree(runs["killed"], d)
        what, named = _damage(data, d, name)
        before = snapshot(d)
        held = _rows_held(d / "ledger.csv")
        rc, err = _resume(d)
        assert "Traceback" not in err, err
        if rc != 0:
            assert name not in NOT_READ, f"{what} of {name}: refused: {err}"
            assert rc == 2, err
            assert "\n" not in err and err.startswith("testbed: "), err
            assert any(n in err for n in named), f"{what} of {name}: the refusal names none of {named}: {err}"
            assert snapshot(d) == before, f"{what} of {name}: refused, yet files changed"
            return
        summary, full = read_summary(d), read_summary(runs["full"])
        assert (summary["status"], summary["rounds"]) == ("completed", full["rounds"]), f"{what} of {name}"
        missing = under_counted(d, ledger_rows(runs["full"]))
        assert not missing, f"{what} of {name}: charged by the run, missing after the resume: {missing}"
        assert not missed_twice(d)
        if held is not None:
            lost = under_counted(d, held)
            assert not lost, f"{what} of {name}: in the ledger before the resume, gone after: {lost}"


@pytest.mark.parametrize("damage", ["sensitivity_lowered", "last_server_row_cut"])
def test_a_server_issued_row_past_the_mark_altered_or_cut_is_charged_again(runs_of, tmp_path, damage):
    """PADPFL's broadcast is charged by the server on each node's behalf. A row of it past the mark
    that a kill cut away, or that was altered to charge less, leaves the real release to be charged
    when the round runs again."""
    runs = runs_of("padpfl")
    d = tmp_path / "run"
    shutil.copytree(runs["killed"], d)
    mark = read_checkpoint(d).ledger_mark.size_bytes
    raw = (d / "ledger.csv").read_bytes()
    tail = _lines(raw[mark:])
    server = [i for i, line in enumerate(tail) if b",public,server," in line]
    assert len(server) == 3
    if damage == "sensitivity_lowered":
        cells = tail[server[0]].split(b",")
        cells[LEDGER_COLUMNS.index("sensitivity")] = b"1e-300"
        tail[server[0]] = b",".join(cells)
    else:
        tail = tail[: server[-1]]
    (d / "ledger.csv").write_bytes(raw[:mark] + b"".join(tail))
    rc, err = _resume(d)
    assert rc == 0, err
    assert not under_counted(d, ledger_rows(runs["full"]))
    assert len(spent_once(ledger_rows(d))) == len(ledger_rows(runs["full"])) + (damage == "sensitivity_lowered")


def test_the_cli_says_a_refusal_in_one_line(runs_of, tmp_path):
    """The command itself (a new interpreter): exit code 2 and one line on stderr naming the file."""
    d = tmp_path / "run"
    shutil.copytree(runs_of("dp_pasgd")["killed"], d)
    raw = (d / "ledger.csv").read_bytes()
    (d / "ledger.csv").write_bytes(raw[:40] + b"1e308" + raw[45:])  # inside the header, before the mark
    before = snapshot(d)
    done = subprocess.run([sys.executable, "-m", "testbed", "run", "--resume", str(d), "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("testbed: ") and "ledger.csv" in lines[0], done.stderr
    assert snapshot(d) == before
