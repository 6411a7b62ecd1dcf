"""Radio cost has one owner: the channel model's figures are kept, the device profile fills the rest."""

import numpy as np
import pytest

from testbed.algorithms import RoundContext

from nodes.costs import NodeCosts
from nodes.meters.clock import comm_cost
from testbed.accounting.budgets import Budgets
from testbed.assembly import assemble
from testbed.assembly.config import load_config_text
from testbed.data.synthetic import make_logistic
from testbed.devices.profiles import load_profile
from testbed.learning.models import LogisticRegression
from testbed.ledger.events import CommunicationEvent
from testbed.ledger.node import NodeLedger

DIM = 6
DATA = make_logistic(num_nodes=5, samples_per_node=60, dim=DIM, seed=4)
MODEL = LogisticRegression(DIM, 2)
DWFL = """
[run]
algorithm = "dwfl"
seed = 4
[data]
num_nodes = 5
samples_per_node = 60
dim = 6
[dwfl]
rounds = 3
batch = 8
epsilon = 0.5
fading = "none"
c_scale = 0.7
"""
DP_PASGD = """
[run]
algorithm = "dp_pasgd"
seed = 4
[data]
num_nodes = 5
samples_per_node = 60
dim = 6
[dp_pasgd]
steps = 4
tau = 2
batch = 8
sigma = 1.0
"""


def _comm(events):
    return [e for e in events if isinstance(e, CommunicationEvent)]


def test_dwfl_keeps_the_channel_models_airtime_and_energy():
    alg = assemble.build_algorithm(load_config_text(DWFL), MODEL, DATA)
    costs = NodeCosts("pi-4b", meter="model")
    for node in range(DATA.num_nodes):
        ledger, budgets = NodeLedger(node), Budgets(energy_j=1e-30)
        planned = alg.planned_events(node, RoundContext.everyone(0, 0, DATA.num_nodes))
        (want,) = _comm(planned)
        assert want.airtime_s > 0 and want.energy_j > 0
        charged = costs.charge_modelled(planned, host_cpu_s=1e-3)
        (got,) = _comm(charged)
        assert (got.airtime_s, got.energy_j, got.measured) == (want.airtime_s, want.energy_j, False)
        # The budget check forecasts the planned joules; the ledger then holds exactly those for the link.
        forecast = budgets.would_exceed(ledger, planned)
        assert forecast.budget == "energy_j"
        ledger.extend(charged)
        assert forecast.would_be == pytest.approx(sum(e.energy_j for e in _comm(charged)), rel=1e-15)


def test_dp_pasgd_events_get_the_profiles_wifi_model():
    alg = assemble.build_algorithm(load_config_text(DP_PASGD), MODEL, DATA)
    planned = alg.planned_events(0, RoundContext.everyone(0, 0, DATA.num_nodes))
    (want,) = _comm(planned)
    assert want.airtime_s == want.energy_j == 0.0
    (got,) = _comm(NodeCosts("pi-4b", meter="model").charge_modelled(planned, host_cpu_s=1e-3))
    airtime_s, energy_j = comm_cost(want.bytes_up, want.bytes_down, load_profile("pi-4b"))
    assert (got.airtime_s, got.energy_j, got.measured) == (airtime_s, energy_j, False)
    assert got.airtime_s > 0


def test_nodes_stepped_on_one_plan_are_charged_as_each_alone():
    """charge_by_node charges a plan that differs only in the node field once (NodeEvents without
    columns) and gives each node its copy: the events each node's own charge would give it, and so
    for nodes whose events differ in more than the node field (the general way); costs of another
    kind (a board's) charge each node's own events."""
    from nodes.costs import charge_by_node
    from nodes.meters.base import Measurement
    from testbed.ledger.events import ComputeEvent, EventBatch, GaussianEvent, NodeEvents, with_fields

    costs = NodeCosts("pi-4b", meter="model")
    share = Measurement(seconds=2.5e-4, energy_j=1e-3, measured=False, source="model:pi-4b")
    plan = [ComputeEvent(0, 3, local_steps=5), CommunicationEvent(0, 3, bytes_up=800, bytes_down=800),
            GaussianEvent(0, 3, sigma=1.0, sensitivity=0.1, count=5)]
    nodes = [4, 7, 9]
    one_plan = NodeEvents.uniform(plan, nodes)
    apart = NodeEvents([EventBatch(plan[0], np.array(nodes), {"local_steps": np.array([5, 6, 7])}),
                        *(EventBatch(e, np.array(nodes)) for e in plan[1:])], nodes)
    for events in (one_plan, apart, [list(e) for e in apart]):
        charged = charge_by_node(costs, events, nodes, share)
        assert charged == {node: costs.charge(events[i], share) for i, node in enumerate(nodes)}
        assert all(e.node == node for node, own in charged.items() for e in own)
    assert charged[9][0].local_steps == 7 and charged[4][1].airtime_s > 0 and charged[7][0].compute_s == 2.5e-4

    class BoardLike:  # a board's costs: its own charge, which may read anything of an event
        def charge(self, events, compute):
            return [with_fields(e, cost_units=float(e.node)) if e.kind == "compute" else e for e in events]

    charged = charge_by_node(BoardLike(), one_plan, nodes, share)
    assert [charged[n][0].cost_units for n in nodes] == [4.0, 7.0, 9.0]
