"""Impossible runs are refused up front, in one line, before any data are built."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from testbed.assembly import resources
from testbed.assembly.config import load_config_text
from testbed.errors import ConfigError
from testbed.util import memory

from conftest import REPO


def test_ten_million_nodes_are_refused_in_one_line_within_two_seconds(small_config_file, tmp_path):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "testbed", "run", str(small_config_file), "--out",
                           str(tmp_path / "r"), "--set", "data.num_nodes=10_000_000"],
                          cwd=REPO, capture_output=True, text=True, timeout=30)
    assert time.monotonic() - started < 2.0
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("testbed: config error: data.num_nodes: 10,000,000 nodes need about")
    assert "GiB" in lines[0] and "available" in lines[0]
    assert not (tmp_path / "r" / "ledger.csv").exists()  # refused before the run directory


def test_the_estimate_grows_with_nodes_samples_and_features(small_config_text):
    config = load_config_text(small_config_text)
    base = sum(resources.estimate_bytes(config).values())
    for key in ("data.num_nodes=40", "data.samples_per_node=800", "data.dim=80"):
        assert sum(resources.estimate_bytes(load_config_text(small_config_text, [key])).values()) > base
    resources.check_fits(config)  # a small run fits


def test_refused_when_over_the_available_memory(small_config_text, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 1024)
    with pytest.raises(ConfigError, match=r"need about .* this machine has 1 KiB available"):
        resources.check_fits(load_config_text(small_config_text))


def test_an_emulated_host_needs_a_socket_per_node(small_config_text, monkeypatch):
    config = load_config_text(small_config_text, ["run.mode='mqtt'", "data.num_nodes=500"])
    monkeypatch.setattr(resources.resource, "getrlimit", lambda which: (256, 256))
    with pytest.raises(ConfigError, match=r"mqtt.hosts: 500 emulated nodes per host need 564 open files.*"
                                          r"use mqtt.hosts >= 3"):
        resources.check_fits(config)
    resources.check_fits(load_config_text(small_config_text, ["run.mode='mqtt'", "data.num_nodes=500",
                                                               "mqtt.hosts=3", "mqtt.broker_url='mqtt://b:1883'"]))


def test_the_embedded_broker_needs_a_socket_per_node_in_the_coordinator(small_config_text, monkeypatch):
    monkeypatch.setattr(resources.resource, "getrlimit", lambda which: (1024, 1024))
    sets = ["run.mode='mqtt'", "data.num_nodes=2000", "mqtt.hosts=4"]
    with pytest.raises(ConfigError, match=r"mqtt.broker_url: the embedded broker .* 2,000 nodes need 2,064 open "
                                          r"files, over this machine's hard limit of 1,024"):
        resources.check_fits(load_config_text(small_config_text, sets))
    resources.check_fits(load_config_text(small_config_text, [*sets, "mqtt.broker_url='mqtt://b:1883'"]))


def test_more_emulated_nodes_than_ephemeral_ports_are_refused(small_config_text, monkeypatch):
    monkeypatch.setattr(resources, "_ephemeral_ports", lambda: 100)
    with pytest.raises(ConfigError, match="data.num_nodes: 98 emulated nodes need 101 connections to the broker, "
                                          "over the 100 ephemeral ports"):
        resources.check_fits(load_config_text(small_config_text, ["run.mode='mqtt'", "data.num_nodes=98",
                                                                   "mqtt.hosts=2"]))
    resources.check_fits(load_config_text(small_config_text, ["run.mode='mqtt'", "data.num_nodes=97",
                                                               "mqtt.hosts=2"]))
    resources.check_fits(load_config_text(small_config_text, ["data.num_nodes=101"]))  # sim: no sockets
