"""The accountant registry: one module per accountant, found by testbed.privacy.accountants.registry;
the config's choices and the JSON Schema's enums come from it; every accountant's supports() agrees
with what it composes; a throwaway accountant registered in a test is usable from an experiment file."""

import json
import math
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

import testbed.privacy.accountants as package
from testbed.accounting.budgets import Budgets
from testbed.assembly.config import PrivacySection, json_schema, load_config_text
from testbed.errors import ConfigError
from testbed.ledger.events import ADJACENCIES, SAMPLINGS, GaussianEvent
from testbed.ledger.node import NodeLedger
from testbed.privacy.accountants import epsilon, registry, unsupported_reason
from testbed.checked.sections import field_choices

#: The built-in accountants, in listed order.
BUILT_IN = ("zcdp", "rdp", "pld")

# A throwaway accountant: basic composition of the classic Gaussian bound (each composition at
# δ/k), for replace-one sensitivities only. Its module is the whole of its registration.
THROWAWAY = '''
import math

from testbed.privacy.accountants.registry import Registration


def _refuses(pairs):
    if any(adjacency != "replace_one" for _, adjacency in pairs):
        return "the basic accountant composes replace-one sensitivities only"
    return None


def _compose(items, delta):
    k = sum(count for _, count in items)
    per_unit = math.sqrt(2 * math.log(1.25 * k / delta))
    return sum(count * sens / sigma for (sigma, sens, *_), count in items) * per_unit


REGISTRATION = Registration(name="zz_basic_q7", order=9, refuses=_refuses, compose=_compose)
'''


def _basic_epsilon(tally, delta):
    k = sum(tally.values())
    return sum(n * sens / sigma for (sigma, sens, *_), n in tally.items()) * math.sqrt(2 * math.log(1.25 * k / delta))


@pytest.fixture
def throwaway(tmp_path, monkeypatch):
    """The throwaway accountant's module in a folder of the accountants' package, for this test only."""
    folder = tmp_path / "accountants"
    folder.mkdir()
    (folder / "basic.py").write_text(THROWAWAY)
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
    registry.registrations.cache_clear()
    yield folder
    monkeypatch.undo()
    registry.registrations.cache_clear()
    sys.modules.pop(f"{package.__name__}.basic", None)


# ----------------------------------------------------------------------------- the registry


def test_the_registry_lists_one_module_per_accountant_in_listed_order():
    regs = registry.registrations()
    assert list(regs) == registry.names() and registry.names()[:3] == list(BUILT_IN)  # a plugin's may follow
    assert [name for name in registry.tight_names() if name in BUILT_IN] == ["rdp", "pld"]
    for name in BUILT_IN:
        reg = regs[name]
        module = sys.modules[f"{package.__name__}.{name}"]
        assert module.REGISTRATION is reg and reg.name == name
    assert [r.order for r in regs.values()] == sorted(r.order for r in regs.values())


def test_config_choices_and_schema_enums_come_from_the_registry():
    fields = PrivacySection.model_fields
    assert field_choices(PrivacySection, "accountant") == registry.names()
    assert field_choices(PrivacySection, "tight_accountant") == [*registry.tight_names(), registry.NONE]
    assert fields["accountant"].default == registry.names()[0]
    assert fields["tight_accountant"].default == registry.tight_names()[0]
    props = json_schema()["$defs"]["PrivacySection"]["properties"]
    assert props["accountant"]["enum"] == registry.names()
    assert props["tight_accountant"]["enum"] == [*registry.tight_names(), "none"]
    assert Budgets().accountant == registry.names()[0]


@pytest.mark.parametrize("key", ["accountant", "tight_accountant"])
@pytest.mark.parametrize("value", ['"moments"', '"none"', "3"])
def test_an_unregistered_choice_is_one_line_naming_the_key_and_the_choices(key, value):
    if key == "tight_accountant" and value == '"none"':
        assert load_config_text(f"[privacy]\n{key} = {value}\n").privacy.tight_accountant == "none"
        return
    with pytest.raises(ConfigError) as err:
        load_config_text(f"[privacy]\n{key} = {value}\n")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"config error: privacy.{key}: must be one of")
    choices = registry.names() if key == "accountant" else registry.tight_names()
    assert all(name in message for name in choices)


