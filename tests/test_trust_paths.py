"""Paths a user or an inventory names, as someone who writes them for you would: a run's name that
climbs out of output.dir, an inventory whose data is /etc/shadow (relative, absolute or through a
symlink), a sweep table whose run names a folder elsewhere, an experiment file that is a device
or a FIFO, a million boards. Each is refused in one line before anything is written or read; what
is allowed lands inside its declared folder, and no copy widens a file's mode."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from testbed.assembly.config import load_config_text
from testbed.cli import main
from testbed.errors import ConfigError, UserError
from testbed.orchestration.provision import MAX_BOARDS, load_inventory, provision
from testbed.orchestration.runner import default_run_dir
from testbed.reports.sweep_stats import read_sweep
from testbed.util.userfiles import NAME, copy_file, inside

from test_compare import write_sweep
from test_faults_cli import _fails

BASE = """
[run]
algorithm = "fedavg"
[data]
dataset = "synthetic"
num_nodes = 2
samples_per_node = 10
dim = 3
[fedavg]
rounds = 1
local_steps = 1
batch = 2
lr = 0.1
[output]
figures = false
"""

# ---------------------------------------------------------------- run.name


@settings(max_examples=150, deadline=None)
@given(name=st.text(max_size=70) | st.sampled_from(["..", ".", "../../x", "/etc/x", "a/b", "a\\b", "-x", ".hidden",
                                                   "x" * 65, "ok", "run-1.2_b"]))
def test_a_run_name_is_an_identifier_whose_folder_stays_in_output_dir(tmp_path_factory, name):
    try:
        config = load_config_text(BASE, overrides=[("output.dir", "/srv/runs"), ("run.name", name)])
    except ConfigError as exc:
        assert str(exc).startswith("config error: run.name: ") and "\n" not in str(exc)
        assert not NAME.fullmatch(name)
        return
    assert NAME.fullmatch(name)
    run_dir = default_run_dir(config)
    assert run_dir.parent == Path("/srv/runs") and run_dir.name.startswith(name + "-")


def test_run_name_climbing_out_of_output_dir_is_refused_and_nothing_written(capsys, tmp_path):
    (tmp_path / "e.toml").write_text(BASE.replace("[output]\n", f'[output]\ndir = "{tmp_path / "runs"}"\n'))
    err = _fails(capsys, ["run", str(tmp_path / "e.toml"), "--set", "run.name=../../x"])
    assert "run.name" in err and "no '/'" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.toml"]


@pytest.mark.parametrize("device", ["/dev/zero", "fifo"])
def test_an_experiment_file_that_is_a_device_or_fifo_is_one_line(capsys, tmp_path, device):
    if device == "fifo":
        device = str(tmp_path / "fifo")
        os.mkfifo(device)
    err = _fails(capsys, ["run", device])
    assert device in err and "not a regular file" in err


# ---------------------------------------------------------------- the inventory


def _lab(tmp_path: Path, data: str, *, boards: int = 1) -> Path:
    folder = tmp_path / "lab"
    folder.mkdir(exist_ok=True)
    (folder / "shard.csv").write_text("1,2\n")
    entries = "".join(f'[[boards]]\nhost = "pi-{i}"\nnode_id = {i}\nmeter = "model"\nprofile = "pi-zero-2w"\n'
                      for i in range(boards))
    text = f'broker = "mqtt://broker.lan:1883"\n{entries}'
    if data:
        text = text.replace('node_id = 0\n', f'node_id = 0\ndata = \"{data}\"\n', 1)
    (folder / "inventory.toml").write_text(text)
    return folder / "inventory.toml"


@pytest.mark.parametrize("data", ["../../../../etc/shadow", "../outside.csv", "/etc/passwd", "sub/../../outside.csv"])
def test_an_inventorys_data_outside_its_folder_is_refused(capsys, tmp_path, data):
    (tmp_path / "outside.csv").write_text("secret\n")
    inventory = _lab(tmp_path, data)
    err = _fails(capsys, ["provision", str(inventory), "--out", str(tmp_path / "out")])
    assert "boards[0].data" in err and "outside" in err
    assert not (tmp_path / "out").exists()


def test_a_symlink_out_of_the_folder_is_refused(capsys, tmp_path):
    (tmp_path / "outside.csv").write_text("secret\n")
    inventory = _lab(tmp_path, "link.csv")
    (inventory.parent / "link.csv").symlink_to(tmp_path / "outside.csv")
    err = _fails(capsys, ["provision", str(inventory), "--out", str(tmp_path / "out")])
    assert "boards[0].data" in err and "outside" in err


def test_an_absolute_path_only_with_the_flag_and_never_wider(capsys, tmp_path):
    outside = tmp_path / "outside.csv"
    outside.write_text("1,2\n")
    os.chmod(outside, 0o644)
    inventory = _lab(tmp_path, str(outside))
    err = _fails(capsys, ["provision", str(inventory), "--out", str(tmp_path / "a")])
    assert "--allow-absolute-paths" in err
    assert main(["provision", str(inventory), "--out", str(tmp_path / "b"), "--allow-absolute-paths"]) == 0
    copied = tmp_path / "b" / "boards" / "pi-0" / "data" / "outside.csv"
    assert copied.read_text() == "1,2\n" and stat.S_IMODE(copied.stat().st_mode) == 0o600  # a node's data: its own


@pytest.mark.parametrize("mode", [0o644, 0o600, 0o400, 0o755, 0o666])
def test_a_copy_never_widens_the_sources_mode(tmp_path, mode):
    source = tmp_path / "s"
    source.write_text("x")
    os.chmod(source, mode)
    for ceiling in (0o644, 0o600):
        target = copy_file(source, tmp_path / f"t{ceiling:o}", ceiling=ceiling)
        got = stat.S_IMODE(target.stat().st_mode)
        assert got & ~mode == 0 and got & ~ceiling == 0


def test_provision_copies_the_inventorys_own_data_with_its_mode_narrowed(tmp_path):
    inventory = _lab(tmp_path, "shard.csv")
    os.chmod(inventory.parent / "shard.csv", 0o664)
    bundle = provision(load_inventory(inventory), tmp_path / "out")["pi-0"]
    assert stat.S_IMODE((bundle / "data" / "shard.csv").stat().st_mode) == 0o600


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.sampled_from(["..", ".", "sub", "shard.csv", "x", "", "/", "link"]), min_size=1, max_size=6))
def test_any_data_path_is_inside_the_folder_or_refused(tmp_path_factory, parts):
    tmp = tmp_path_factory.mktemp("inv")
    (tmp / "lab").mkdir()
    (tmp / "lab" / "sub").mkdir()
    (tmp / "lab" / "sub" / "shard.csv").write_text("1\n")
    (tmp / "lab" / "link").symlink_to(tmp)  # a folder link out of the lab
    (tmp / "shard.csv").write_text("secret\n")
    data = "/".join(parts) or "."
    try:
        inventory = load_inventory(_lab(tmp, data))
    except ConfigError as exc:
        assert "\n" not in str(exc) and "boards[0].data" in str(exc)
        return
    file = inventory.boards[0].data
    assert file is not None and (tmp / "lab").resolve() in file.resolve().parents


def test_inside_resolves_before_it_compares(tmp_path):
    (tmp_path / "a").mkdir()
    assert inside(tmp_path, "a/../a", "x") == (tmp_path / "a").resolve()
    with pytest.raises(UserError, match="outside"):
        inside(tmp_path / "a", "..", "x")


def test_more_boards_than_the_declared_maximum_are_refused_before_any_is_read(capsys, tmp_path):
    inventory = _lab(tmp_path, "", boards=MAX_BOARDS + 1)
    err = _fails(capsys, ["provision", str(inventory), "--out", str(tmp_path / "out")])
    assert f"{MAX_BOARDS + 1:,} boards, more than the {MAX_BOARDS:,}" in err
    assert not (tmp_path / "out").exists()


def test_a_million_boards_are_refused_by_the_inventorys_size_before_it_is_parsed(capsys, tmp_path):
    from testbed.orchestration.provision import MAX_INVENTORY_BYTES

    path = tmp_path / "inventory.toml"
    with open(path, "w") as f:
        f.write('broker = "mqtt://b:1883"\n')
        f.write("".join(f'[[boards]]\nhost = "pi-{i}"\nnode_id = {i}\n' for i in range(400_000)))
    assert path.stat().st_size > MAX_INVENTORY_BYTES
    err = _fails(capsys, ["provision", str(path), "--out", str(tmp_path / "out")])
    assert f"more than the {MAX_INVENTORY_BYTES:,} it may hold (an inventory of at most {MAX_BOARDS:,} boards)" in err


def test_an_inventory_that_is_a_device_is_one_line(capsys, tmp_path):
    err = _fails(capsys, ["provision", "/dev/zero", "--out", str(tmp_path / "out")])
    assert "/dev/zero" in err and "not a regular file" in err


# ---------------------------------------------------------------- a sweep's table


@pytest.mark.parametrize("run", ["../elsewhere", "/etc", "..", "a/b"])
def test_a_sweep_run_that_names_a_path_is_damage(tmp_path, run):
    folder = write_sweep(tmp_path / "s")
    text = (folder / "sweep.csv").read_text().replace("tau-1_lr-0.1_seed-0", run)
    (folder / "sweep.csv").write_text(text)
    with pytest.raises(UserError, match="is not the name of a folder in the sweep"):
        read_sweep(folder)


def test_fifos_in_a_run_folder_do_not_hang_the_watch_page(tmp_path):
    """A run folder's config.toml and metrics.csv made FIFOs: opened for reading they would wait
    for a writer forever; the page says what they are and goes on."""
    import json

    from testbed.watch.feed import RunFeed

    for name in ("config.toml", "metrics.csv"):
        os.mkfifo(tmp_path / name)
    feed = RunFeed(tmp_path)
    feed.poll()
    errors = json.loads(json.dumps(feed.snapshot(), allow_nan=False))["run"]["errors"]
    assert "not a regular file" in errors["config.toml"]
