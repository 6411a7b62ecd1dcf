"""The board kinds' registries: device and microcontroller profiles, meters and virtual boards.

Each registry is listed here; the config's choices, the JSON Schema, the node file's checks and the
CLI's choices and help are the registries' (not lists of their own); a meter added as one module
(here a throwaway one, in a folder of the test's) is usable from a node file and `make_meter`; a
virtual board added as one folder with its ``board.toml`` is one of `testbed bridge --virtual`'s
choices; a bad registration is refused in one line naming its file.
"""

import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

import nodes.meters
from firmware_bridge import virtual
from nodes import board_config
from nodes.costs import NodeCosts
from nodes.meters import registry as meters
from nodes.meters.model import ModelMeter
from testbed.assembly.config import NodesSection, json_schema
from testbed.cli import build_parser, main
from testbed.devices import profiles, virtual_boards
from testbed.errors import ConfigError, UserError
from testbed.checked.sections import field_choices

# ---- the registries, listed ----------------------------------------------------------------------


#: The built-in kinds, in their listed order: a registry lists them first (a plugin's may follow).
PROFILES = ("host", "pi-zero-2w", "pi-3b-plus", "pi-4b", "pi-5", "jetson-nano")
MCU_PROFILES = ("esp32-s3", "rp2040", "nrf52840", "stm32l4")
METERS = ("auto", "rapl", "ina219", "ina260", "model")


def test_the_registries_list_every_board_kind():
    assert profiles.profile_names()[:len(PROFILES)] == PROFILES
    assert profiles.mcu_profile_names()[:len(MCU_PROFILES)] == MCU_PROFILES
    assert {"host", "mps2-an385"} <= set(virtual_boards.names())
    assert [kind for kind in meters.kinds() if kind in METERS] == list(METERS)
    assert [reg.name for reg in meters.registrations().values() if reg.fallback] == ["model"]
    assert {name: meters.get(name).auto_rank for name in METERS[1:]} == {"rapl": 3, "ina219": 2, "ina260": 1,
                                                                         "model": None}
    for name in virtual_boards.names():
        board = virtual_boards.get(name)
        assert board.runner in virtual.RUNNERS and board.folder.name == name
        assert (board.folder / "board.mk").is_file(), f"{name}: its make rule lives in its folder"


def test_unknown_names_are_refused_in_one_line_naming_the_choices():
    for lookup, name, known in ((profiles.load_profile, "pi-6", profiles.profile_names()),
                                (profiles.load_mcu_profile, "avr", profiles.mcu_profile_names()),
                                (virtual_boards.get, "renode", virtual_boards.names()),
                                (meters.get, "joulemeter", meters.kinds())):
        with pytest.raises(UserError) as err:
            lookup(name)
        assert repr(name) in str(err.value) and ", ".join(known) in str(err.value) and "\n" not in str(err.value)


# ---- the config, the schema, the node file and the CLI read them --------------------------------


def test_config_choices_and_the_schema_are_the_registries():
    assert field_choices(NodesSection, "profile") == list(profiles.profile_names())
    assert field_choices(NodesSection, "mcu_profile") == list(profiles.mcu_profile_names())
    assert field_choices(NodesSection, "mcu_board") == list(virtual_boards.names())
    schema = json_schema()["$defs"]["NodesSection"]["properties"]
    assert schema["profile"]["enum"] == list(profiles.profile_names())
    assert schema["mcu_profile"]["enum"] == list(profiles.mcu_profile_names())
    assert schema["mcu_board"]["enum"] == list(virtual_boards.names())


