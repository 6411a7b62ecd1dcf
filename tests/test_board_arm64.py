"""An emulated arm64 board (Debian bookworm through qemu-user-static, dpfl-testbed[node] installed by
pip as on a Raspberry Pi: testbed.orchestration.board_image) serves DP-PASGD and DWFL rounds beside
x86 nodes over Mosquitto, and the run ends where sim ends: the same model (to a tolerance: aarch64
numpy may round differently in the last bits) and the same ledger, which the board's own ledger
confirms. The first build takes minutes and is cached (~/.cache/testbed/boards); later ones seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from testbed.assembly.config import load_config_text, replace
from testbed.errors import UserError
from testbed.orchestration import board_image
from testbed.orchestration.runner import run_experiment
from testbed.reports.results import read_checkpoint

from conftest import REPO, require_command, require_tool
from test_algorithm_contract import _ledger_without_seconds, _text

#: The board's node: emulated aarch64 is tens of times slower to start and to step than this machine.
TIMEOUTS = {"round_timeout_s": 120.0, "connect_timeout_s": 180.0}
#: Final model, board beside x86 nodes against sim: float64 models equal up to summation order on
#: one machine (test_algorithm_contract.ATOL_MODES); aarch64 numpy (its own SIMD kernels, fused
#: multiply-adds) may differ in the last bits of each step, a few ulps over a few rounds.
ATOL = 1e-9
BOARD_NODE = 0


@pytest.fixture(scope="module")
def board() -> Path:
    """The arm64 board, built once (from the cache when it is there)."""
    require_tool("root", os.geteuid() == 0, "a board's build and chroot need root")
    require_command("debootstrap", "apt-get install debootstrap")
    require_command("qemu-aarch64-static", "apt-get install qemu-user-static binfmt-support")
    try:
        image = board_image.build("arm64", say=lambda line: print(line, file=sys.stderr))
    except UserError as exc:
        require_tool("arm64 board", False, str(exc))
    return image.root


def _board_node(board: Path, url: str, cwd: Path, keys: str) -> subprocess.Popen:
    command = ["testbed", "node", "--broker", url, "--node-id", str(BOARD_NODE), "--meter", "model",
               "--state-dir", str(cwd / "state"), "--keys", keys,
               "--reproducible"]  # compared with sim: the run seed's draws
    return subprocess.Popen([sys.executable, "-m", "testbed", "board", "run", str(board), "--", *command],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_a_board_installs_the_wheel_python_m_build_made(board, built_dist, tmp_path):
    """`testbed board build --wheel dist/…whl` (make board, .ci/run): a copy of the cached board with
    that wheel installed in place of the checkout's, the distribution and version its metadata says."""
    wheel, _ = built_dist
    image = board_image.build("arm64", tmp_path / "board", wheel=wheel, say=lambda line: print(line, file=sys.stderr))
    stamp = (image.root / board_image.SOURCE_STAMP.lstrip("/")).read_text().strip()
    assert stamp.startswith("wheel:")
    done = subprocess.run([sys.executable, "-m", "testbed", "board", "run", str(image.root), "--", "python", "-c",
                           "import importlib.metadata as m, testbed; print(m.version('dpfl-testbed'), testbed.__version__)"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [wheel.name.split("-")[1]] * 2


@pytest.mark.slow
def test_the_board_runs_aarch64_python_with_the_node_extra(board, tmp_path):
    done = subprocess.run([sys.executable, "-m", "testbed", "board", "run", str(board), "--", "python", "-c",
                           "import platform, numpy, paho.mqtt, testbed; print(platform.machine())"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "aarch64"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dp_pasgd", "dwfl"])
def test_an_arm64_board_beside_x86_nodes_ends_where_sim_ends(name, board, mosquitto_broker, tmp_path, board_keys):
    config = load_config_text(_text(name))
    sim = run_experiment(config, out_dir=tmp_path / "sim", quiet=True)
    nodes = config.data.num_nodes
    url = mosquitto_broker.url
    x86 = subprocess.Popen([sys.executable, "-m", "testbed", "nodes", "--broker", url, "--ids",
                            ",".join(str(n) for n in range(nodes) if n != BOARD_NODE), "--keys", board_keys],
                           cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    arm64 = _board_node(board, url, tmp_path, board_keys)
    try:
        mqtt = run_experiment(replace(config, run={"mode": "mqtt"},
                                      mqtt={"emulated": False, "broker_url": url, "quorum": nodes, "keys": board_keys,
                                            **TIMEOUTS}),
                              out_dir=tmp_path / "mqtt", quiet=True)
        board_log = arm64.communicate(timeout=120)[0]
        x86.communicate(timeout=60)
    finally:
        for p in (arm64, x86):
            p.kill()
            p.wait()
    assert mqtt.summary["status"] == "completed", board_log
    assert arm64.returncode == 0, board_log
    a, b = read_checkpoint(tmp_path / "sim").state, read_checkpoint(tmp_path / "mqtt").state
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=0, atol=ATOL)
    assert _ledger_without_seconds(tmp_path / "sim") == _ledger_without_seconds(tmp_path / "mqtt")
    # The board's own ledger (kept in its state folder) was reported at the stop and confirmed.
    assert mqtt.summary["nodes"][str(BOARD_NODE)]["ledger_check"] == "confirmed", mqtt.summary["nodes"]
    assert any((tmp_path / "state").rglob("*")), "the board's node kept no state"
    # Its joules are the model's of the step (the host's CPU seconds), not qemu's: within the noise
    # of timing, an x86 node's for the same work (12.8x before the emulation's slowdown was taken out).
    energy = {int(n): v["energy_j"] for n, v in mqtt.summary["nodes"].items()}
    x86_energy = np.median([e for n, e in energy.items() if n != BOARD_NODE])
    assert energy[BOARD_NODE] < 3 * x86_energy, energy


@pytest.mark.slow
def test_a_folder_bound_as_the_docs_write_it_and_localhost_resolve_in_the_board(board, tmp_path):
    lab = tmp_path / "lab" / "pi-01"
    lab.mkdir(parents=True)
    (lab / "node.toml").write_text('broker = "mqtt://localhost:1883"\n')
    done = subprocess.run([sys.executable, "-m", "testbed", "board", "run", str(board), "--bind", f"{lab}:/etc/testbed",
                           "--", "python", "-c", "import socket; print(open('/etc/testbed/node.toml').read().strip()); "
                           "print(socket.gethostbyname('localhost'))"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["broker", "=", '"mqtt://localhost:1883"', "127.0.0.1"]


def test_a_missing_board_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "testbed", "board", "run", str(tmp_path), "--", "true"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"testbed: board run: {tmp_path} is not a built board (no /opt/testbed/bin/testbed; "
        "build one with testbed board build --arch arm64 --out DIR)"]


def test_an_unreachable_mirror_is_one_line():
    with pytest.raises(UserError, match=r"^board build: cannot reach http://127\.0\.0\.1:9/debian .*downloads from it"):
        board_image.check_network(("http://127.0.0.1:9/debian",))


@pytest.mark.parametrize("entry,expected", [
    (None, r"^board: binfmt_misc is not mounted \(mount -t binfmt_misc"),
    ("", r"^board: no binfmt_misc entry qemu-aarch64, so arm64 binaries cannot run here \(apt-get install"),
    ("disabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: PF\n",
     r"^board: binfmt_misc entry qemu-aarch64 is disabled \(update-binfmts --enable qemu-aarch64\)$"),
    ("enabled\ninterpreter /usr/bin/qemu-aarch64\nflags: P\n", r"^board: binfmt_misc entry qemu-aarch64 lacks the F flag"),
])
def test_a_machine_that_cannot_run_arm64_binaries_is_one_line(entry, expected, tmp_path):
    if entry is not None:
        (tmp_path / "status").write_text("enabled\n")
        if entry:
            (tmp_path / "qemu-aarch64").write_text(entry)
    with pytest.raises(UserError, match=expected):
        board_image.check_host("arm64", needs_debootstrap=True, binfmt=tmp_path)


def test_the_cache_key_follows_the_node_requirements():
    requirements = board_image.node_requirements(REPO / "pyproject.toml")
    assert requirements[0] == "dpfl-testbed"  # a tree made under another distribution's name is rebuilt
    assert any(r.startswith("paho-mqtt") for r in requirements) and any(r.startswith("numpy") for r in requirements)
    key = board_image.cache_key("arm64", requirements)
    assert key.startswith("arm64-bookworm-")
    assert board_image.cache_key("arm64", requirements) == key
    assert board_image.cache_key("arm64", requirements + ("scipy",)) != key


# ---- the footprint benchmark's guest figure (benchmarks/node_footprint.py --board) -----------------

def _footprint():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import node_footprint

    return node_footprint


_HOST_SMAPS = """00400000-00916000 r--p 00000000 fe:00 1 /board/usr/bin/python3.11
Rss:                1000 kB
00a5f000-00b3e000 rw-p 00000000 00:00 0
Rss:                 300 kB
555586acf000-555586dad000 rw-p 00000000 00:00 0 [heap]
Rss:                2000 kB
7f7448000000-7f744ffff000 rwxp 00000000 00:00 0
Rss:                9000 kB
7f7455e00000-7f7456028000 r--p 00000000 fe:00 2 /usr/bin/qemu-aarch64-static
Rss:                 700 kB
"""


def test_the_guests_figure_counts_its_own_mappings_only():
    footprint = _footprint()
    guest_maps = "400000-916000 r-xp 00000000 fe:00 1 /usr/bin/python3.11\na5f000-b3e000 rw-p 00000000 00:00 0\n"
    assert footprint.guest_rss_mb(guest_maps, _HOST_SMAPS) == pytest.approx(1300 / 1024)
    with pytest.raises(ValueError, match="guest_base"):  # guest addresses that are not the host's
        footprint.guest_rss_mb("1000000000-1000516000 r-xp 00000000 fe:00 1 /usr/bin/python3.11\n", _HOST_SMAPS)


@pytest.mark.slow
def test_the_guests_figure_sees_what_the_guest_touches_and_not_qemus_own(board):
    """50 MB the guest writes show in its figure (its bare interpreter's plus 50), while qemu's own
    (translator, code buffer, tables: tens of MB) stays out of it."""
    footprint = _footprint()
    figures = {}
    for name, code in {"bare": "pass", "touched": "b = bytearray(50 * 2**20)\nimport time\ntime.sleep(0.5)"}.items():
        guest = footprint.GuestRss()
        p = subprocess.Popen(footprint.in_board(board, ["python", "-c", footprint.GUEST_SAMPLER + code,
                                                        *guest.argv()]), pass_fds=(guest.write_fd,))
        guest.start(p.pid)
        _, status, usage = os.wait4(p.pid, 0)
        guest.wait()
        assert os.waitstatus_to_exitcode(status) == 0 and guest.samples >= 1
        figures[name] = (guest.peak_mb, usage.ru_maxrss / 1024)
    (bare, bare_qemu), (touched, touched_qemu) = figures["bare"], figures["touched"]
    assert touched - bare == pytest.approx(50, abs=2)
    assert bare < 16 < bare_qemu - bare  # a bare aarch64 CPython is ~8 MB; qemu adds ~30 of its own


@pytest.mark.parametrize("name", ["testbed-0.1.0-py3-none-any.whl", "dpfl_testbed-0.1.0.tar.gz", "missing"])
def test_a_wheel_that_is_not_this_distributions_is_one_line(name, tmp_path):
    path = tmp_path / name
    if name != "missing":
        path.write_bytes(b"PK")
    with pytest.raises(UserError, match=r"--wheel .* is not a dpfl_testbed-….whl file"):
        board_image.given_wheel(path)
