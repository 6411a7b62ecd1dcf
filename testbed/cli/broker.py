"""`testbed broker`: an embedded MQTT broker in the foreground, until Ctrl-C.

It listens on loopback unless told otherwise: ``--host 0.0.0.0`` (or a LAN address) serves boards
on a network, but the embedded broker has no credentials or ACL, so anyone who can reach it can
read and write every topic; a deployment with per-node credentials uses Mosquitto (`testbed acl`).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from testbed.checked.arguments import PID, Number


def register(sub: argparse._SubParsersAction) -> None:
    broker = sub.add_parser("broker", help="run an embedded MQTT broker (amqtt), on loopback by default")
    broker.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; 0.0.0.0 serves boards on a LAN, "
                             "with no authentication)")
    broker.add_argument("--port", type=Number(int, ge=0, le=65535), default=1883,
                        help="the port to listen on (0: any free one)")
    # Internal: leave when this process is gone (a run's coordinator starts its broker so).
    broker.add_argument("--parent-pid", type=PID, metavar="PID", help=argparse.SUPPRESS)
    broker.set_defaults(handler=_broker)


def _broker(args: argparse.Namespace) -> int:
    from testbed.mqtt.broker import is_loopback
    from testbed.mqtt.embedded_broker import EmbeddedBroker

    remote = not is_loopback(args.host)
    # Ctrl-C and a service manager's SIGTERM stop it cleanly, even when started by a parent that
    # ignores SIGINT (the child inherits that, and Python then installs no handler of its own).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with EmbeddedBroker(host=args.host, port=args.port, allow_remote=remote) as broker:
        if remote:
            print(f"testbed: warning: the embedded broker on {args.host} takes anonymous clients; anyone who "
                  "reaches it can read and write every topic", file=sys.stderr)
        print(f"broker listening on {broker.url} (Ctrl-C stops it)", flush=True)
        try:
            # Its parent's death re-parents it: polled, as the emulated hosts do (nodes.host).
            while broker.running and (args.parent_pid is None or os.getppid() == args.parent_pid):
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
    return 0