def test_an_unknown_name_is_refused_in_one_line_naming_the_known_ones():
    with pytest.raises(ValueError) as err:
        registry.get("moments")
    assert str(err.value) == f"unknown accountant 'moments'; choose one of {', '.join(registry.names())}"
    with pytest.raises(ValueError, match="unknown accountant"):
        epsilon("moments", Counter({(1.0, 1.0, "replace_one", "none", 1.0): 1}), 1e-5)


@pytest.mark.parametrize("name", ["zcdp", "none"])
def test_a_second_accountant_of_a_taken_or_reserved_name_is_refused(throwaway, name):
    (throwaway / "clash.py").write_text(THROWAWAY.replace('name="zz_basic_q7"', f'name="{name}"'))
    try:
        with pytest.raises(RuntimeError, match=repr(name)):
            registry.registrations()
    finally:
        sys.modules.pop(f"{package.__name__}.clash", None)


# ----------------------------------------------------------------------------- supports() and composing

# (σ, sensitivity, adjacency, sampling, rate) of a release at a noise multiplier σ/Δ from 4 to 16
# (where a PLD costs a tenth of a second), sampled at a rate up to 0.2.
signatures = st.builds(
    lambda z, sens, adjacency, sampling, rate: (z * sens, sens, adjacency, sampling,
                                                1.0 if sampling == "none" else rate),
    st.floats(4.0, 16.0), st.floats(0.01, 2.0), st.sampled_from(ADJACENCIES), st.sampled_from(SAMPLINGS),
    st.floats(0.01, 0.2))


@pytest.mark.parametrize("name", registry.names())
@given(events=st.lists(signatures, min_size=1, max_size=4), count=st.integers(1, 50))
def test_an_accountant_refuses_in_one_line_what_it_does_not_support(name, events, count):
    """Statically and cheaply: a set it supports is supported event by event; one it does not is
    refused by epsilon() with that same one line, before anything is composed."""
    reg = registry.get(name)
    reason = reg.unsupported_reason(events)
    assert reason == unsupported_reason(name, [GaussianEvent(0, 0, *sig[:2], 1, *sig[2:]) for sig in events])
    if reason is None:
        assert all(reg.supports(sig) for sig in events)
        return
    assert "\n" not in reason and name in reason
    with pytest.raises(ValueError) as err:
        epsilon(name, Counter({sig: count for sig in events}), 1e-5)
    assert str(err.value) == reason


@pytest.mark.parametrize("name", registry.names())
@settings(max_examples=10)  # a tight accountant composes in ~0.1 s: ten signatures, two counts each
@given(sig=signatures, count=st.integers(1, 10), more=st.integers(1, 10), delta=st.sampled_from([1e-5, 1e-3]))
def test_a_supported_event_composes_to_a_finite_epsilon_monotone_in_compositions(name, sig, count, more, delta):
    reg = registry.get(name)
    if not reg.supports(sig):
        return  # the property above holds it to its refusal
    fewer = epsilon(name, Counter({sig: count}), delta)
    larger = epsilon(name, Counter({sig: count + more}), delta)
    assert 0.0 <= fewer < math.inf and 0.0 <= larger < math.inf
    assert fewer <= larger * (1 + 1e-9)


@pytest.mark.parametrize("name", registry.names())
def test_every_accountant_supports_an_unsampled_replace_one_release(name):
    """What DWFL and PADPFL release (no sampling, replace-one): every accountant can report it."""
    assert registry.get(name).supports((2.0, 1.0, "replace_one", "none", 1.0))


# ----------------------------------------------------------------------------- a throwaway accountant


