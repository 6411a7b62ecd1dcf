"""`testbed acl`: per-node credentials and a broker's ACL for one run scope.

Writes into DIR the broker's files in its own format (``--broker``, a managed broker that enforces
ACLs: testbed.mqtt.brokers; Mosquitto's are ``acl``, its acl_file, and ``passwords``, its
password_file, hashed) and ``credentials.json`` (the plaintext passwords, mode 0600: give each
board its own entry, and the coordinator the file through ``mqtt.credentials``), and prints the
broker's configuration lines that use them (Mosquitto's with ``use_username_as_clientid`` on the
listener), and ``keys.json``, each node's message key (testbed.mqtt.auth, mode 0600: give each host
its own nodes' entries, ``testbed nodes --keys``, and the coordinator the file, ``mqtt.keys``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.checked.arguments import COUNT, first_repeat
from testbed.errors import UserError
from testbed.util import jsontext

#: Bytes `testbed acl` holds per node before writing (its ACL lines, password, hash, JSON entry).
NODE_BYTES = 4096


def register(sub: argparse._SubParsersAction) -> None:
    from testbed.mqtt.brokers import registry as brokers

    kinds = brokers.with_access()
    acl = sub.add_parser("acl", help="generate per-node credentials and a broker's ACL (Mosquitto's)")
    acl.add_argument("--run", default="testbed", help="the run scope (mqtt.run_id)")
    acl.add_argument("--broker", choices=kinds, default=min(kinds, key=lambda k: brokers.get(k).preference),
                     help="the broker whose files to write (default %(default)s)")
    group = acl.add_mutually_exclusive_group(required=True)
    group.add_argument("--nodes", type=COUNT, help="nodes 0..N-1")
    group.add_argument("--ids", help="these node ids (comma separated, none twice)")
    acl.add_argument("--out", type=Path, required=True, help="directory for acl, passwords, credentials.json")
    acl.set_defaults(handler=_acl)


def _acl(args: argparse.Namespace) -> int:
    from testbed.assembly.resources import check_count
    from testbed.checked import inputs
    from testbed.mqtt import wire
    from testbed.mqtt import auth
    from testbed.mqtt.acl import generate_access, write_private
    from testbed.mqtt.brokers import registry as brokers

    if args.ids is None:
        check_count(args.nodes, NODE_BYTES, "--nodes")  # before a node's id or password is made
        ids = [str(n) for n in range(args.nodes)]
    else:
        ids = [x.strip() for x in args.ids.split(",")]
        twice = first_repeat(ids)
        if twice is not None:  # one credential per node: a repeat would silently collapse into one
            raise UserError(f"--ids names {twice} twice")
    try:
        wire.check_id(args.run, "--run")
        for node in ids:
            wire.check_id(node, "node id")
    except wire.WireError as exc:
        raise UserError(exc.reason) from None
    fmt = brokers.get(args.broker).access
    assert fmt is not None  # --broker's choices
    try:
        access = generate_access(args.run, ids)
    except ValueError as exc:  # a node id that is a reserved user name (coordinator, channel)
        raise UserError(f"--ids: {exc}") from None
    inputs.output_dir(args.out, "--out")
    creds = args.out / "credentials.json"
    try:
        fmt.write(args.out, access)
        # Created 0600 before the secrets go in: no moment where other users could read them.
        write_private(creds, jsontext.dumps(dict(access.passwords), indent=2) + "\n")
        auth.write_keys(args.out / "keys.json", auth.Keys(args.run, {node: auth.new_key() for node in ids}))
    except OSError as exc:
        raise UserError(f"--out {args.out}: cannot write {exc.filename or 'there'} ({exc.strerror or exc})") from None
    written = [str(args.out / name) for name in fmt.files]
    print(f"wrote {', '.join(written)}, {creds} and {args.out / 'keys.json'} (message keys) for {len(ids)} nodes "
          f"of run {args.run}")
    conf = fmt.config(str(args.out.resolve()), 1883, len(ids), False)
    print(f"{fmt.config_name} (client ids bound to usernames: no credential can take over another's session):")
    print("".join(f"  {line}\n" for line in conf.splitlines()), end="")
    return 0
