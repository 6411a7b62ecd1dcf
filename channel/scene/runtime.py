"""Importing Sionna RT on a CPU: point Dr.Jit at an LLVM it can use, or say what to install.

Dr.Jit's CPU backend JIT-compiles through a shared ``libLLVM``. It finds one through
``DRJIT_LIBLLVM_PATH`` or its own search, which on Debian 12 finds LLVM 14/15: those abort the
process at the first trace ("Cannot select: fmaximum"), which no ``except`` can catch. So before the
first import, unless the user set ``DRJIT_LIBLLVM_PATH``, the first existing library of
:data:`KNOWN_LLVM_PATHS` (LLVM 19 and later, as Debian and Ubuntu install them) is set there. With
none of them, Dr.Jit searches itself, unless only an LLVM it would abort on is installed
(:data:`OLD_LLVM_GLOBS`): then the import is refused in one line saying what to install.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

__all__ = ["KNOWN_LLVM_PATHS", "OLD_LLVM_GLOBS", "INSTALL_HINT", "SceneUnavailable", "import_rt", "llvm_path", "only_old_llvm"]

#: Where Debian/Ubuntu's libllvm19 (and later) put the library, most specific first.
KNOWN_LLVM_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libLLVM.so.19.1",
    "/usr/lib/aarch64-linux-gnu/libLLVM.so.19.1",
    "/usr/lib/llvm-19/lib/libLLVM.so.1",
    "/usr/lib/llvm-19/lib/libLLVM.so",
    "/usr/lib/x86_64-linux-gnu/libLLVM.so.20.1",
    "/usr/lib/aarch64-linux-gnu/libLLVM.so.20.1",
    "/usr/lib/llvm-20/lib/libLLVM.so.1",
)
#: Where Debian/Ubuntu put the LLVMs (14, 15) that abort Dr.Jit's first trace.
OLD_LLVM_GLOBS = ("/usr/lib/*-linux-gnu/libLLVM-1[45].so*", "/usr/lib/*-linux-gnu/libLLVM.so.1[45]*",
                  "/usr/lib/llvm-1[45]/lib/libLLVM*.so*")
#: What to install, said by every refusal.
INSTALL_HINT = "pip install 'dpfl-testbed[scene]' (Sionna RT) and apt-get install libllvm19 (its CPU backend's LLVM)"
_ENV = "DRJIT_LIBLLVM_PATH"


class SceneUnavailable(ValueError):
    """Sionna RT cannot be imported or has no LLVM to run on; the message is one line."""


def llvm_path() -> str | None:
    """The LLVM Dr.Jit will load: ``DRJIT_LIBLLVM_PATH`` if set, else the first known path that exists."""
    if os.environ.get(_ENV):
        return os.environ[_ENV]
    return next((p for p in KNOWN_LLVM_PATHS if Path(p).is_file()), None)


def only_old_llvm() -> bool:
    """No usable LLVM is known and one that aborts Dr.Jit is installed (what its own search finds)."""
    return llvm_path() is None and any(glob.glob(pattern) for pattern in OLD_LLVM_GLOBS)


def import_rt() -> Any:
    """The ``sionna.rt`` module, its LLVM set first (see the module's docstring).

    Raises:
        SceneUnavailable: Sionna RT is not installed or does not load, or only an LLVM it aborts on
            is installed (one line, what to install).
    """
    path = llvm_path()
    if only_old_llvm():
        raise SceneUnavailable(f"the scene channel needs LLVM 19 or later for Dr.Jit's CPU backend (the installed "
                               f"14/15 abort it; or set {_ENV}); {INSTALL_HINT}")
    if path is not None:
        if not Path(path).is_file():
            raise SceneUnavailable(f"{_ENV}={path} is not a file; {INSTALL_HINT}")
        os.environ.setdefault(_ENV, path)
    try:
        import sionna.rt as rt
    except ImportError as exc:
        raise SceneUnavailable(f"the scene channel needs Sionna RT ({exc.name or exc}); {INSTALL_HINT}") from None
    except Exception as exc:  # Dr.Jit failing to load the library
        raise SceneUnavailable(f"Sionna RT did not load ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                               f"{INSTALL_HINT}") from None
    return rt
