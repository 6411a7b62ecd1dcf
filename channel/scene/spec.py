"""What a trace depends on: the scene, the radio's carrier and arrays, the solver's settings.

:class:`SceneSpec` is frozen; :meth:`SceneSpec.key` digests every field that changes a trace (a
scene file by its bytes, a built-in scene by its name and the installed Sionna RT's version), so an
on-disk cache keyed by it never serves a trace of another scene or setting.

Example::

    >>> s = SceneSpec("simple_street_canyon", carrier_hz=3.5e9)
    >>> s.key() == SceneSpec("simple_street_canyon", carrier_hz=3.5e9).key(), s.key() == s.replaced(max_depth=2).key()
    (True, False)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from xml.etree import ElementTree

__all__ = ["SceneSpec", "ANTENNA_PATTERNS", "POLARIZATIONS", "EMPTY_SCENE"]

#: Sionna RT's antenna patterns (sionna.rt.antenna_pattern) and polarisations the spec accepts.
ANTENNA_PATTERNS = ("iso", "dipole", "hw_dipole", "tr38901")
POLARIZATIONS = ("V", "H")
#: The scene with no object: free space (Sionna RT's ``load_scene()`` without a file).
EMPTY_SCENE = "empty"


@dataclass(frozen=True)
class SceneSpec:
    """Everything a trace depends on besides the positions, SI units.

    Attributes:
        scene: a built-in Sionna RT scene by name (``sionna.rt.scene.<name>``, e.g.
            ``"simple_street_canyon"``), ``"empty"`` (free space), or a path to a Mitsuba XML file.
        carrier_hz: the carrier frequency, Hz (the materials' properties and the phases depend on it).
        bandwidth_hz: the bandwidth, Hz (the scene's; the narrowband coefficient is at the carrier).
        antenna_height_m: every node's antenna above the ground under it, m.
        antenna_pattern: every node's single antenna (one of :data:`ANTENNA_PATTERNS`).
        polarization: its polarisation, one of :data:`POLARIZATIONS` (a single port: dual-polarised
            arrays give a matrix per link, which no algorithm here reads).
        max_depth: the most interactions (reflections, refractions...) on a path.
        samples_per_source: rays shot from each transmitter.
        line_of_sight, specular_reflection, diffuse_reflection, refraction, diffraction: which
            interactions the solver follows.
        solver_seed: the solver's own seed (its ray directions).
    """

    scene: str
    carrier_hz: float = 3.5e9
    bandwidth_hz: float = 1e6
    antenna_height_m: float = 1.5
    antenna_pattern: str = "iso"
    polarization: str = "V"
    max_depth: int = 3
    samples_per_source: int = 100_000
    line_of_sight: bool = True
    specular_reflection: bool = True
    diffuse_reflection: bool = False
    refraction: bool = True
    diffraction: bool = False
    solver_seed: int = 42

    def __post_init__(self) -> None:
        if self.antenna_pattern not in ANTENNA_PATTERNS:
            raise ValueError(f"antenna_pattern: {self.antenna_pattern!r} is not one of {', '.join(ANTENNA_PATTERNS)}")
        if self.polarization not in POLARIZATIONS:
            raise ValueError(f"polarization: {self.polarization!r} is not one of {', '.join(POLARIZATIONS)}")
        for name in ("carrier_hz", "bandwidth_hz"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.max_depth <= 16 or self.samples_per_source < 1:
            raise ValueError("max_depth must be in 0..16 and samples_per_source >= 1")

    @property
    def is_file(self) -> bool:
        """The scene is a Mitsuba XML file (not a built-in name)."""
        return self.scene.endswith(".xml")

    def replaced(self, **changes) -> "SceneSpec":
        return dataclasses.replace(self, **changes)

    def key(self) -> str:
        """A hex digest of everything that changes a trace: the fields, the scene (a file: its
        bytes and those of every file it names, its meshes; a built-in one: its name) and Sionna
        RT's version."""
        h = hashlib.sha256()
        fields = dataclasses.asdict(self)
        if self.is_file:
            fields["scene"] = Path(self.scene).name
            for path in scene_files(self.scene):
                h.update(path.name.encode() + b"\0" + path.read_bytes())
        fields["sionna_rt"] = _version("sionna-rt")
        h.update(json.dumps(fields, sort_keys=True, allow_nan=False).encode())
        return h.hexdigest()


def scene_files(xml_path: str) -> list[Path]:
    """A Mitsuba XML scene and the files it names (``<string name="filename" value=...>``: its
    meshes), relative to its folder. ValueError (one line) for a file that is not there or not XML."""
    path = Path(xml_path)
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError) as exc:
        raise ValueError(f"scene {xml_path}: {exc}") from None
    named = [path.parent / e.get("value", "") for e in root.iter("string") if e.get("name") == "filename"]
    missing = [str(p) for p in named if not p.is_file()]
    if missing:
        raise ValueError(f"scene {xml_path} names {missing[0]}, which is not a file")
    return [path, *named]


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "none"
