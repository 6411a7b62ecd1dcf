"""The testbed: differentially private federated learning on wireless IoT, hardware in the loop.

Kept light on purpose: a node on a small board imports only the modules it runs. The Python API
(``testbed.run``, ``testbed.load``, ``testbed.sweep``, ``testbed.audit``,
``testbed.compare``, ``testbed.Run``, ``testbed.Sweep``: testbed.api, docs/api.md) is imported on first use.
"""

__version__ = "0.1.0"

#: The names testbed.api lends this package, imported on first use (PEP 562).
_API = ("run", "load", "sweep", "audit", "compare", "Run", "Sweep")
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from testbed import api

        return getattr(api, name)
    raise AttributeError(f"module 'testbed' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
