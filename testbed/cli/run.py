"""`testbed run FILE`: run an experiment and print its summary table."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import threading
from pathlib import Path

from testbed.checked.arguments import Number
from testbed.checked.limits import MAX_SEED
from testbed.cli.watch import add_server_options, check_server_options
from testbed.errors import UserError
from testbed.util.extras import check_installed


def register(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run an experiment file")
    run.add_argument("file", type=Path, nargs="?", help="the experiment file (not with --resume)")
    run.add_argument("--mode", choices=["sim", "mqtt"], help="where the nodes run (default: run.mode of the file)")
    run.add_argument("--resume", type=Path, metavar="RUN_DIR",
                     help="continue a killed run from its last completed round (its own config.toml)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override any key, e.g. --set budget.epsilon=2 or --set stragglers.model=bernoulli (read as "
                          "TOML; text that is not TOML is a string; repeatable)")
    run.add_argument("--seed", type=Number(int, ge=0, le=MAX_SEED), help="the run's seed (run.seed)")
    run.add_argument("--out", type=Path, help="the run directory (default: output.dir/NAME-TIME-sSEED)")
    run.add_argument("--quiet", action="store_true", help="no progress bar, no summary table")
    run.add_argument("--watch", action="store_true", help="serve the live web page of the run (testbed watch)")
    add_server_options(run)
    run.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from testbed.assembly.experiment import experiment_config
    from testbed.checked import inputs
    from testbed.orchestration.runner import run_experiment
    from testbed.reports.results import checked_config

    if args.watch:
        check_server_options(args)
        check_installed("watch", "run --watch")
    if args.resume is not None:
        if args.file is not None or args.out is not None or args.seed is not None or args.overrides:
            raise UserError("--resume takes the run's own config.toml: give no FILE, --out, --seed or --set")
        config = experiment_config(checked_config(args.resume), mode=args.mode)
        out = args.resume
    else:
        if args.file is None:
            raise UserError("give an experiment FILE, or --resume RUN_DIR")
        config = experiment_config(args.file, args.overrides, mode=args.mode, seed=args.seed)
        if args.out is not None:
            inputs.output_dir(args.out, "--out")
        else:
            inputs.output_dir(Path(config.output.dir), "output.dir")
        out = args.out
        if args.watch and out is None:  # the page must know the directory before the run names it
            from testbed.orchestration.runner import default_run_dir

            out = default_run_dir(config)
    page = WatchPage(out, args.host, args.port) if args.watch else None
    try:
        result = run_experiment(config, out_dir=out, quiet=args.quiet, resume=args.resume is not None)
        if not args.quiet:
            print(format_summary(result.summary))
        if page is not None:
            page.linger()
    finally:
        if page is not None:
            page.stop()
    return 0


class WatchPage:
    """`testbed watch RUN_DIR` in a child process, started with the run (``testbed run --watch``).

    It reads only the run's files, so the run never waits for it. It is up before the run starts: a
    port that is taken or an address that is not this machine's stops the command before round 1,
    in the child's own one line.
    """

    def __init__(self, run_dir: Path, host: str, port: int):
        self.url = f"http://{host}:{port}/"
        self._proc = subprocess.Popen([sys.executable, "-m", "testbed", "watch", str(run_dir), "--port", str(port),
                                       "--host", host], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      errors="replace")
        self._early: list[str] | None = []  # its stderr before it listens: said only if it comes up
        self._lock = threading.Lock()
        stderr = threading.Thread(target=self._pass_on_stderr, daemon=True)
        stderr.start()
        # The child says "watching RUN at URL" once it listens; no line means it left without.
        if not self._proc.stdout.readline():
            self._proc.wait()
            stderr.join(timeout=5)
            last = next((line.strip() for line in reversed(self._early or []) if line.strip()), "")
            raise UserError(f"--watch: {last.removeprefix('testbed: ') or 'the page did not start'}")
        threading.Thread(target=self._proc.stdout.read, daemon=True).start()  # never blocks the child
        with self._lock:
            sys.stderr.writelines(self._early or [])
            self._early = None
        print(f"watch: {self.url}", file=sys.stderr, flush=True)

    def _pass_on_stderr(self) -> None:
        for line in self._proc.stderr:
            with self._lock:
                if self._early is not None:
                    self._early.append(line)
                else:
                    sys.stderr.write(line)

    def linger(self) -> None:
        """On a terminal, keep the page of the finished run up until Ctrl-C."""
        if self._proc.poll() is None and sys.stdin.isatty() and sys.stdout.isatty():
            print(f"the run is over; its page stays up at {self.url} until Ctrl-C", file=sys.stderr, flush=True)
            try:
                self._proc.wait()
            except KeyboardInterrupt:
                pass

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def _node_shares(link: dict) -> str:
    """The range of a link's nodes' wire seconds (their ledger's wire rows, measured), or nothing
    when none answered."""
    shares = list((link.get("nodes_wire_s") or {}).values())
    return f"; per node {min(shares):.3g}-{max(shares):.3g} s measured (ledger.csv wire rows)" if shares else ""


def format_summary(summary: dict) -> str:
    """A short table of a run's outcome for the terminal: the figure to quote (the tight ε when it
    ran, the paper's beside it; ε-MI-DP in nats; or "not private"), whether each cost was measured
    or modelled, and at its end where the run's files are and the commands that show them."""
    from testbed.reports import headline
    from testbed.reports.startup import time_text

    nodes = summary["nodes"].values()
    cost = [n["cost_units"] for n in nodes]
    stopped = summary.get("stopped")
    run_dir = summary["run_dir"]
    lines = [
        f"run          {run_dir}",
        f"status       {summary['status']}" + (
            f" ({stopped['budget']} budget of node {stopped['node']}: "
            f"{stopped['would_be']:.6g} > {stopped['limit']:.6g})" if stopped else ""),
        f"algorithm    {summary['algorithm']} ({summary['mode']}, seed {summary['seed']}, "
        f"{summary['rounds']} rounds, {len(cost)} nodes"
        + (f" and {summary['idle_nodes']} never sampled)" if summary.get("idle_nodes") else ")"),
        f"model        {headline.score_text(summary)}",
        f"privacy      {headline.privacy_text(summary)}",
        *(f"against      {line}" for line in headline.guarantee_lines(summary)),
        f"cost units   {max(cost):.6g} per node (the cost model, eq. 8)" + (
            f" of {summary['budgets']['cost_units']:g}" if summary["budgets"]["cost_units"] else ""),
        f"energy       {max(n['energy_j'] for n in nodes):.4g} J, compute {max(n['compute_s'] for n in nodes):.4g} s "
        f"per node (most spent; {headline.cost_source(summary)})",
    ]
    lines.append(f"time         {time_text(summary)}")
    broker = summary.get("broker")
    if broker:
        lines.append(f"broker       {broker['kind']} at {broker['url']}")
    authentication = summary.get("authentication")
    if authentication:
        lines.append("messages     " + (f"authenticated ({authentication['mac']}, {authentication['keys']} keys; "
                                         f"{authentication['forged_dropped']} forged frame(s) dropped)"
                                         if authentication["enabled"] else authentication["statement"]))
    for link in summary.get("links") or ():  # measured on the wire, beside the rate and the modelled airtime
        rate = f"{link['rate_bps']:g} bit/s ({link['rate_s']:.3g} s at that rate)" if link["rate_bps"] else "unshaped"
        lines.append(f"link         {link['host_address']}: {link['wire_s']:.3g} s over {link['rounds_timed']} rounds, "
                     f"{link['bytes_down'] + link['bytes_up']} bytes on the wire, {rate}; modelled airtime "
                     f"{link['airtime_s']:.3g} s" + _node_shares(link))
    straggled = summary.get("stragglers", {}).get("rounds_straggled", 0)
    if straggled:
        lines.append(f"stragglers   {straggled} node-rounds missed ({summary['stragglers']['model']} model, "
                     "plus deadlines and crashes)")
    refusals = headline.refusals(summary)
    if refusals:
        lines.append(f"refusals     {len(refusals)} node(s) refused a round for their own budget, asked nothing more: "
                     + headline.refusals_text(refusals))
    observers = {o for n in nodes for o in n.get("epsilon_by_observer", {})}
    if len(observers) > 1:
        lines.append("epsilon by   " + ", ".join(
            f"{o} {max(n['epsilon_by_observer'].get(o, 0.0) for n in nodes):.4g}" for o in sorted(observers)))
    for assumption in summary.get("assumptions") or ():  # what its ε rests on (docs/privacy.md)
        lines.append(f"assumes      {assumption}")
    if summary.get("failure"):
        lines.append(f"failure      {summary['failure']}")
    target = summary.get("privacy", {}).get("epsilon_target")
    settings = summary.get("algorithm_settings", {})
    eps = [n["epsilon"] for n in nodes if n.get("epsilon") is not None]
    if "epsilon_round_max" in settings:  # a per-round target (DWFL eq. 11), not one over the run
        lines.append(f"eps/round    {settings['epsilon_round_max']:.4g} at the worst receiver"
                     + (f" (target {target:g})" if target is not None else ""))
    elif target is not None and eps and max(eps) > target * (1 + 1e-9):
        lines.append(f"WARNING      calibration {settings.get('calibration')} targets "
                     f"epsilon {target:g} but spends {max(eps):.4g}")
    lines += [
        f"figures      {Path(run_dir) / 'figures'}",
        f"ledger       {Path(run_dir) / 'ledger.csv'}",
        f"report       {Path(run_dir) / 'report.html'}: testbed report {shlex.quote(run_dir)} --html",
        f"watch        testbed watch {shlex.quote(run_dir)}",
    ]
    return "\n".join(lines)
