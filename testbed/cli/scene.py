"""`testbed scene show FILE -o scene.png`: the scene an experiment's radio is ray traced in, from
above (testbed.reports.scene_picture): the buildings, the nodes where the run places them with their
ids, the links of the run's graph in its first round coloured by their traced gain, and with
``--radio-map NODE`` that node's coverage (Sionna RT's radio map, path gain in dB) underneath."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from testbed.checked.arguments import Number
from testbed.checked.limits import MAX_INT
from testbed.cli.examples import EXAMPLES, epilog
from testbed.errors import UserError

#: Rays shot for a radio map: its cells' Monte Carlo estimate (the picture, not a run, reads them).
RADIO_MAP_SAMPLES = 10_000_000


def register(sub: argparse._SubParsersAction) -> None:
    from testbed.cli import Parser

    scene = sub.add_parser("scene", help="show the scene a run's radio is ray traced in")
    commands = scene.add_subparsers(dest="scene_command", required=True, parser_class=Parser)
    show = commands.add_parser("show", help="the scene from above, with the nodes, links and a radio map, as PNG",
                               epilog=epilog(EXAMPLES["scene"]))
    show.add_argument("file", type=Path, help="the experiment file (its radio has pathloss = \"scene\")")
    show.add_argument("-o", "--out", type=Path, default=Path("scene.png"), metavar="PNG",
                      help="the picture to write (default: scene.png)")
    show.add_argument("--radio-map", type=Number(int, ge=0, le=MAX_INT), metavar="NODE",
                      help="draw this node's coverage under the scene (Sionna RT's radio map)")
    show.add_argument("--cell", type=Number(float, gt=0.0, le=1e4), default=2.0, metavar="M",
                      help="the radio map's cell size, m (default: 2)")
    show.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override any key of the file, e.g. --set data.num_nodes=8 (repeatable)")
    show.set_defaults(handler=_show)


def _show(args: argparse.Namespace) -> int:
    from testbed.assembly.experiment import experiment_config
    from testbed.reports.scene_picture import draw_scene, footprints, save_figure
    from testbed.topology.scene import scene_geometry

    config = experiment_config(args.file, args.overrides)
    n = config.data.num_nodes
    if args.radio_map is not None and args.radio_map >= n:
        raise UserError(f"--radio-map {args.radio_map}: the run has nodes 0 to {n - 1}")
    if args.out.suffix.lower() != ".png":
        raise UserError(f"-o {args.out}: the picture is a PNG; name it *.png")
    geometry = scene_geometry(config)
    edges, about = _edges(config)
    radio_map = None if args.radio_map is None else _radio_map(geometry, args.radio_map, args.cell)
    fig = draw_scene(footprints(geometry.site.scene.objects), geometry.positions_m, edges, geometry.links.gain,
                     radio_map, title=f"{geometry.spec.scene}: {config.run.algorithm}, {n} nodes, {about}",
                     server_m=geometry.server_position_m)
    try:
        save_figure(fig, args.out)
    except OSError as exc:
        raise UserError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    print(f"wrote {args.out}")
    return 0


def _edges(config) -> tuple[np.ndarray, str]:
    """The links of the run's graph in round 1 ((E, 2) node pairs), and what they are."""
    from testbed.assembly import assemble

    view = assemble.graph_view(config)
    if view is None:
        return np.zeros((0, 2), dtype=np.int64), "no graph (not a decentralised algorithm)"
    edges = np.asarray(view.edges(0), dtype=np.int64).reshape(-1, 2)
    return edges, f"{len(edges)} links in round 1"


def _radio_map(geometry, node: int, cell_m: float):
    """Node ``node``'s coverage as the picture draws it (dB, NaN where no ray arrived), on the plane
    half an antenna height below it (channel.scene.radio_map says why not at its own height)."""
    from channel.scene.radio_map import coverage_map
    from testbed.reports.scene_picture import RadioMapImage

    transmitter = geometry.positions_m[node]
    plane_z_m = float(transmitter[2]) - geometry.spec.antenna_height_m / 2
    try:
        coverage = coverage_map(geometry.spec, transmitter, plane_z_m, cell_m, RADIO_MAP_SAMPLES)
    except ValueError as exc:  # a cell size giving too many cells, Sionna RT unavailable: one line
        raise UserError(f"--radio-map: {exc}") from None
    with np.errstate(divide="ignore"):
        db = np.where(coverage.path_gain > 0, 10.0 * np.log10(coverage.path_gain), np.nan)
    return RadioMapImage(db, coverage.extent_m, node, plane_z_m)
