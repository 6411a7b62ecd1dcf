"""`testbed broker`: an embedded MQTT broker on loopback, in the foreground, until Ctrl-C."""

from __future__ import annotations

import argparse
import time


def register(sub: argparse._SubParsersAction) -> None:
    broker = sub.add_parser("broker", help="run an embedded MQTT broker (amqtt) on loopback")
    broker.add_argument("--port", type=int, default=1883)
    broker.set_defaults(handler=_broker)


def _broker(args: argparse.Namespace) -> int:
    from testbed.mqtt.broker import EmbeddedBroker

    with EmbeddedBroker(port=args.port) as broker:
        print(f"broker listening on {broker.url} (Ctrl-C stops it)", flush=True)
        try:
            while broker.running:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    return 0
