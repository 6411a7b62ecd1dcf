"""`testbed node` (what runs on a board) and `testbed nodes` (many emulated boards in one process)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from nodes.meters import registry as meters
from testbed.checked.arguments import CHUNK_BYTES, COUNT, NODE_ID, PID, Number, NumberList
from testbed.checked.limits import MAX_INT, MAX_TEXT_FILE_BYTES
from testbed.errors import UserError
from testbed.util.userfiles import read_text

if TYPE_CHECKING:
    from testbed.streams.node_secret import NodeSecret


def register(sub: argparse._SubParsersAction) -> None:
    # Options default to None here so that a node file (--config) fills what the command line did
    # not give; nodes.board_config.DEFAULTS holds the defaults of both.
    node = sub.add_parser("node", help="serve one node of a run over MQTT (what runs on a board)")
    node.add_argument("--config", type=Path, metavar="NODE_TOML",
                      help="this board's node file (e.g. /etc/testbed/node.toml of `testbed provision`); "
                           "options given here take precedence")
    node.add_argument("--node-id", type=NODE_ID, help="this board's node id")
    node.add_argument("--data", help="this board's data file (overrides the experiment's data.path)")
    node.add_argument("--meter", choices=meters.kinds(),
                      help="how joules are measured (model: from the device profile; default auto)")
    node.add_argument("--state-dir", help="where the node keeps its ledger and its secret across restarts "
                                          "(default ~/.cache/testbed/node)")
    node.add_argument("--reproducible", action="store_true", default=None,
                      help="draw this board's noise and mini-batches from the run's seed instead of its own secret "
                           "(node-secret.key in the state directory, made on first start): bit-identical to sim, "
                           "but its epsilon then holds against nobody who holds the seed (the coordinator)")
    # Internal (the fault tests' and the coordinator's), accepted but left out of --help:
    # --crash-at-round R exits abruptly (no reply, no disconnect) when round R arrives;
    # --crash-after-reply exits just after the round's first reply instead (e.g. a transmit signal);
    # --crash-after-log exits after the step logged its release, before the reply is sent.
    node.add_argument("--crash-at-round", type=Number(int, ge=0), metavar="R", help=argparse.SUPPRESS)
    node.add_argument("--crash-after-reply", action="store_true", help=argparse.SUPPRESS)
    node.add_argument("--crash-after-log", action="store_true", help=argparse.SUPPRESS)
    node.add_argument("--quiet", action="store_true",
                      help="no state lines (connecting, connected, waiting for a run, joined run R, round k done, "
                           "run ended, reconnecting), which go to standard output by default")
    _common(node)
    node.set_defaults(handler=_node)

    nodes = sub.add_parser("nodes", help="serve many emulated nodes from one process, each its own MQTT client")
    which = nodes.add_mutually_exclusive_group(required=True)
    which.add_argument("--count", type=COUNT, help="serve nodes FIRST_ID .. FIRST_ID+COUNT-1")
    which.add_argument("--ids", type=NumberList(int, ge=0, unique=True), help="serve these node ids")
    nodes.add_argument("--first-id", type=NODE_ID, default=0, help="the first node id of --count (default 0)")
    nodes.add_argument("--data", help="the data file of these nodes (overrides data.path)")
    # Internal: the coordinator that starts the host passes its session (serve it only) and its pid
    # (leave at once when it is gone).
    nodes.add_argument("--session", help=argparse.SUPPRESS)
    nodes.add_argument("--broadcast", choices=["auto", "shared", "per-node"], default="auto",
                       help="how the host reads the broadcast: once for all its nodes (shared: an MQTT shared "
                            "subscription), once per node, or auto: shared when the broker says it serves "
                            "shared subscriptions (MQTT 5)")
    nodes.add_argument("--coordinator-pid", type=PID, metavar="PID", help=argparse.SUPPRESS)
    nodes.add_argument("--quiet", action="store_true",
                       help="no state lines (connecting, connected, waiting for a run, joined run R, round k done, "
                            "run ended, reconnecting), which go to standard output by default; a host its "
                            "coordinator started is always quiet (the coordinator reports)")
    _common(nodes)
    nodes.set_defaults(handler=_nodes, meter="model", state_dir=None, crash_at_round=None, crash_after_reply=False,
                       crash_after_log=False, config=None, node_id=None,
                       reproducible=True)  # emulated boards: their draws come from the run seed (no secret)
    node.set_defaults(session=None, coordinator_pid=None, broadcast="per-node")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--broker", help="broker URL, mqtt://host:port (mqtts:// for TLS)")
    p.add_argument("--run", help="the run scope to serve (the experiment's mqtt.run_id; default testbed)")
    p.add_argument("--profile", help="device profile: seconds and joules of the board (default host)")
    p.add_argument("--pacing", action="store_true", default=None, help="take the wall time the profiled board would")
    p.add_argument("--credentials", help="the credentials JSON of `testbed acl` or `testbed provision`")
    p.add_argument("--keys", help="the message keys JSON of `testbed provision` (this board's MAC key; a host the "
                                  "run starts is given its own)")
    p.add_argument("--no-auth", action="store_true", default=None,
                   help="send and take messages unauthenticated, for a coordinator with mqtt.authenticate = false")
    p.add_argument("--tls-ca", help="CA file for mqtts://")
    p.add_argument("--protocol", choices=["auto", "5", "3.1.1"], help="MQTT version (default auto)")
    p.add_argument("--max-chunk-bytes", type=CHUNK_BYTES,
                   help="MQTT payloads longer than this travel in chunks (default 262144)")
    p.add_argument("--verbose", action="store_true", default=None)


def _node(args: argparse.Namespace) -> int:
    return _serve(args, None)


def _nodes(args: argparse.Namespace) -> int:
    from testbed.assembly.resources import check_host

    if args.ids is not None:
        check_host(len(args.ids), "--ids of")
        return _serve(args, args.ids)
    if args.first_id + args.count - 1 > MAX_INT:
        raise UserError(f"--first-id {args.first_id} + --count {args.count}: node ids go up to {MAX_INT} only")
    check_host(args.count, "--count")  # before a node (or the list of ids) is made
    return _serve(args, list(range(args.first_id, args.first_id + args.count)))


def _settings(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` completed from the node file (``--config``) and the defaults; the command line wins."""
    from nodes import board_config

    file_values = board_config.load_board_config(args.config) if args.config is not None else {}
    given = {key: getattr(args, key, None) for key in board_config.DEFAULTS}
    merged = board_config.resolve(given, file_values)
    for key in ("broker", "node_id") if args.command == "node" else ("broker",):
        if merged[key] is None:
            raise UserError(f"{args.command}: give --{key.replace('_', '-')} or {key} in a --config node file")
    if merged["data"] is not None and not Path(merged["data"]).exists():  # else every round fails on it
        raise UserError(f"{args.command}: data {merged['data']}: no such file or folder")
    # Emulated boards (`testbed nodes`) keep their ledgers in memory.
    state_dir = _usable_state_dir(Path(merged["state_dir"])) if args.command == "node" else None
    return argparse.Namespace(**{**vars(args), **merged, "state_dir": state_dir})


