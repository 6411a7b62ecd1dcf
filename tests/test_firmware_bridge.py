"""The bridge against a virtual board: a round equals the emulation; garbage on the line, a board
reset mid-round, a serial disconnect and non-finite numbers make a straggler, never a crash."""

import numpy as np
import pytest

from firmware_bridge import messages as m
from firmware_bridge.agent import BoardUnavailable, BridgeAgent
from firmware_bridge.framing import Frame, encode_frame
from firmware_bridge.virtual import HostBoard
from testbed.algorithms.contract import RoundContext
from testbed.assembly import assemble
from testbed.assembly.assemble import load_data, model_for
from testbed.assembly.config import load_config_text, to_toml
from testbed.ledger.fields import event_from_dict
from testbed.ledger.files import read_ledger
from testbed.mqtt import wire
from testbed.rounds import protocol

from conftest_firmware import needs_cc

pytestmark = needs_cc

CONFIG = """
[data]
num_nodes = 3
samples_per_node = 60
dim = 4
[dp_pasgd]
steps = 12
tau = 3
batch = 8
lr = {lr}
sigma = {sigma}
[nodes]
mcu = [1]
"""


def _config(lr=0.5, sigma=1.0):
    return load_config_text(CONFIG.format(lr=lr, sigma=sigma))


def _round(cfg, r, theta):
    return wire.decode(protocol.round_("testbed", "s1", r, to_toml(cfg), [0, 1, 2], {"model": theta}))


def _emulated(cfg, r, theta):
    """What sim computes for node 1 in round r from theta."""
    data = load_data(cfg.data, cfg.run.seed)
    alg = assemble.build_algorithm(cfg, model_for(cfg.model, data, cfg.run.seed), data)
    ctx = RoundContext(r, cfg.run.seed, 3, (0, 1, 2))
    return alg.node_step({"model": np.tile(theta, (3, 1))}, data.train, [0, 1, 2], ctx).tensors["update"][1]


def _update(reply):
    assert reply is not None and reply.to == protocol.COORDINATOR
    msg = wire.decode(reply.payload)
    assert msg.kind == protocol.UPDATE
    return msg


def test_a_round_on_the_board_equals_sim_and_is_charged(tmp_path):
    cfg = _config()
    theta = np.linspace(-0.2, 0.2, 10)
    with HostBoard(profile="nrf52840") as board:
        agent = BridgeAgent(1, board.url, state_dir=tmp_path)
        try:
            msg = _update(agent.handle(_round(cfg, 0, theta)))
            np.testing.assert_allclose(msg.tensors["update"], _emulated(cfg, 0, theta), rtol=1e-5, atol=1e-6)
            compute = [event_from_dict(e) for e in msg.meta["events"] if e["kind"] == "compute"][0]
            assert (compute.node, compute.round) == (1, 0)
            assert compute.compute_s > 0 and compute.energy_j > 0 and not compute.measured
            _update(agent.handle(_round(cfg, 1, theta)))  # the data stays on the board: no second provision
        finally:
            agent.close()
    ledger = list(read_ledger(next(tmp_path.glob("ledger-*.csv"))))
    setup = [e for e in ledger if e.round == -1]
    assert len(setup) == 1 and setup[0].kind == "communication" and setup[0].bytes_down > 60 * 4 * 0.8 * 4


