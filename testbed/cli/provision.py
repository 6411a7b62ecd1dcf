"""`testbed provision`: per-board bundles, the broker's ACL and passwords, from an inventory of boards."""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("provision", help="write per-board bundles (node file, own password, CA, data, systemd "
                                         "unit) and the broker's ACL and passwords from an inventory")
    p.add_argument("inventory", type=Path, help="the inventory of boards (TOML; see docs/boards.md)")
    p.add_argument("--out", type=Path, required=True, help="an empty or missing folder for the bundles")
    p.add_argument("--run", help="the run id (mqtt.run_id); overrides the inventory's run_id")
    p.set_defaults(handler=_provision)


def _provision(args: argparse.Namespace) -> int:
    import dataclasses

    from nodes.board_config import CHECKS
    from testbed.orchestration.provision import BOARD_DIR, UNIT_NAME, broker_access, load_inventory, provision

    inventory = load_inventory(args.inventory)
    if args.run is not None:
        try:
            inventory = dataclasses.replace(inventory, run_id=CHECKS["run"](args.run))
        except ValueError as exc:
            raise ConfigError("--run", str(exc)) from None
    bundles = provision(inventory, args.out)
    out = args.out
    print(f"wrote {len(bundles)} board bundles for run {inventory.run_id} under {out / 'boards'}, the broker's "
          f"files under {out / 'broker'} and the coordinator's credentials in {out / 'coordinator' / 'credentials.json'}")
    broker = broker_access()
    print(f"broker: copy {out / 'broker'}/* to {broker.installed_dir}/ and include "
          f"{broker.installed_dir}/{broker.config_name}")
    print("experiment file of the run:")
    print(f'  [mqtt]\n  broker_url = "{inventory.broker}"\n  run_id = "{inventory.run_id}"\n  emulated = false\n'
          f'  credentials = "{(out / "coordinator" / "credentials.json").resolve()}"'
          + (f'\n  tls_ca = "{inventory.ca}"' if inventory.ca is not None else ""))
    host, folder = next(iter(bundles.items()))
    print(f"each board, e.g. {host}:  scp -rp {folder} {host}:  then on it  sudo cp -r {folder.name}/. {BOARD_DIR}/ "
          f"&& sudo cp {BOARD_DIR}/{UNIT_NAME} /etc/systemd/system/ && sudo systemctl enable --now {UNIT_NAME}")
    return 0