def test_the_cli_takes_its_choices_and_help_from_the_registries(capsys):
    assert tuple(_subparsers(build_parser("bridge"))["bridge"]._option_string_actions["--virtual"].choices) == \
        virtual_boards.names()
    assert tuple(_subparsers(build_parser("node"))["node"]._option_string_actions["--meter"].choices) == meters.kinds()
    with pytest.raises(SystemExit):
        main(["bridge", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for name in virtual_boards.names():
        assert f"{name}: {' '.join(virtual_boards.get(name).description.split())}" in help_text
    with pytest.raises(SystemExit):
        main(["calibrate", "--help"])
    kinds = meters.kinds()
    assert f"{', '.join(kinds[:-1])} or {kinds[-1]}" in " ".join(capsys.readouterr().out.split())


@given(st.sampled_from(meters.kinds()) | st.from_regex(r"[A-Za-z0-9_. -]{0,12}", fullmatch=True))
def test_a_node_file_takes_exactly_the_registered_meters(kind):
    text = f"meter = {json.dumps(kind)}\n"
    if kind in meters.kinds():
        assert board_config.parse_board_config(text, "node.toml")["meter"] == kind
    else:
        with pytest.raises(ConfigError, match=r"node.toml: meter: must be one of auto, rapl, ina219, ina260, model"):
            board_config.parse_board_config(text, "node.toml")


@given(st.sampled_from(meters.names()), st.sampled_from(profiles.profile_names()))
def test_a_meter_that_measures_this_machine_is_refused_exactly_for_an_emulated_board(kind, profile):
    emulated = profiles.load_profile(profile).emulated
    if meters.get(kind).measures_host and emulated:
        with pytest.raises(UserError, match="emulated board"):
            meters.check_meter_fits_profile(kind, profile)
    else:
        meters.check_meter_fits_profile(kind, profile)
    if emulated:  # "auto" on an emulated board is the fallback, whatever this machine has
        assert isinstance(meters.make_meter("auto", profile), ModelMeter)


def test_provisioning_gives_a_meter_the_groups_its_registration_names():
    from testbed.orchestration.provision import node_unit

    for kind in meters.kinds():
        groups = () if kind == "auto" else meters.get(kind).unix_groups
        unit = node_unit("/opt/testbed/bin/testbed", kind)
        assert ("SupplementaryGroups=" in unit) == bool(groups)
        assert all(group in unit for group in groups)
    assert "SupplementaryGroups=i2c\n" in node_unit("/opt/testbed/bin/testbed", "ina260")


# ---- a meter added as one module -----------------------------------------------------------------

THROWAWAY_METER = '''
"""A meter that charges a fixed {watts} W of this machine's CPU seconds (the test's)."""

from nodes.meters.base import Measurement, Meter
from nodes.meters.registry import Registration


class FixedPowerMeter(Meter):
    kind = "{name}"

    def _end(self, state, cpu_s):
        return Measurement(cpu_s, cpu_s * {watts}, True, self.kind)


REGISTRATION = Registration("{name}", lambda options: FixedPowerMeter(), listed_at={listed_at},
                            unix_groups={groups!r})
'''


@pytest.fixture
def add_meter(tmp_path, monkeypatch):
    """Drop a meter module into a folder of nodes.meters' path (as adding a file to the package)."""
    monkeypatch.setattr(nodes.meters, "__path__", [*nodes.meters.__path__, str(tmp_path)])
    added = []

    def add(name: str, watts: float = 2.0, listed_at: int = 9, groups: tuple = (), module: str | None = None) -> None:
        module = module or name.replace("-", "_")
        (tmp_path / f"{module}.py").write_text(THROWAWAY_METER.format(name=name, watts=watts, listed_at=listed_at,
                                                                      groups=groups))
        added.append(f"nodes.meters.{module}")
        meters.registrations.cache_clear()

    yield add
    for module in added:
        sys.modules.pop(module, None)
    meters.registrations.cache_clear()


@pytest.mark.parametrize("listed_at, watts", [(9, 2.0), (0, 0.5)])
def test_a_meter_module_is_usable_from_a_node_file(add_meter, tmp_path, listed_at, watts):
    add_meter("zz-fixed-power-q7", watts=watts, listed_at=listed_at)
    kinds = meters.kinds()
    assert "zz-fixed-power-q7" in kinds and kinds.index("zz-fixed-power-q7") == (1 if listed_at == 0 else kinds.index("model") + 1)
    node_file = tmp_path / "node.toml"
    node_file.write_text('broker = "mqtt://127.0.0.1:1883"\nnode_id = 3\nmeter = "zz-fixed-power-q7"\n')
    values = board_config.load_board_config(node_file)
    costs = NodeCosts(values.get("profile", "host"), values["meter"])
    with costs.measure() as box:
        sum(i * i for i in range(20_000))
    measurement = box[0]
    assert measurement.measured and measurement.source == "zz-fixed-power-q7"
    assert measurement.energy_j == pytest.approx(measurement.seconds * watts)
    with pytest.raises(UserError, match="emulated board"):  # it measures this machine, not a Pi
        NodeCosts("pi-4b", "zz-fixed-power-q7")


def test_a_meter_module_brings_its_groups_to_the_provisioned_unit(add_meter):
    from testbed.orchestration.provision import node_unit

    add_meter("spi-meter", groups=("spi", "gpio"))
    assert "SupplementaryGroups=spi gpio\n" in node_unit("/opt/testbed/bin/testbed", "spi-meter")


def test_two_meters_of_one_name_are_refused(add_meter):
    with pytest.raises(RuntimeError, match="the meter name 'model' is taken"):
        add_meter("model", module="second_model")
        meters.registrations()


# ---- a virtual board added as one folder ---------------------------------------------------------


@pytest.fixture
def boards_dir(tmp_path, monkeypatch):
    """A boards folder holding copies of the shipped registrations, for the test to add one to."""
    folder = tmp_path / "boards"
    for name in virtual_boards.names():
        (folder / name).mkdir(parents=True)
        (folder / name / "board.toml").write_bytes((virtual_boards.get(name).folder / "board.toml").read_bytes())
    monkeypatch.setattr(virtual_boards, "BOARDS_DIR", folder)
    virtual_boards.registrations.cache_clear()
    yield folder
    virtual_boards.registrations.cache_clear()


TOY_BOARD = '''description = "a toy board under {runner}"
runner = "{runner}"
artifact = "toy.elf"
compiler = "cc"
compiler_env = "CC"
install = "gcc"
'''


@pytest.mark.parametrize("name, runner", [("toy-m0", "pty"), ("a-first", "renode")])
def test_a_virtual_board_folder_is_a_bridge_choice(boards_dir, capsys, name, runner):
    (boards_dir / name).mkdir()
    (boards_dir / name / "board.toml").write_text(TOY_BOARD.format(runner=runner))
    (boards_dir / "notes").mkdir()  # a folder without a registration is no board
    assert {"host", "mps2-an385", name} <= set(virtual_boards.names())
    bridge = _subparsers(build_parser("bridge"))["bridge"]
    assert name in bridge._option_string_actions["--virtual"].choices
    with pytest.raises(SystemExit):
        main(["bridge", "--help"])
    assert f"{name}: a toy board under {runner}" in " ".join(capsys.readouterr().out.split())
    if runner not in virtual.RUNNERS:  # started only by a runner firmware_bridge.virtual has
        with pytest.raises(UserError, match=f"names the runner 'renode'; known: {', '.join(virtual.RUNNERS)}"):
            virtual.start(name, "virtual-3", "rp2040")


@pytest.mark.parametrize("text, complaint", [
    ('description = "no runner"\n', "missing ['artifact', 'compiler', 'compiler_env', 'install', 'runner']"),
    (TOY_BOARD.format(runner="pty") + 'flash_kb = "64"\n', "unknown ['flash_kb']"),
    (TOY_BOARD.format(runner="pty").replace('"toy.elf"', '""'), "every value must be a non-empty string"),
])
def test_a_bad_registration_is_refused_naming_its_file(boards_dir, text, complaint):
    (boards_dir / "broken").mkdir()
    (boards_dir / "broken" / "board.toml").write_text(text)
    with pytest.raises(ValueError, match="broken/board.toml") as err:
        virtual_boards.names()
    assert complaint in str(err.value)


def _subparsers(parser) -> dict:
    """The sub-command parsers of a `testbed` parser, by command."""
    return next(action.choices for action in parser._actions if action.dest == "command")


# ---- the config is generated from them -----------------------------------------------------------

#: A device profile's table, added to profiles.toml by the tests.
PI_9 = '''
[zz-pi-q7]
description = "a board of the test"
compute_time_factor = 3.0
idle_power_w = 1.0
active_power_w = 2.0
wifi_up_bps = 1.0e7
wifi_down_bps = 1.0e7
radio_tx_power_w = 0.5
radio_rx_power_w = 0.2
sources = ["the test"]
'''

#: A process's start that reads nodes/ data files (profiles.toml) from the folder of its argument.
NODES_DATA_IN_ARGV = '''
import json, sys
from pathlib import Path
import testbed.devices.datafiles as datafiles
tmp = Path(sys.argv[1])
real = datafiles.package_dir
datafiles.package_dir = lambda package: tmp if package == "nodes" else real(package)
'''

GENERATED_CONFIG = NODES_DATA_IN_ARGV + '''from testbed.devices import virtual_boards
virtual_boards.BOARDS_DIR = tmp / "boards"
from testbed.assembly.config import NodesSection, json_schema
nodes = json_schema()["$defs"]["NodesSection"]["properties"]
section = NodesSection(profile="zz-pi-q7", mcu=[0], mcu_board="toy-m0")
print(json.dumps([nodes["profile"]["enum"], nodes["mcu_board"]["enum"], section.profile, section.mcu_board]))
'''


def test_a_profile_and_a_board_added_are_config_choices(boards_dir, tmp_path):
    """In a fresh process (the config's choices are made when it is imported): a table added to
    profiles.toml and a board folder added are choices of the config and its JSON Schema."""
    (tmp_path / "profiles.toml").write_text(profiles.PROFILES_FILE.read_text() + PI_9)
    (boards_dir / "toy-m0").mkdir()
    (boards_dir / "toy-m0" / "board.toml").write_text(TOY_BOARD.format(runner="pty"))
    done = subprocess.run([sys.executable, "-c", GENERATED_CONFIG, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    profile_enum, board_enum, profile, board = json.loads(done.stdout)
    # the file's tables in its order, zz-pi-q7 last among them; a plugin's after
    assert profile_enum[:len(PROFILES) + 1] == [*PROFILES, "zz-pi-q7"] and set(profiles.profile_names()) < set(profile_enum)
    assert {"host", "mps2-an385", "toy-m0"} <= set(board_enum)
    assert (profile, board) == ("zz-pi-q7", "toy-m0")


BAD_PROFILE = NODES_DATA_IN_ARGV + 'import testbed.devices.profiles as p\np.profile_names()\n'


@pytest.mark.parametrize("change, complaint", [
    (("wifi_up_bps = 1.0e7", "wifi_up_bps = -1.0e7"), "profile 'zz-pi-q7': wifi_up_bps out of range"),
    (("radio_rx_power_w = 0.2\n", ""), "profile 'zz-pi-q7' must have exactly the keys"),
])
def test_a_bad_profile_table_is_refused_naming_it(tmp_path, change, complaint):
    (tmp_path / "profiles.toml").write_text(profiles.PROFILES_FILE.read_text() + PI_9.replace(*change))
    done = subprocess.run([sys.executable, "-c", BAD_PROFILE, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"{tmp_path / 'profiles.toml'}: {complaint}" in done.stderr.strip().splitlines()[-1]
