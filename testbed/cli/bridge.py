"""`testbed bridge`: a microcontroller board behind a serial line, served as an MQTT node."""

from __future__ import annotations

import argparse
import contextlib
import logging
from pathlib import Path

from testbed.checked.arguments import CHUNK_BYTES, NODE_ID, Number
from testbed.devices import virtual_boards


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bridge", help="serve a microcontroller board on a serial line as an MQTT node")
    line = p.add_mutually_exclusive_group(required=True)
    line.add_argument("--serial", metavar="URL",
                      help="the board's line: a device path, socket://HOST:PORT, rfc2217://HOST:PORT, loop://")
    boards = "; ".join(f"{b.name}: {b.description}" for b in virtual_boards.registrations().values())
    line.add_argument("--virtual", choices=virtual_boards.names(), help=f"start a virtual board ({boards})")
    p.add_argument("--baud", type=Number(int, ge=50, le=20_000_000), default=115200,
                   help="the line's rate in bit/s (a device path only)")
    p.add_argument("--broker", required=True, help="broker URL, mqtt://host:port (mqtts:// for TLS)")
    p.add_argument("--run", default="testbed", help="the run scope (the experiment's mqtt.run_id)")
    p.add_argument("--node-id", type=NODE_ID, required=True, help="the board's node id")
    p.add_argument("--profile", help="the board's profile (firmware_bridge/boards.toml); default: its hello's")
    p.add_argument("--state-dir", type=Path, default=Path.home() / ".cache" / "testbed" / "bridge",
                   help="where the board's ledger and its secret are kept across restarts")
    p.add_argument("--reproducible", action="store_true",
                   help="draw the board's noise and mini-batches from the run's seed instead of the secret its bridge "
                        "host keeps for it (node-secret.key in the state directory): bit-identical to sim, but its "
                        "epsilon then holds against nobody who holds the seed; a --virtual board always is")
    p.add_argument("--credentials", type=Path, help="the credentials JSON of `testbed acl`")
    p.add_argument("--keys", help="the message keys JSON of `testbed provision` (the board's MAC key)")
    p.add_argument("--no-auth", action="store_true",
                   help="send and take messages unauthenticated, for a coordinator with mqtt.authenticate = false")
    p.add_argument("--tls-ca", help="CA file for mqtts://")
    p.add_argument("--protocol", default="auto", choices=["auto", "5", "3.1.1"], help="MQTT version")
    p.add_argument("--max-chunk-bytes", type=CHUNK_BYTES, default=256 * 1024,
                   help="MQTT payloads longer than this travel in chunks")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--quiet", action="store_true",
                   help="no state lines (connecting, connected, waiting for a run, joined run R, round k done, "
                        "run ended, reconnecting), which go to standard output by default")
    p.set_defaults(handler=_bridge)


def _bridge(args: argparse.Namespace) -> int:
    from firmware_bridge import virtual
    from firmware_bridge.agent import BridgeAgent
    from nodes.host import serve
    from nodes.state_lines import StateLines
    from testbed.cli.node import _load_credentials, board_secret, node_keys
    from testbed.devices.profiles import load_mcu_profile

    if args.profile is not None:
        load_mcu_profile(args.profile)  # an unknown name fails now, in one line
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    credentials = _load_credentials(args.credentials) if args.credentials else None
    keys = node_keys(args.keys, args.no_auth, args.run, [args.node_id])
    # A real board's secret, kept by its bridge host (the firmware takes a round's 64-bit key); a
    # virtual board is emulated: the run's seed.
    secret = board_secret(args.state_dir, args.reproducible or args.virtual is not None)
    with contextlib.ExitStack() as stack:
        url = args.serial
        if args.virtual is not None:
            url = stack.enter_context(virtual.start(args.virtual, f"virtual-{args.node_id}", args.profile or "rp2040")).url
        state_dir = args.state_dir

        def factory(node: int) -> BridgeAgent:
            return BridgeAgent(node, url, state_dir=state_dir, profile=args.profile, baudrate=args.baud,
                               secret=secret)

        serve(args.broker, args.run, [args.node_id], state_dir=state_dir, protocol_version=args.protocol,
              max_chunk_bytes=args.max_chunk_bytes, credentials=credentials, keys=keys, tls_ca=args.tls_ca,
              agent_factory=factory, states=None if args.quiet else StateLines(f"node {args.node_id}"))
    return 0
