"""An emulated board: a Debian root file system of a board's architecture, with `dpfl-testbed[node]`
installed as a Raspberry Pi OS user installs it, and the node agent run inside it.

`testbed board build --arch arm64` makes a Debian bookworm arm64 root file system with
``debootstrap`` from Debian's mirror (Raspberry Pi OS 12 is built on it: the same Python 3.11,
glibc and aarch64 wheels); its binaries run here through ``qemu-user-static`` and binfmt_misc. In
it, ``python3 -m venv /opt/testbed`` and ``/opt/testbed/bin/pip install 'dpfl_testbed-….whl[node]'``
from PyPI, the commands of docs/boards.md. The wheel is one ``python -m build`` made (``--wheel
dist/dpfl_testbed-….whl``, as CI does: .ci/run), else this checkout's, built here.

The root file system is cached under :func:`cache_root` (outside the repository), one folder per
key: the architecture, the suite, the mirror, the Debian packages, the distribution's name and the
node's requirements (pyproject.toml's dependencies and ``node`` extra). A build whose key is cached
copies the cached tree (``--out``) or uses it in place, and reinstalls only the testbed package
(``pip --no-deps``) when what it installs changed since (this checkout's sources, or the given
wheel's bytes): seconds, against minutes for the first build.

`testbed board run DIR -- COMMAND` runs COMMAND in a chroot of DIR, in a mount namespace of its own
(``unshare``) where /proc, /dev, the host's resolver and the bind mounts are mounted: they vanish with
the process however it ends, and nothing is left mounted on the host. The process's id is the
command's (every step execs), so signals and exit status are the command's own.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from testbed.errors import UserError
from testbed.orchestration.provision import DEFAULT_COMMAND
from testbed.util.dirlock import DirectoryLock
from testbed.util.extras import DISTRIBUTION

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: Debian architecture → the binfmt_misc entry of qemu-user-static that runs its binaries.
ARCHES = {"arm64": "qemu-aarch64"}
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PYPI = "https://pypi.org/simple/"
#: Beyond debootstrap's minbase: what a Raspberry Pi OS Lite image has for `python3 -m venv`.
PACKAGES = ("python3", "python3-venv")
#: The venv of the board's node agent: where a provisioned unit runs `testbed` from.
VENV = str(Path(DEFAULT_COMMAND).parent.parent)
#: What a tree's package was installed from: ``sources:`` the hash of the checkout's sources, or
#: ``wheel:`` the hash of a given wheel (so an unchanged one installs nothing).
SOURCE_STAMP = f"{VENV}/.testbed-sources-sha256"
#: Where the board's pip finds the CA bundle this machine's pip trusts (see _host_ca).
HOST_CA = "/etc/ssl/certs/testbed-host-ca.pem"
#: The board's Debian architecture, written at its build (what `testbed board run` checks binfmt_misc for).
ARCH_FILE = f"{VENV}/.board-arch"
#: The packages and files of the wheel (pyproject.toml's packages.find); their contents make the stamp.
_SOURCES = ("pyproject.toml", "README.md", "testbed", "nodes", "channel", "firmware_bridge")
#: What a process in the board sees: no variable of the host (its pip configuration, its paths).
BOARD_ENV = {"PATH": f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "HOME": "/root", "LANG": "C.UTF-8"}
_COMPLETE = "complete"  # written in a cache entry once its tree is whole
_NETWORK_TIMEOUT_S = 5.0

Say = Callable[[str], None]


@dataclass(frozen=True)
class Image:
    """A built board: its root file system, whether the cache served it, and the build's seconds."""

    root: Path
    cached: bool
    seconds: float


def source_tree() -> Path:
    """The checkout the board's wheel is built from.

    Raises:
        UserError: the package is installed without its source tree (no pyproject.toml).
    """
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file():
        raise UserError(f"board build: builds this checkout's wheel, but {root} has no pyproject.toml "
                        "(run it from a source checkout of the testbed)")
    return root


