"""Calibration files written by `testbed calibrate`: measured c1 and c2 of a device, in joules and seconds.

Format (TOML)::

    [calibration]
    profile = "pi-zero-2w"     # device profile name, or "host"
    model_params = 202         # model size the costs were measured for
    [c1]                       # one communication round: upload + download of the model
    joules = 0.85
    seconds = 0.31
    [c2]                       # one local step
    joules = 0.012
    seconds = 0.004

With it, the cost model (8) C = c1·K/τ + c2·K is in joules or seconds per device instead of the
paper's abstract units, and so is the budget C_th.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from testbed.checked.limits import MAX_TEXT_FILE_BYTES
from testbed.errors import UserError
from testbed.util.numbers import finite_real
from testbed.util.userfiles import read_text

#: Units a calibration file gives c1 and c2 in.
COST_UNITS = ("joules", "seconds")


@dataclass(frozen=True)
class Calibration:
    """Measured per-device costs.

    Attributes:
        profile: the device profile the costs were measured on ("host" for this machine).
        model_params: number of model parameters the costs were measured for (c1 grows with it).
        c1: cost of one communication round (upload + download), by unit: {"joules": J, "seconds": s}.
        c2: cost of one local step, by unit.
    """

    profile: str
    model_params: int
    c1: dict[str, float]
    c2: dict[str, float]

    def costs(self, unit: str) -> tuple[float, float]:
        """(c1, c2) in ``unit`` (one of COST_UNITS)."""
        if unit not in COST_UNITS:
            raise UserError(f"--cost-unit must be one of {', '.join(COST_UNITS)}, got {unit!r}")
        return self.c1[unit], self.c2[unit]


def read_calibration(path: str | Path) -> Calibration:
    """Read and validate a calibration file.

    Raises:
        UserError: one line naming the file and the key that is missing or wrong.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"calibration file {path} not found")
    try:
        raw = tomllib.loads(read_text(path, MAX_TEXT_FILE_BYTES, "calibration file"))
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"calibration file {path}: not valid TOML: {exc}") from None

    def fail(key: str, problem: str) -> UserError:
        return UserError(f"calibration file {path}: {key}: {problem}")

    head = raw.get("calibration")
    if not isinstance(head, dict):
        raise fail("[calibration]", "missing table")
    profile = head.get("profile")
    if not isinstance(profile, str) or not profile:
        raise fail("calibration.profile", f"must be a non-empty string, got {profile!r}")
    params = head.get("model_params")
    if isinstance(params, bool) or not isinstance(params, int) or params <= 0:
        raise fail("calibration.model_params", f"must be a positive integer, got {params!r}")
    tables = {}
    for name in ("c1", "c2"):
        table = raw.get(name)
        if not isinstance(table, dict):
            raise fail(f"[{name}]", "missing table")
        for unit in COST_UNITS:
            value = table.get(unit)
            if not (finite_real(value) or 0.0) > 0:
                raise fail(f"{name}.{unit}", f"must be a positive number, got {value!r:.40}")
        tables[name] = {unit: float(table[unit]) for unit in COST_UNITS}
    return Calibration(profile=profile, model_params=params, c1=tables["c1"], c2=tables["c2"])