def test_garbage_on_the_line_is_counted_and_the_round_still_runs(tmp_path):
    cfg = _config()
    theta = np.zeros(10)
    with HostBoard() as board:
        agent = BridgeAgent(1, board.url)
        try:
            _update(agent.handle(_round(cfg, 0, theta)))
            link = agent.board.link
            rng = np.random.default_rng(0)
            good = encode_frame(Frame(m.HELLO, 9, m.hello_request(5)))
            body_bad_crc = bytearray(good)
            body_bad_crc[3] ^= 0x40
            link.port.write(bytes(rng.integers(1, 256, 3000).astype(np.uint8)) + b"\x00"  # random bytes
                            + good[:5] + b"\x00"                                         # truncated
                            + bytes(body_bad_crc)                                        # wrong CRC
                            + b"\x11" * 2000 + b"\x00"                                   # oversized
                            + encode_frame(Frame(m.ROUND, 1, b"\x00", version=7))        # unknown version
                            + encode_frame(Frame(0x42, 2, b"")))                         # unknown type
            msg = _update(agent.handle(_round(cfg, 1, theta)))
            np.testing.assert_allclose(msg.tensors["update"], _emulated(cfg, 1, theta), rtol=1e-5, atol=1e-6)
            assert link.stats["board_error_oversize"] >= 1
            assert sum(v for k, v in link.stats.items() if k.startswith("board_error_")) >= 4
        finally:
            agent.close()


def test_board_reset_mid_round_is_a_straggler_and_rejoins(tmp_path):
    cfg = _config()
    theta = np.full(10, 0.1)
    with HostBoard(reset_at_round=1) as board:
        agent = BridgeAgent(1, board.url, state_dir=tmp_path)
        try:
            _update(agent.handle(_round(cfg, 0, theta)))
            with pytest.raises(BoardUnavailable, match="reset mid-round"):
                agent.handle(_round(cfg, 1, theta))
            msg = _update(agent.handle(_round(cfg, 2, theta)))  # data provisioned again, back in the run
            np.testing.assert_allclose(msg.tensors["update"], _emulated(cfg, 2, theta), rtol=1e-5, atol=1e-6)
        finally:
            agent.close()
    ledger = list(read_ledger(next(tmp_path.glob("ledger-*.csv"))))
    assert sorted({e.round for e in ledger if e.kind == "compute"}) == [0, 2]  # round 1 charged nothing
    assert len([e for e in ledger if e.round == -1]) == 2  # provisioned twice


def test_serial_disconnect_is_a_straggler_and_the_board_rejoins_when_plugged_back(tmp_path):
    cfg = _config()
    theta = np.zeros(10)
    line = tmp_path / "ttyBOARD"
    board = HostBoard(link=line)
    agent = BridgeAgent(1, str(line))
    try:
        _update(agent.handle(_round(cfg, 0, theta)))
        board.stop()  # unplugged
        with pytest.raises(BoardUnavailable):
            agent.handle(_round(cfg, 1, theta))
        with pytest.raises(BoardUnavailable, match="cannot open"):
            agent.handle(_round(cfg, 2, theta))  # still unplugged
        board = HostBoard(link=line)  # plugged back (a new pseudo-terminal behind the same link)
        msg = _update(agent.handle(_round(cfg, 3, theta)))
        np.testing.assert_allclose(msg.tensors["update"], _emulated(cfg, 3, theta), rtol=1e-5, atol=1e-6)
    finally:
        agent.close()
        board.stop()


def test_non_finite_numbers_from_the_board_are_refused_and_the_round_it_ran_charged(tmp_path):
    cfg = _config(sigma=10.0)
    with HostBoard() as board:
        agent = BridgeAgent(1, board.url, state_dir=tmp_path)
        try:
            with pytest.raises(BoardUnavailable, match="non-finite"):
                # a model at float32's edge: the board's float32 step overflows (its input is finite)
                agent.handle(_round(cfg, 0, np.full(10, 3e38)))
        finally:
            agent.close()
    ledger = list(read_ledger(next(tmp_path.glob("ledger-*.csv"))))
    assert sorted(e.kind for e in ledger if e.round == 0) == ["communication", "compute", "privacy"]


def test_an_unknown_line_is_one_line_error():
    agent = BridgeAgent(1, "/dev/does-not-exist")
    with pytest.raises(BoardUnavailable, match="cannot open serial line /dev/does-not-exist"):
        agent.handle(_round(_config(), 0, np.zeros(10)))
