"""Which install extra (pyproject.toml) provides a package that is not installed.

A board installs only ``dpfl-testbed[node]``; a command that needs the coordinator's packages then says
in one line what to install, before it starts (:func:`check_installed`), instead of ending in a
ModuleNotFoundError traceback (:func:`missing_package_message` for what slips through).

Example::

    >>> missing_package_message(ModuleNotFoundError("No module named 'scipy'", name="scipy.optimize"))
    "needs scipy, which is not installed: pip install 'dpfl-testbed[coordinator]'"
    >>> missing_package_message(ModuleNotFoundError("No module named 'yaml'", name="yaml")) is None
    True
"""

from __future__ import annotations

#: The distribution's name on the package index (pyproject.toml's project.name; the import package
#: is ``testbed``, docs/install.md says why): what every "pip install" hint names.
DISTRIBUTION = "dpfl-testbed"


def install_hint(extra: str) -> str:
    """The command that installs ``extra`` of pyproject.toml: ``pip install 'dpfl-testbed[node]'``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"

#: Top-level module → (the distribution's name, the extra of pyproject.toml that installs it).
EXTRA_OF_MODULE: dict[str, tuple[str, str]] = {
    "scipy": ("scipy", "coordinator"),
    "matplotlib": ("matplotlib", "coordinator"),
    "dp_accounting": ("dp-accounting", "coordinator"),
    "amqtt": ("amqtt", "coordinator"),
    "serial": ("pyserial", "bridge"),
    "paho": ("paho-mqtt", "node"),
    "smbus2": ("smbus2", "node"),
    "torch": ("torch", "torch"),  # model.kind = "torch"; [channel] installs it too, with Sionna
    "sionna": ("sionna-no-rt", "channel"),
    "ray": ("ray", "ray"),
    "rich": ("rich", "coordinator"),
    "aiohttp": ("aiohttp", "watch"),
    "aiohttp_sse": ("aiohttp-sse", "watch"),
    "pandas": ("pandas", "analysis"),
    "tensorboardX": ("tensorboardX", "tracking"),
    "mlflow": ("mlflow-skinny", "tracking"),
    "sqlalchemy": ("sqlalchemy", "tracking"),  # MLflow's SQLite store
    "alembic": ("alembic", "tracking"),
    "flask": ("flask", "tracking-ui"),  # `mlflow ui`
    "cryptography": ("cryptography", "coordinator"),
}


#: The modules each extra's commands import, whatever the experiment (tests/test_node_install.py
#: checks them against pyproject.toml). smbus2 is left out: only an INA meter needs it.
MODULES_OF_EXTRA: dict[str, tuple[str, ...]] = {
    "node": ("paho",),
    "bridge": ("paho", "serial"),
    "coordinator": ("scipy", "matplotlib", "dp_accounting", "amqtt", "paho", "serial", "rich"),
    "watch": ("aiohttp", "aiohttp_sse"),  # with the coordinator's (`testbed watch` checks both)
}


def check_installed(extra: str, command: str) -> None:
    """Raise UserError naming what is missing when a module of ``extra`` is not installed (found
    without importing it).

    Args:
        extra: a key of :data:`MODULES_OF_EXTRA`.
        command: the command that needs it, for the message (``run``).
    """
    import importlib.util

    from testbed.errors import UserError

    missing = [EXTRA_OF_MODULE[m][0] for m in MODULES_OF_EXTRA[extra] if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"{command} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not "
                        f"installed: {install_hint(extra)}")


def missing_package_message(exc: ModuleNotFoundError) -> str | None:
    """One line naming the missing package and the extra that installs it, or None when the
    missing module is not one of the extras' (a bug, left to its traceback)."""
    top = (exc.name or "").split(".")[0]
    if top not in EXTRA_OF_MODULE:
        return None
    package, extra = EXTRA_OF_MODULE[top]
    return f"needs {package}, which is not installed: {install_hint(extra)}"
