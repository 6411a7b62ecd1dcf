"""Device profiles (nodes/profiles.toml) and the virtual clock built on them (nodes/meters/clock.py)."""

import time

import pytest

from nodes.meters.clock import Pacer, comm_cost, compute_cost
from testbed.devices.profiles import HOST, DeviceProfile, load_profile, profile_names
from testbed.errors import UserError

BOARDS = ("pi-zero-2w", "pi-3b-plus", "pi-4b", "pi-5", "jetson-nano")


def test_every_board_and_the_host_have_a_profile():
    assert {HOST, *BOARDS} <= set(profile_names())


@pytest.mark.parametrize("name", profile_names())
def test_profile_figures_are_in_range_and_cited(name):
    p = load_profile(name)
    assert isinstance(p, DeviceProfile) and p.name == name
    assert p.compute_time_factor > 0 and p.wifi_up_bps > 0 and p.wifi_down_bps > 0
    assert p.active_power_w >= p.idle_power_w >= 0
    assert p.radio_tx_power_w >= 0 and p.radio_rx_power_w >= 0
    assert p.sources and all(isinstance(s, str) and s for s in p.sources)


def test_host_is_unscaled_and_not_emulated():
    host = load_profile(HOST)
    assert host.compute_time_factor == 1.0 and not host.emulated
    assert all(load_profile(b).emulated for b in BOARDS)


def test_boards_are_slower_than_the_host_in_the_expected_order():
    factor = {b: load_profile(b).compute_time_factor for b in BOARDS}
    assert factor["pi-zero-2w"] > factor["pi-3b-plus"] > factor["jetson-nano"] > factor["pi-4b"] > factor["pi-5"] > 1


def test_unknown_profile_lists_the_names():
    with pytest.raises(UserError) as err:
        load_profile("pi-6")
    assert "pi-6" in str(err.value)
    assert all(name in str(err.value) for name in profile_names())


def test_compute_cost_scales_cpu_time_and_charges_active_power():
    p = load_profile("pi-4b")
    board_s, energy_j = compute_cost(0.002, p)
    assert board_s == pytest.approx(0.002 * p.compute_time_factor)
    assert energy_j == pytest.approx(board_s * p.active_power_w)
    assert compute_cost(0.0, p) == (0.0, 0.0)


def test_comm_cost_from_wifi_rates_and_radio_power():
    p = load_profile("pi-zero-2w")
    airtime_s, energy_j = comm_cost(1000, 3000, p)
    up_s, down_s = 8000 / p.wifi_up_bps, 24000 / p.wifi_down_bps
    assert airtime_s == pytest.approx(up_s + down_s)
    assert energy_j == pytest.approx(up_s * (p.idle_power_w + p.radio_tx_power_w)
                                     + down_s * (p.idle_power_w + p.radio_rx_power_w))


def test_comm_cost_of_the_host_link_is_tiny_and_free_of_radio_energy():
    host = load_profile(HOST)
    airtime_s, energy_j = comm_cost(1616, 1616, host)
    assert airtime_s == pytest.approx(2 * 1616 * 8 / 1e9)
    assert energy_j == 0.0


def test_pacer_sleeps_the_remaining_board_time():
    slept = []
    pacer = Pacer(enabled=True, sleep=slept.append)
    assert pacer.wait(board_s=0.5, host_elapsed_s=0.2) == pytest.approx(0.3)
    assert pacer.wait(board_s=0.1, host_elapsed_s=0.2) == 0.0  # the host was slower: no sleep
    assert slept == [pytest.approx(0.3)]


def test_disabled_pacer_never_sleeps():
    slept = []
    assert Pacer(enabled=False, sleep=slept.append).wait(board_s=5.0, host_elapsed_s=0.0) == 0.0
    assert slept == []


def test_pacer_really_sleeps_by_default():
    start = time.monotonic()
    Pacer(enabled=True).wait(board_s=0.05, host_elapsed_s=0.0)
    assert time.monotonic() - start >= 0.045
