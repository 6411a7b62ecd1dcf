"""`testbed topology show FILE`: the graph an experiment's decentralised algorithm runs on (its
``[topology]``, drawn as the run draws it): kind, nodes, edges, degrees, connectivity, the spectral
gap of its mixing weights and, for random_geometric, the radio's range; ``--edges`` writes the
round's edge list in the ``file`` kind's format, to run again on the same graph."""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.checked.arguments import Number
from testbed.checked.limits import MAX_INT
from testbed.cli.examples import EXAMPLES, epilog
from testbed.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    from testbed.cli import Parser

    topology = sub.add_parser("topology", help="show the graph of a decentralised run")
    commands = topology.add_subparsers(dest="topology_command", required=True, parser_class=Parser)
    show = commands.add_parser("show", help="the graph of an experiment file's round", epilog=epilog(EXAMPLES["topology"]))
    show.add_argument("file", type=Path, help="the experiment file")
    show.add_argument("--round", type=Number(int, ge=1, le=MAX_INT), default=1, metavar="R",
                      help="the round whose graph to show, from 1 (default: 1)")
    show.add_argument("--edges", type=Path, metavar="FILE",
                      help="write the round's edge list here ([topology] kind = \"file\" reads it)")
    show.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override any key of the file, e.g. --set topology.kind=ring (repeatable)")
    show.set_defaults(handler=_show)


def _show(args: argparse.Namespace) -> int:
    from testbed.assembly import assemble
    from testbed.assembly.experiment import experiment_config
    from testbed.topology.describe import describe_round, edge_list_text
    from testbed.topology.view import TopologyView

    config = experiment_config(args.file, args.overrides)
    view = assemble.graph_view(config)
    if view is None:
        raise UserError(f"{config.run.algorithm} is not a decentralised algorithm: it runs on no graph")
    if not isinstance(view, TopologyView):
        raise UserError(f"{config.run.algorithm}'s graph is its own, not a [topology] graph, which this command shows")
    topology, round_index = view.topology, args.round - 1
    for key, value in describe_round(topology, round_index, view.mixing).items():
        print(f"{key}: {value}")
    if args.edges is not None:
        text = edge_list_text(topology, round_index)
        try:
            args.edges.write_text(text)
        except OSError as exc:
            raise UserError(f"cannot write {args.edges}: {exc.strerror}") from None
        print(f"wrote {args.edges}")
    return 0