def node_requirements(pyproject: Path) -> tuple[str, ...]:
    """What `pip install 'dpfl-testbed[node]'` installs: the distribution's name (a tree made under
    another name is not patched), the dependencies and the node extra."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return (project["name"], *project["dependencies"], *project["optional-dependencies"]["node"])


def cache_key(arch: str, requirements: tuple[str, ...]) -> str:
    """The cache entry's name: what the root file system is made of, the node's requirements included."""
    made_of = "\n".join((arch, SUITE, MIRROR, *PACKAGES, VENV, *requirements))
    return f"{arch}-{SUITE}-{hashlib.sha256(made_of.encode()).hexdigest()[:16]}"


def cache_root() -> Path:
    """Where built boards are kept: ``$TESTBED_BOARD_CACHE``, else ``$XDG_CACHE_HOME/testbed/boards``
    (``~/.cache/testbed/boards``), a path a CI service can keep between runs."""
    if os.environ.get("TESTBED_BOARD_CACHE"):
        return Path(os.environ["TESTBED_BOARD_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "testbed" / "boards"


def sources_sha256(root: Path) -> str:
    """The hash of the checkout's files that go into the wheel (compiled caches left out)."""
    digest = hashlib.sha256()
    for name in _SOURCES:
        path = root / name
        files = sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
            if path.is_dir() else [path]
        for file in files:
            digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()


# ---- the host's tools: each missing one is one line saying how to get it --------------------------

def check_host(arch: str, *, needs_debootstrap: bool, binfmt: Path = Path("/proc/sys/fs/binfmt_misc")) -> None:
    """Refuse in one line when this machine cannot build or run an ``arch`` board.

    Raises:
        UserError: no binfmt_misc (at ``binfmt``) entry for the architecture, or one disabled or
            without the F flag, which a chroot needs; not root; ``debootstrap`` or ``unshare`` missing.
    """
    if arch not in ARCHES:
        raise UserError(f"board: unknown architecture {arch!r}; known: {', '.join(ARCHES)}")
    entry = binfmt / ARCHES[arch]
    if not (binfmt / "status").exists():
        raise UserError("board: binfmt_misc is not mounted (mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc)")
    if not entry.exists():
        raise UserError(f"board: no binfmt_misc entry {ARCHES[arch]}, so {arch} binaries cannot run here "
                        f"(apt-get install qemu-user-static binfmt-support; update-binfmts --enable {ARCHES[arch]})")
    lines = entry.read_text().splitlines()
    if "enabled" not in lines:
        raise UserError(f"board: binfmt_misc entry {ARCHES[arch]} is disabled (update-binfmts --enable {ARCHES[arch]})")
    flags = next((line.split(":", 1)[1] for line in lines if line.startswith("flags:")), "")
    if "F" not in flags:
        raise UserError(f"board: binfmt_misc entry {ARCHES[arch]} lacks the F flag, so a chroot cannot reach "
                        "its interpreter (register qemu-user-static's entry, which has it)")
    if os.geteuid() != 0:
        raise UserError("board: needs root (debootstrap, chroot and bind mounts): run it with sudo")
    tools = (("debootstrap", "debootstrap"),) if needs_debootstrap else ()
    for command, package in tools + (("unshare", "util-linux"),):
        if shutil.which(command) is None and not Path("/usr/sbin", command).exists():
            raise UserError(f"board: {command} not found (apt-get install {package} qemu-user-static binfmt-support)")


def check_network(urls: tuple[str, ...] = (MIRROR, PYPI)) -> None:
    """Refuse in one line when a server the first build downloads from cannot be reached.

    Raises:
        UserError: a name that does not resolve or a port that does not answer.
    """
    for url in urls:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname, port), timeout=_NETWORK_TIMEOUT_S).close()
        except OSError as exc:
            raise UserError(f"board build: cannot reach {url} ({exc.strerror or exc}); the first build of a "
                            f"board downloads from it (later ones use the cache at {cache_root()})") from None