def _usable_state_dir(path: Path) -> Path:
    """``path``, made if missing, once this user may write there; else one line saying how to adapt
    (a provisioned node file names the board's /var/lib/testbed, which a PC's user cannot write)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise UserError(f"node: state_dir {path}: cannot write there ({exc.strerror or exc}); on a machine other "
                        "than the provisioned board give --state-dir DIR (e.g. ~/.cache/testbed/node), or set "
                        "state_dir in the node file") from None
    return path


def _serve(args: argparse.Namespace, ids: list[int] | None) -> int:
    from nodes.costs import NodeCosts
    from nodes.host import serve

    args = _settings(args)
    ids = [args.node_id] if ids is None else ids
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    costs = NodeCosts(args.profile, args.meter, pacing=args.pacing)
    credentials = _load_credentials(Path(args.credentials)) if args.credentials else None
    keys = node_keys(args.keys, bool(args.no_auth), args.run, ids)
    secret = board_secret(args.state_dir, args.reproducible)
    serve(args.broker, args.run, ids, data_path=args.data, state_dir=args.state_dir, costs=costs,
          protocol_version=args.protocol, max_chunk_bytes=args.max_chunk_bytes, credentials=credentials, keys=keys,
          tls_ca=args.tls_ca, crash_at_round=args.crash_at_round,
          crash_after_reply=args.crash_after_reply, crash_after_log=args.crash_after_log, session=args.session,
          coordinator_pid=args.coordinator_pid, broadcast=args.broadcast, states=_state_lines(args, ids), secret=secret)
    if args.coordinator_pid is not None:
        # A host its coordinator started, which waits for it to leave before its run ends: with
        # everything written, it leaves without the interpreter's teardown (freeing numpy's and
        # pydantic's modules took 80 ms).
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def node_keys(path: str | None, no_auth: bool, run: str, ids: list[int]):
    """The message keys of nodes ``ids`` (testbed.mqtt.auth.Keys): from ``path`` (--keys, the node
    file's keys), else from the file the run that started this host names in its environment; None
    with --no-auth (or a run with mqtt.authenticate = false that started this host). One line if
    there are none, or one of ``ids`` has none."""
    from testbed.mqtt import auth

    if no_auth or os.environ.get(auth.NO_AUTH_ENV) == "1":
        return None
    path = path or os.environ.get(auth.KEYS_ENV)
    if not path:
        raise UserError("no message keys: give --keys FILE (the keys.json of `testbed provision`), or --no-auth for "
                        "a coordinator with mqtt.authenticate = false")
    keys = auth.load_keys(path, run, "--keys")
    missing = [str(n) for n in ids if not keys.holds(str(n))]
    if missing:
        raise UserError(f"--keys {path}: no key for node(s) {', '.join(missing[:5])}")
    return keys.only(str(n) for n in ids)


def _state_lines(args: argparse.Namespace, ids: list[int]) -> "StateLines | None":
    """The state lines of `testbed node` ("node 3: ...") or of a `testbed nodes` host a person
    started ("host of nodes 0..9 (10): ..."); none with --quiet or for a host its coordinator
    started (its coordinator reports)."""
    from nodes.state_lines import StateLines

    if args.quiet or args.coordinator_pid is not None:
        return None
    if args.command == "node":
        return StateLines(f"node {ids[0]}")
    runs = ids == list(range(ids[0], ids[0] + len(ids)))
    named = f"{ids[0]}..{ids[-1]}" if runs and len(ids) > 1 else ", ".join(map(str, ids[:5])) + (", ..." if len(ids) > 5 else "")
    return StateLines(f"host of {'node' if len(ids) == 1 else 'nodes'} {named} ({len(ids)})")


def board_secret(state_dir: Path | None, reproducible: bool) -> "NodeSecret | None":
    """A real board's secret (testbed.streams.node_secret.load_or_make: made in ``state_dir`` on first
    start, never by provisioning), or None: ``--reproducible``, or emulated boards (no state
    directory), whose draws come from the run's seed."""
    from testbed.streams.node_secret import load_or_make

    if reproducible or state_dir is None:
        return None
    return load_or_make(state_dir)


def _load_credentials(path: Path) -> dict[str, str]:
    try:
        data = json.loads(read_text(path, MAX_TEXT_FILE_BYTES, "file"))
    except (UserError, ValueError) as exc:
        raise UserError(f"cannot read credentials {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a credentials file of `testbed acl`")
    return {str(k): str(v) for k, v in data.items()}