def test_a_registered_module_is_an_accountant_budgets_and_the_ledger_ask(throwaway):
    assert registry.names()[:4] == ["zcdp", "rdp", "pld", "zz_basic_q7"]  # basic's order 9: before a plugin's default
    assert [name for name in registry.tight_names() if name in BUILT_IN] == ["rdp", "pld"]
    ledger = NodeLedger(node=0)
    release = GaussianEvent(0, 0, 4.0, 0.5, 3, sampling="without_replacement", sampling_rate=0.1)
    ledger.extend([release])
    spent = _basic_epsilon(Counter({release.signature: 3}), 1e-5)
    assert epsilon("zz_basic_q7", ledger.privacy, 1e-5) == pytest.approx(spent, rel=1e-12)
    budgets = Budgets(epsilon=spent * 1.5, delta=1e-5, accountant="zz_basic_q7")
    assert budgets.would_exceed(ledger, []) is None
    assert budgets.would_exceed(ledger, [release]).budget == "epsilon"
    poisson = GaussianEvent(0, 1, 4.0, 0.5, 1, adjacency="add_remove", sampling="poisson", sampling_rate=0.1)
    assert unsupported_reason("zz_basic_q7", [release, poisson]) == ("the basic accountant composes replace-one "
                                                               "sensitivities only")
    with pytest.raises(ValueError, match="replace-one sensitivities only"):
        budgets.would_exceed(ledger, [poisson])


RUN = """
import json, sys
import testbed.privacy.accountants as package
package.__path__.append(sys.argv[1])
from testbed.cli import main
from testbed.assembly.config import PrivacySection, json_schema
from testbed.checked.sections import field_choices
out = {"choices": field_choices(PrivacySection, "accountant"),
       "enum": json_schema()["$defs"]["PrivacySection"]["properties"]["accountant"]["enum"]}
out["codes"] = [main(["run", sys.argv[2], "--quiet", "--out", out_dir, *extra])
                for out_dir, extra in json.loads(sys.argv[3])]
print(json.dumps(out))
"""


def test_a_throwaway_accountant_is_usable_from_an_experiment_file(tmp_path, small_config_file):
    """A module in the package's folder is all it takes: the schema offers it, a run enforces its
    ε (a budget stop by it), and a run whose releases it cannot account is refused before round 1
    with one line naming the key."""
    folder = tmp_path / "accountants"
    folder.mkdir()
    (folder / "basic.py").write_text(THROWAWAY)
    basic = ["--set", 'privacy.accountant="zz_basic_q7"', "--set", 'privacy.tight_accountant="none"']
    runs = [(str(tmp_path / "ok"), basic),
            (str(tmp_path / "stop"), [*basic, "--set", "budget.epsilon=15.0"]),
            (str(tmp_path / "no"), [*basic, "--set", 'dp_pasgd.sampling="poisson"'])]
    proc = subprocess.run([sys.executable, "-c", RUN, str(folder), str(small_config_file), json.dumps(runs)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["choices"] == out["enum"] and out["enum"][:4] == ["zcdp", "rdp", "pld", "zz_basic_q7"]
    assert out["codes"] == [0, 0, 2]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("testbed:")]
    assert errors == ["testbed: config error: privacy.accountant: the basic accountant composes replace-one "
                      "sensitivities only"]
    assert not (tmp_path / "no" / "config.toml").exists()

    from testbed.ledger.files import read_ledger

    ok = json.loads((tmp_path / "ok" / "summary.json").read_text())
    assert ok["status"] == "completed" and ok["budgets"]["accountant"] == "zz_basic_q7"
    for node, entry in ok["nodes"].items():
        tally = NodeLedger(int(node)).projected([e for e in read_ledger(tmp_path / "ok" / "ledger.csv")
                                                 if e.node == int(node)])[1]["server"]
        assert entry["epsilon"] == pytest.approx(_basic_epsilon(tally, ok["budgets"]["delta"]), rel=1e-12)
    stopped = json.loads((tmp_path / "stop" / "summary.json").read_text())
    assert stopped["status"] == "stopped_budget" and stopped["stopped"]["budget"] == "epsilon"
    assert 0 < stopped["rounds"] < ok["rounds"]
    worst = max(n["epsilon"] for n in stopped["nodes"].values())
    assert 0 < worst <= 15.0 < max(n["epsilon"] for n in ok["nodes"].values())