# ---- running a command in a board ----------------------------------------------------------------

def run_argv(root: Path, command: list[str], *, cwd: Path | None = None,
             binds: tuple[tuple[Path, str], ...] = (), env: dict[str, str] | None = None) -> list[str]:
    """The command line that runs ``command`` in the board ``root``: a private mount namespace
    (``unshare``) with /proc, /dev and the host's resolver mounted, each ``(host path, board path)``
    of ``binds`` bound in, and ``cwd`` (a host folder) bound at its own path and made the working
    folder (not the host's / nor a folder in the board), then ``chroot`` with :data:`BOARD_ENV` and
    ``env`` as the whole environment. Every step execs, so the process is the command's own."""
    root = Path(root).resolve()
    here = Path(cwd).resolve() if cwd is not None else None
    # the host's / or a folder of the board itself is not bound over the board (it would hide it)
    if here is not None and (here == Path("/") or here.is_relative_to(root)):
        here = None
    mounts = [(here, str(here))] if here is not None else []
    mounts += [(Path(src).resolve(), dst) for src, dst in binds]
    q = shlex.quote
    script = [f"mount -t proc proc {q(str(root / 'proc'))}",
              f"mount --rbind /dev {q(str(root / 'dev'))}",
              # the host's resolver, where it has one (a host without is no reason to fail the command)
              f"if [ -e /etc/resolv.conf ]; then cp -L /etc/resolv.conf {q(str(root / 'etc/resolv.conf'))}; fi"]
    for src, dst in mounts:
        target = str(root / dst.lstrip("/"))
        make = "mkdir -p" if src.is_dir() else "mkdir -p " + q(str(Path(target).parent)) + " && touch"
        script += [f"{make} {q(target)}", f"mount --bind {q(str(src))} {q(target)}"]
    inner = f"cd {q(str(here) if here is not None else '/')} && exec {shlex.join(command)}"
    env = [f"{k}={v}" for k, v in {**BOARD_ENV, **(env or {})}.items()]
    script.append(f"exec chroot {q(str(root))} /usr/bin/env -i {shlex.join(env)} /bin/sh -c {q(inner)}")
    return ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-ec", "\n".join(script)]


#: What a board's /etc/hosts and /etc/nsswitch.conf hold when debootstrap left none (a Raspberry
#: Pi OS image has both): ``localhost`` resolves, then the host's resolver (copied in at each run).
HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
NSSWITCH = "hosts: files dns\nnetworks: files\n"


def emulation_env(arch: str) -> dict[str, str]:
    """What a board's processes are told of their emulation (nodes.meters.emulation): the emulator, and
    this machine's own CPU seconds of the reference work, timed here, natively."""
    from nodes.meters import emulation

    return {emulation.EMULATOR_VAR: ARCHES[arch],
            emulation.REFERENCE_VAR: f"{emulation.reference_seconds():.6g}"}


def name_service(root: Path) -> list[str]:
    """Give the board ``root`` an /etc/hosts (``localhost``) and an nsswitch.conf where it has none
    (the board shares the host's network; only the names are its own); the files written.

    Example::

        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> name_service(root), name_service(root)
        (['etc/hosts', 'etc/nsswitch.conf'], [])
    """
    written = []
    for name, text in (("etc/hosts", HOSTS), ("etc/nsswitch.conf", NSSWITCH)):
        path = Path(root) / name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(name)
    return written


def board_arch(root: Path) -> str:
    """The architecture of the board ``root``, as its build wrote it.

    Raises:
        UserError: ``root`` is not a built board.
    """
    arch = Path(root) / ARCH_FILE.lstrip("/")
    if not (Path(root) / DEFAULT_COMMAND.lstrip("/")).exists() or not arch.exists():
        raise UserError(f"board run: {root} is not a built board (no {DEFAULT_COMMAND}; "
                        "build one with testbed board build --arch arm64 --out DIR)")
    return arch.read_text().strip()


