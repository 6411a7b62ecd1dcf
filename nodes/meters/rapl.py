"""The RAPL meter: Linux powercap package energy counters (x86)."""

from __future__ import annotations

from pathlib import Path

from nodes.meters.base import Measurement, Meter, MeterUnavailable
from nodes.meters.registry import Registration

#: Where Linux exposes RAPL (tests point it at a fake directory).
POWERCAP_ROOT = Path("/sys/class/powercap")


class RaplMeter(Meter):
    """Linux powercap RAPL: the energy counters of every CPU package, in µJ.

    Reads ``{root}/intel-rapl:N/energy_uj`` of each top-level package zone (sub-zones such as
    ``intel-rapl:0:0`` are parts of their package and would count twice). A counter wraps to 0
    after ``max_energy_range_uj``; one wrap per interval is corrected, so intervals must be shorter
    than a wrap period (range / power: typically tens of minutes). Since Linux 5.10 ``energy_uj``
    is readable only by root (CVE-2020-8694 mitigation), which makes the meter unavailable.

    Raises:
        MeterUnavailable: no package zone, or its counter is not readable.
    """

    kind = "rapl"

    def __init__(self, root: Path | None = None):
        root = Path(root) if root is not None else POWERCAP_ROOT
        zones = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)
        if not zones:
            raise MeterUnavailable(f"no RAPL package zone under {root}")
        self._zones = []
        for zone in zones:
            try:
                max_uj = int((zone / "max_energy_range_uj").read_text())
                int((zone / "energy_uj").read_text())
            except PermissionError:
                raise MeterUnavailable(f"{zone / 'energy_uj'} is readable only by root") from None
            except (OSError, ValueError) as exc:
                raise MeterUnavailable(f"cannot read {zone}: {exc}") from None
            name = (zone / "name").read_text().strip() if (zone / "name").exists() else zone.name
            self._zones.append((zone / "energy_uj", max_uj, name))

    @property
    def source(self) -> str:
        return "rapl:" + ",".join(name for _, _, name in self._zones)

    def _read(self) -> list[int]:
        return [int(path.read_text()) for path, _, _ in self._zones]

    def _begin(self) -> list[int]:
        return self._read()

    def _end(self, start: list[int], cpu_s: float) -> Measurement:
        total_uj = 0
        for (_, max_uj, _), before, after in zip(self._zones, start, self._read()):
            total_uj += after - before if after >= before else after + max_uj - before
        return Measurement(cpu_s, total_uj * 1e-6, True, self.source)


REGISTRATION = Registration("rapl", lambda options: RaplMeter(options.powercap_root), listed_at=1, auto_rank=3)
