"""`testbed provision`: per-board bundles, the broker's ACL, passwords and conf (and with --tls its
certificate and the lab's CA), from an inventory of boards."""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.errors import ConfigError

EXAMPLES = """examples:
  testbed provision lab.toml --out lab/ --tls          # a CA, the broker's certificate, bundles, mosquitto.conf
  mosquitto -c lab/broker/mosquitto.conf               # the broker, as written (as the user who ran provision)
  testbed provision lab.toml --out lab/ --tls --broker-dir /etc/mosquitto/testbed   # files copied there
  testbed provision lab.toml --out lab/ --tls --broker localhost --experiment experiments/quickstart.toml
                                                       # a lab on one PC, and the coordinator's experiment file
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("provision", help="write per-board bundles (node file, own password, CA, data, systemd "
                                         "unit), the broker's ACL, passwords and mosquitto.conf from an inventory",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inventory", type=Path, help="the inventory of boards (TOML; see docs/boards.md)")
    p.add_argument("--out", type=Path, required=True, help="an empty or missing folder for the bundles")
    p.add_argument("--run", help="the run id (mqtt.run_id); overrides the inventory's run_id")
    p.add_argument("--tls", action="store_true",
                   help="make the lab's CA and the broker's certificate and key for the (mqtts://) broker URL's host "
                        "(the CA's key is not kept)")
    p.add_argument("--broker", metavar="ADDRESS",
                   help="where the boards reach the broker: a host name or IP address (e.g. localhost, 192.168.1.10; "
                        "the inventory's scheme and port kept) or a whole mqtt(s):// URL; overrides the inventory's "
                        "broker (and names the --tls certificate)")
    p.add_argument("--experiment", type=Path, metavar="FILE",
                   help="also write OUT/coordinator/experiment.toml: FILE run over MQTT on these boards (the lab's "
                        "[mqtt]: broker, run id, credentials, CA), for testbed run")
    p.add_argument("--broker-dir", metavar="DIR",
                   help="where the broker's files will be on the broker's host (absolute), for the paths in "
                        "mosquitto.conf (default: OUT/broker, where they are written)")
    p.add_argument("--allow-absolute-paths", action="store_true",
                   help="take an inventory's data or ca given as an absolute path outside the inventory's folder "
                        "(default: refused; relative paths never leave it)")
    p.set_defaults(handler=_provision)


def _provision(args: argparse.Namespace) -> int:
    import dataclasses

    from nodes.board_config import CHECKS
    from testbed.orchestration.lab import broker_at, write_experiment
    from testbed.orchestration.provision import BOARD_DIR, UNIT_NAME, broker_access, load_inventory, provision

    inventory = load_inventory(args.inventory, allow_absolute=args.allow_absolute_paths)
    if args.run is not None:
        try:
            inventory = dataclasses.replace(inventory, run_id=CHECKS["run"](args.run))
        except ValueError as exc:
            raise ConfigError("--run", str(exc)) from None
    if args.broker is not None:
        inventory = broker_at(inventory, args.broker)
    if args.experiment is not None:  # refused before anything is written, as a bad inventory is
        from testbed.assembly.experiment import experiment_config

        experiment_config(args.experiment)
    bundles = provision(inventory, args.out, tls=args.tls, broker_dir=args.broker_dir)
    out = args.out
    broker = broker_access()
    conf = out / "broker" / broker.config_name
    print(f"wrote {len(bundles)} board bundles for run {inventory.run_id} under {out / 'boards'}, the broker's "
          f"files under {out / 'broker'} and the coordinator's credentials and message keys in {out / 'coordinator'}")
    if inventory.broker.startswith("mqtts://") and not args.tls and inventory.ca is None:
        print("broker: TLS needs its ca.pem, cert.pem and key.pem beside the conf (or provision with --tls)")
    if args.broker_dir is None:
        print(f"broker: mosquitto -c {conf.resolve()}   (as the user who owns these files; on another host, "
              f"provision with --broker-dir, e.g. {broker.installed_dir})")
    else:
        print(f"broker: copy {out / 'broker'}/* to {args.broker_dir}/ on the broker's host, owned by the user "
              f"mosquitto runs as, then: mosquitto -c {args.broker_dir}/{broker.config_name}")
    ca = (out / "coordinator" / "ca.pem").resolve() if args.tls else inventory.ca
    if args.experiment is not None:
        path = write_experiment(args.experiment, inventory, out, ca)
        print(f"coordinator: testbed run {path}   ({args.experiment} over MQTT on these boards)")
    else:
        print("experiment file of the run (or provision with --experiment FILE to have it written):")
        print(f'  [mqtt]\n  broker_url = "{inventory.broker}"\n  run_id = "{inventory.run_id}"\n  emulated = false\n'
              f'  credentials = "{(out / "coordinator" / "credentials.json").resolve()}"\n'
              f'  keys = "{(out / "coordinator" / "keys.json").resolve()}"'
              + (f'\n  tls_ca = "{ca}"' if ca is not None else ""))
    host, folder = next(iter(bundles.items()))
    print(f"each board, e.g. {host}:  scp -rp {folder} {host}:  then on it  sudo cp -r {folder.name}/. {BOARD_DIR}/ "
          f"&& sudo cp {BOARD_DIR}/{UNIT_NAME} /etc/systemd/system/ && sudo systemctl enable --now {UNIT_NAME}")
    print(f"or on this machine:  testbed node --config {folder / 'node.toml'} --meter model --state-dir "
          f"~/.cache/testbed/{host}   (no meter here; the node file's state_dir is the board's)")
    return 0
