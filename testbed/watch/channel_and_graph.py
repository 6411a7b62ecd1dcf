"""What the watch page draws beside its table: an over-the-air run's channel (each node's gain and
received SNR in the current round's fading block) and a decentralised run's graph (the current
round's edges and positions, drawn again only when the round enters another block), each from the
view its algorithm registers (testbed.algorithms.contract.ChannelView, GraphView); beyond the
limits below the page says why it draws nothing. :class:`ChannelAndGraph` is that part of
testbed.watch.feed.RunFeed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from testbed.algorithms.contract import ChannelView, GraphView
from testbed.assembly import assemble
from testbed.errors import UserError
from testbed.watch.checks import json_number, one_line

#: A decentralised run's graph is drawn up to this many nodes and edges (every edge goes to the page
#: whenever the graph changes); above, the page says so and draws nothing.
MAX_GRAPH_NODES = 500
MAX_GRAPH_EDGES = 20_000


@dataclass
class ChannelShown:
    """An over-the-air run: the view of its channel its algorithm registers, and the links of the
    last block computed."""

    view: ChannelView
    block: int = -1
    gain: list = field(default_factory=list)
    snr_db: list = field(default_factory=list)


@dataclass
class GraphShown:
    """A decentralised run: the view of its graph its algorithm registers, and what the page is sent
    of the block last drawn (``drawn``: the feed version it changed at)."""

    view: GraphView
    num_nodes: int
    block: int = -1
    shown: dict | None = None
    drawn: int = -1


class ChannelAndGraph:
    """The channel and graph a run's page shows (a part of :class:`testbed.watch.feed.RunFeed`: its
    ``_channel``, ``_graph``, ``version`` and node views)."""

    def _read_graph(self, config) -> None:
        """A decentralised run's graph view (its algorithm's ``graph_view``); beyond
        :data:`MAX_GRAPH_NODES` nodes none is built and the page says why it draws nothing."""
        try:
            view = assemble.graph_view(config)
        except (ValueError, UserError) as exc:  # the page shows the rest of the run without its graph
            self._problem("config.toml", f"the graph: {one_line(exc)}")
            return
        if view is None:
            return
        n = config.data.num_nodes
        self._graph = GraphShown(view, n)
        if n > MAX_GRAPH_NODES:
            self._graph.shown = {"note": f"{n} nodes: more than the page draws ({MAX_GRAPH_NODES})"}
            self._graph.drawn = self.version

    def _update_channel(self) -> None:
        """An over-the-air run: each node's channel gain and received SNR (in dB) in the current
        round's fading block, as its algorithm's view of the channel draws them."""
        ch = self._channel
        if ch is None:
            return
        r = max(self.current_round(), 0)
        block = ch.view.block_of(r)
        if block == ch.block:
            return
        gain, snr = ch.view.links(r)
        ch.block = block
        ch.gain = [json_number(float(g)) for g in gain]
        ch.snr_db = [json_number(10 * math.log10(s)) if s > 0 else None for s in snr]
        self.version += 1
        for view in self.nodes.values():
            view.version = self.version

    def _update_graph(self) -> None:
        """A decentralised run: the current round's graph (``round``, ``block``, ``edges`` as
        [i, j] pairs, ``positions`` in m or None: the page lays the nodes on a circle), drawn again
        only when the round enters another block; beyond :data:`MAX_GRAPH_EDGES` edges, a ``note``."""
        g = self._graph
        if g is None or g.num_nodes > MAX_GRAPH_NODES:
            return
        r = max(self.current_round(), 0)
        try:
            block = g.view.block_of(r)
            if block == g.block:
                return
            edges = g.view.edges(r)
            positions = g.view.positions(r) if len(edges) <= MAX_GRAPH_EDGES else None
        except (ValueError, UserError) as exc:
            self._problem("config.toml", f"the graph: {one_line(exc)}")
            self._graph = None
            return
        g.block = block
        if len(edges) > MAX_GRAPH_EDGES:
            g.shown = {"round": r + 1, "block": block, "num_nodes": g.num_nodes,
                       "note": f"{len(edges)} edges: more than the page draws ({MAX_GRAPH_EDGES})"}
        else:
            g.shown = {"round": r + 1, "block": block, "num_nodes": g.num_nodes, "note": None,
                       "edges": np.asarray(edges, dtype=np.int64).tolist(),
                       "positions": None if positions is None else [[json_number(x), json_number(y)] for x, y in positions]}
        self.version += 1
        g.drawn = self.version
