"""Against whom each privacy figure holds: per observer, its ε and whether the noise behind it is
secret from that observer (docs/guarantees.md, "Whose randomness").

A release's noise is secret only if its observer cannot regenerate it: a node with its own secret
(testbed.streams.node_secret, "node_secret") draws its noise and batches from a key nobody else holds; an
emulated node ("run_seed") draws them from the run's seed, which the coordinator holds and every
round's experiment carries, so its ε holds against nobody who has the seed. The summary says it
per observer (``privacy_guarantees``) and per node (``randomness``); a mixed run names the nodes
of each kind.

A figure may rest on the server's noise too (PADPFL's σ_S in the public's broadcast: the
algorithm's ``server_noise_observers``). Its stream is the run seed's in sim and in an all-emulated
run; over MQTT with a node that has a secret, the coordinator keys it by a secret of its own
("server_secret", testbed.streams.node_secret.SERVER_KEY_FILE in the run directory, which the public does
not hold). Such an observer's entry says ``server_randomness`` and its statement names both
(:data:`SERVER_HOLDS`), or says the server's noise is derivable (:data:`SERVER_REPRODUCIBLE`).

Example::

    >>> nodes = {"0": {"epsilon_by_observer": {"server": 1.5}}, "1": {"epsilon_by_observer": {"server": 2.0}}}
    >>> [g["statement"] for g in privacy_guarantees("dp", nodes, {0: "node_secret", 1: "node_secret"}, 1e-5, "rdp")]
    ['holds (noise from node secrets)']
    >>> statement({"node_secret": [], "run_seed": [0, 1]})
    'reproducible run: noise derivable from the run seed, so not private against anyone holding it'
    >>> statement({"node_secret": [0, 1], "run_seed": []}, server="server_secret")
    'holds (noise from node secrets and a server secret)'
"""

from __future__ import annotations

from typing import Any, Mapping

from testbed.streams.node_secret import NODE_SECRET, RANDOMNESS, RUN_SEED, SERVER_SECRET

HOLDS = "holds (noise from node secrets)"
REPRODUCIBLE = "reproducible run: noise derivable from the run seed, so not private against anyone holding it"
#: A figure that rests on the server's noise too, drawn from the coordinator's secret.
SERVER_HOLDS = "holds (noise from node secrets and a server secret)"
#: ... drawn from the run seed, while the nodes' is secret: whoever holds the seed subtracts it.
SERVER_REPRODUCIBLE = ("reproducible run: the server's noise derivable from the run seed, so not private against "
                       "anyone holding it")
#: Added to a claim of secret noise in a resumed run: the nodes' readys of its earlier sessions are
#: not kept, so what they used then is the nodes' word in this session.
EARLIER_SESSIONS = "(as the nodes said in this session; what they used in the run's earlier sessions is not recorded)"
#: The observer of an ε-MI-DP release (ACFL's coded data set goes to the server).
MI_OBSERVER = "server"


def node_randomness(node_ids: Any, told: Mapping[int, str] | None) -> dict[int, str]:
    """Each node's randomness: what it told the coordinator (its ready), "run_seed" if it told
    nothing (sim, an older node: the weaker claim)."""
    told = told or {}
    return {int(n): told.get(int(n), RUN_SEED) for n in node_ids}


def by_kind(randomness: Mapping[int, str]) -> dict[str, list[int]]:
    """{"node_secret": [ids], "run_seed": [ids]}, ascending."""
    return {kind: sorted(n for n, k in randomness.items() if k == kind) for kind in RANDOMNESS}


def statement(kinds: Mapping[str, list[int]], resumed: bool = False, server: str | None = None) -> str:
    """The secrecy sentence of a figure over nodes of these kinds; per node kind when mixed; a
    claim of secret noise in a ``resumed`` run says it rests on this session's word. ``server``:
    the randomness of the server's noise the figure rests on too (:data:`SERVER_SECRET` or
    :data:`RUN_SEED`; None: it rests on none), which is everyone's noise when derivable."""
    secret, seeded = kinds.get(NODE_SECRET, []), kinds.get(RUN_SEED, [])
    if not secret:
        return REPRODUCIBLE
    if server is not None and server != SERVER_SECRET:
        return SERVER_REPRODUCIBLE
    said = (HOLDS if server is None else SERVER_HOLDS) + (f" {EARLIER_SESSIONS}" if resumed else "")
    if not seeded:
        return said
    return f"{said} for nodes {_ids(secret)}; {REPRODUCIBLE} for nodes {_ids(seeded)}"


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids[:20])) + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")


def privacy_guarantees(guarantee: str, nodes: Mapping[str, Mapping[str, Any]], randomness: Mapping[int, str],
                       delta: float, accountant: str, tight_accountant: str | None = None,
                       resumed: bool = False, server_randomness: str = RUN_SEED,
                       server_observers: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """The summary's ``privacy_guarantees``: one entry per observer of the run's privacy figures,
    {observer, epsilon (the worst node's; the tight accountant's when it ran), delta, accountant,
    randomness (node ids per kind, of the nodes charged against that observer), statement}; an
    observer of ``server_observers`` (whose figure rests on the server's noise too) also has
    ``server_randomness``, what keyed that noise (:data:`SERVER_SECRET` or :data:`RUN_SEED`).
    An ε-MI-DP run has one entry (nats, delta null); a run without noise none. ``resumed``: the
    run has earlier sessions, whose nodes' randomness is not recorded (:data:`EARLIER_SESSIONS`)."""
    if guarantee == "mi_dp":
        eps = max((n["mi_epsilon_nats"] for n in nodes.values()), default=0.0)
        kinds = by_kind({int(k): randomness.get(int(k), RUN_SEED) for k in nodes})
        return [{"observer": MI_OBSERVER, "epsilon": eps, "unit": "nats", "delta": None,
                 "accountant": "mutual-information ledger", "randomness": kinds,
                 "statement": statement(kinds, resumed)}]
    if guarantee != "dp":
        return []
    tight = tight_accountant is not None and all("epsilon_tight_by_observer" in n for n in nodes.values()) and nodes
    field = "epsilon_tight_by_observer" if tight else "epsilon_by_observer"
    observers = sorted({o for n in nodes.values() for o in n.get(field, {})})
    out = []
    for observer in observers:
        charged = {int(k): n[field][observer] for k, n in nodes.items() if observer in n.get(field, {})}
        kinds = by_kind({k: randomness.get(k, RUN_SEED) for k in charged})
        server = server_randomness if observer in server_observers else None
        entry = {"observer": observer, "epsilon": max(charged.values()), "delta": delta,
                 "accountant": tight_accountant if tight else accountant, "randomness": kinds,
                 "statement": statement(kinds, resumed, server)}
        if server is not None:
            entry["server_randomness"] = server
        out.append(entry)
    return out


def quote_against(headline: Mapping[str, Any], guarantees: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The summary's ``privacy.headline`` with whom it holds against: ``observer`` (the observer of
    the worst guarantee, whose ε the headline is) and ``secrecy`` (that guarantee's statement); both
    null for a run without noise.

    Example::

        >>> g = [{"observer": "peers", "epsilon": 2.0, "statement": HOLDS}, {"observer": "server", "epsilon": 1.0,
        ...       "statement": REPRODUCIBLE}]
        >>> quote_against({"measure": "epsilon", "value": 2.0}, g)["observer"]
        'peers'
    """
    worst = max(guarantees, key=lambda g: g["epsilon"], default=None)
    return {**headline, "observer": worst["observer"] if worst else None,
            "secrecy": worst["statement"] if worst else None}

