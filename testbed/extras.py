"""Which install extra (pyproject.toml) provides a package that is not installed.

A board installs only ``testbed[node]``; a command that needs the coordinator's packages then says
in one line what to install instead of ending in a ModuleNotFoundError traceback.

Example::

    >>> missing_package_message(ModuleNotFoundError("No module named 'scipy'", name="scipy.optimize"))
    "needs scipy, which is not installed: pip install 'testbed[coordinator]'"
    >>> missing_package_message(ModuleNotFoundError("No module named 'yaml'", name="yaml")) is None
    True
"""

from __future__ import annotations

#: Top-level module → (the distribution's name, the extra of pyproject.toml that installs it).
EXTRA_OF_MODULE: dict[str, tuple[str, str]] = {
    "scipy": ("scipy", "coordinator"),
    "matplotlib": ("matplotlib", "coordinator"),
    "dp_accounting": ("dp-accounting", "coordinator"),
    "amqtt": ("amqtt", "coordinator"),
    "serial": ("pyserial", "bridge"),
    "paho": ("paho-mqtt", "node"),
    "smbus2": ("smbus2", "node"),
    "torch": ("torch", "channel"),
    "sionna": ("sionna-no-rt", "channel"),
    "ray": ("ray", "ray"),
}


def missing_package_message(exc: ModuleNotFoundError) -> str | None:
    """One line naming the missing package and the extra that installs it, or None when the
    missing module is not one of the extras' (a bug, left to its traceback)."""
    top = (exc.name or "").split(".")[0]
    if top not in EXTRA_OF_MODULE:
        return None
    package, extra = EXTRA_OF_MODULE[top]
    return f"needs {package}, which is not installed: pip install 'testbed[{extra}]'"