def _in_board(root: Path, command: list[str], what: str, *, binds: tuple[tuple[Path, str], ...] = ()) -> None:
    """Run ``command`` in the board; a failure is one line with the end of its output."""
    done = subprocess.run(run_argv(root, command, binds=binds), capture_output=True, text=True)
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise UserError(f"board build: {what} failed (status {done.returncode}): {tail}")


# ---- building ------------------------------------------------------------------------------------

def _debootstrap(arch: str, target: Path, say: Say) -> None:
    """debootstrap in a mount namespace of its own (its /proc and /sys mounts cannot outlive it)."""
    say(f"debootstrap {SUITE} {arch} from {MIRROR} into {target} (minutes: its second stage runs emulated)")
    argv = ["unshare", "--mount", "--propagation", "private", "debootstrap", f"--arch={arch}",
            "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(target), MIRROR]
    done = subprocess.run(argv, capture_output=True, text=True,
                          env={**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"})
    if done.returncode != 0:
        log = target / "debootstrap" / "debootstrap.log"
        lines = (log.read_text(errors="replace") if log.exists() else done.stderr).strip().splitlines()
        raise UserError(f"board build: debootstrap failed (status {done.returncode}): {' | '.join(lines[-2:])}")


def given_wheel(path: Path) -> Path:
    """A wheel of this distribution given to ``board build --wheel``.

    Raises:
        UserError: not a file, or not named as ``python -m build`` names this distribution's wheel.
    """
    prefix = DISTRIBUTION.replace("-", "_") + "-"
    if not path.is_file() or not path.name.startswith(prefix) or path.suffix != ".whl":
        raise UserError(f"board build: --wheel {path} is not a {prefix}….whl file (python -m build makes one in dist/)")
    return path.resolve()


def _stamp(source: Path, wheel: Path | None) -> str:
    """What the tree's package is installed from (:data:`SOURCE_STAMP`)."""
    if wheel is None:
        return "sources:" + sources_sha256(source)
    return "wheel:" + hashlib.sha256(wheel.read_bytes()).hexdigest()


def _wheel(source: Path, out: Path) -> Path:
    """This checkout's wheel, built from a copy (the build leaves nothing in the work tree)."""
    copy = out / "src"
    copy.mkdir()
    for name in _SOURCES:
        if (source / name).is_dir():
            shutil.copytree(source / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source / name, copy / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                           str(copy), "-w", str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"board build: building the wheel failed: {done.stderr.strip().splitlines()[-1:]}")
    return next(out.glob(DISTRIBUTION.replace("-", "_") + "-*.whl"))


def _host_ca() -> tuple[tuple[Path, str], ...]:
    """The CA bundle this machine's pip is told to trust (``PIP_CERT``, ``SSL_CERT_FILE``), bound in
    for the board's pip: a network whose TLS is re-signed by a proxy needs it on a board too."""
    for variable in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        if os.environ.get(variable) and Path(os.environ[variable]).is_file():
            return ((Path(os.environ[variable]), HOST_CA),)
    return ()


def _pip(root: Path, arguments: list[str], what: str) -> None:
    """The board's pip (its own index, PyPI; no configuration of this machine's but its CA)."""
    ca = _host_ca()
    _in_board(root, [f"{VENV}/bin/pip", "install", "--quiet", "--disable-pip-version-check",
                     *(["--cert", HOST_CA] if ca else []), *arguments], what, binds=ca)


def _install(root: Path, source: Path, given: Path | None, arch: str, *, with_requirements: bool, say: Say) -> None:
    """Install the given wheel, else this checkout's, in the board's venv: as a user does (``[node]``,
    from PyPI) in a new tree, else the package alone (``--no-deps``), its requirements being those of
    the key."""
    with tempfile.TemporaryDirectory(dir=root / "tmp") as tmp:
        if given is None:
            wheel = _wheel(source, Path(tmp))
        else:
            wheel = Path(shutil.copy(given, Path(tmp) / given.name))
        inside = "/" + str(wheel.relative_to(root))
        if with_requirements:
            say(f"python3 -m venv {VENV}; pip install '{wheel.name}[node]' (from PyPI, emulated)")
            _in_board(root, ["python3", "-m", "venv", VENV], "python3 -m venv")
            _pip(root, [f"{inside}[node]"], "pip install dpfl-testbed[node]")
        else:
            say(f"{'this checkout changed' if given is None else 'another wheel'}: pip install --no-deps {wheel.name}")
            _pip(root, ["--no-deps", "--force-reinstall", inside], f"pip install {DISTRIBUTION}")
    (root / ARCH_FILE.lstrip("/")).write_text(arch + "\n")
    (root / SOURCE_STAMP.lstrip("/")).write_text(_stamp(source, given) + "\n")


def _refresh(root: Path, source: Path, given: Path | None, arch: str, say: Say) -> None:
    """Reinstall the testbed package when what is installed is not what is asked for."""
    stamp = root / SOURCE_STAMP.lstrip("/")
    if not stamp.exists() or stamp.read_text().strip() != _stamp(source, given):
        _install(root, source, given, arch, with_requirements=False, say=say)


def _cached_tree(arch: str, source: Path, given: Path | None, say: Say) -> tuple[Path, bool]:
    """The cache entry's root file system, built when missing; and whether it was there."""
    entry = cache_root() / cache_key(arch, node_requirements(source / "pyproject.toml"))
    if (entry / _COMPLETE).exists():
        return entry / "rootfs", True
    entry.mkdir(parents=True, exist_ok=True)
    with DirectoryLock(entry):
        partial = entry / "rootfs.partial"
        check_network()
        # debootstrap removes its own folder in the tree when it succeeds: a tree without it is
        # whole and a failed install resumes there; with it, debootstrap was cut short
        if not partial.exists() or (partial / "debootstrap").exists():
            subprocess.run(["rm", "-rf", "--one-file-system", str(partial)], check=True)
            _debootstrap(arch, partial, say)
        _install(partial, source, given, arch, with_requirements=True, say=say)
        name_service(partial)
        partial.rename(entry / "rootfs")
        (entry / _COMPLETE).write_text(f"{SUITE} {arch} {MIRROR}\n")
    return entry / "rootfs", False


def build(arch: str, out: Path | None = None, *, wheel: Path | None = None, say: Say = print) -> Image:
    """Build (or take from the cache) an ``arch`` board with `dpfl-testbed[node]` installed.

    Args:
        arch: a Debian architecture of :data:`ARCHES`.
        out: a missing or empty folder to copy the board into, or one this function built before
            (updated); None uses the cache's tree in place.
        wheel: the wheel to install (``python -m build``'s, :func:`given_wheel`); None builds this
            checkout's.
        say: where progress lines go.

    Raises:
        UserError: see :func:`check_host`, :func:`check_network`; a failed step, in one line.
    """
    start = time.perf_counter()
    check_host(arch, needs_debootstrap=True)
    given = None if wheel is None else given_wheel(Path(wheel))
    source = source_tree()
    cached_root, cached = _cached_tree(arch, source, given, say)
    root = cached_root
    if out is not None:
        root = Path(out)
        if not (root / DEFAULT_COMMAND.lstrip("/")).exists():
            if root.exists() and any(root.iterdir()):
                raise UserError(f"board build: --out {root} is not empty and not a board")
            copy = root.with_name(root.name + ".partial")
            root.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["rm", "-rf", "--one-file-system", str(copy)], check=True)
            subprocess.run(["cp", "-a", "--reflink=auto", str(cached_root), str(copy)], check=True)
            if root.exists():  # an empty folder made for it
                root.rmdir()
            copy.rename(root)
    _refresh(root, source, given, arch, say)
    return Image(root=root.resolve(), cached=cached, seconds=time.perf_counter() - start)

