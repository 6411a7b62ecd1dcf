"""`testbed audit`'s runs: an experiment in sim with white-box canary gradients in every node's
Gaussian releases (testbed.privacy.canaries), its canaries scored, and a lower bound on ε
(testbed.privacy.audit) set beside the ε the run's ledger claims against the same observer.

- One run (the default): m canaries spread evenly over the nodes (each node at most its releases'
  size), the bound of Steinke, Nasr and Jagielski 2023 (Theorem 3.1).
- ``runs`` > 1: the membership test of Jagielski, Ullman and Oprea 2020 over the canaries of that
  many runs (seeds seed, seed + 1, ...), each canary a trial guessed "in" when its score passes the
  midpoint the mechanism fixes; for a δ too large for one run (2mδ near 1).

The runs are otherwise unchanged: the canaries' draws are the nodes' AUDIT streams, so every other
draw is a plain run's (its released values are not: they carry the canaries).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from testbed.assembly.assemble import privacy_guarantee
from testbed.assembly.config import Config
from testbed.errors import UserError
from testbed.orchestration.runner import run_experiment
from testbed.privacy.audit import AuditResult, MembershipResult, audit, membership_lower_bound
from testbed.privacy.canaries import AuditUnsupported, Canaries, active


#: Theorem 3.1's δ term is 2mδ times a probability: from here on it swamps the one-run bound.
WEAK_DELTA_TERM = 0.5


@dataclass(frozen=True)
class AuditReport:
    """What `testbed audit` prints.

    Attributes:
        result: the lower bound and its counts (one run: AuditResult; several: MembershipResult).
        observer: whom the audited releases protect against.
        claimed: the ledger's ε against ``observer`` at the run's δ, the worst over the nodes that
            carried canaries (and over the runs), per accountant: the paper's, and the tight one
            when the run has it.
        nodes: nodes that carried canaries; per_node: canaries on each in each run; runs: runs.
        compositions: Gaussian compositions a node's canaries rode in a run (the most over the nodes).
        run_dir: the audited run (or the folder of the runs).
    """

    result: AuditResult | MembershipResult
    observer: str
    claimed: dict[str, float]
    nodes: int
    per_node: int
    runs: int
    compositions: int
    run_dir: Path

    @property
    def claimed_epsilon(self) -> float:
        """The smallest ε the run claims (its tightest accountant's): what the lower bound must not pass."""
        return min(self.claimed.values())

    @property
    def verdict(self) -> str:
        """"consistent" (ε̂ at most the claim) or "VIOLATED" (the releases refute the claimed ε at the confidence)."""
        return "consistent" if self.result.epsilon <= self.claimed_epsilon else "VIOLATED"

    def lines(self) -> list[str]:
        """The report, one figure a line."""
        r = self.result
        claims = ", ".join(f"{eps:.4g} ({name})" for name, eps in self.claimed.items())
        placed = (f"{self.per_node} on each of {self.nodes} nodes{f' in each of {self.runs} runs' if self.runs > 1 else ''}, "
                  f"{self.compositions} compositions each")
        if isinstance(r, AuditResult):
            method = "Steinke, Nasr and Jagielski 2023, Theorem 3.1; one run"
            counts = (f"canaries: {r.canaries} ({placed}); guesses: {r.guesses} ({r.guessed_in} in, {r.guessed_out} out; "
                      f"best of {len(r.guess_counts_tried)} counts, Bonferroni); correct: {r.correct}")
        else:
            method = f"Jagielski, Ullman and Oprea 2020, membership test over {self.runs} runs, Clopper-Pearson"
            counts = (f"canaries: {r.trials_in + r.trials_out} ({placed}); in: {r.trials_in}, flagged {r.flagged_in}; "
                      f"out: {r.trials_out}, flagged {r.flagged_out}")
        lines = [f"claimed epsilon against the {self.observer}: {claims} at delta {r.delta:g} (ledger, worst node)",
                 f"empirical lower bound: epsilon >= {r.epsilon:.4g} at {r.confidence:.0%} confidence ({method})",
                 counts,
                 f"verdict: {self.verdict}"]
        if isinstance(r, AuditResult) and 2 * r.canaries * r.delta >= WEAK_DELTA_TERM:
            lines.append(f"note: 2 m delta = {2 * r.canaries * r.delta:.3g}: one run refutes little at this delta; "
                         "fewer --canaries, or the membership test over --runs, which does not pay it")
        return lines


@dataclass(frozen=True)
class _Audited:
    """One run with canaries: its canaries, the nodes whose canaries were heard, whom they were heard by, its claims."""

    canaries: Canaries
    carried: list[int]
    observer: str
    claimed: dict[str, float]


def _check_auditable(config: Config) -> None:
    if config.nodes.mcu:
        raise UserError("audit: nodes.mcu: a microcontroller node's release is the firmware's arithmetic, which the "
                        "audit's canaries do not reach; audit the run without microcontroller nodes")
    guarantee = privacy_guarantee(config)
    if guarantee == "mi_dp":
        raise UserError(f"audit: {config.run.algorithm}'s guarantee is mutual-information DP (in nats), not "
                        "(epsilon, delta)-DP: the audit of epsilon does not apply")
    if guarantee != "dp":
        raise UserError(f"audit: this {config.run.algorithm} run adds no privacy noise (guarantee {guarantee!r}): "
                        "nothing to audit")


def _audited_run(config: Config, out_dir: Path, per_node: int) -> _Audited:
    """Run ``config`` in sim into ``out_dir`` with ``per_node`` canaries on every node."""
    num_nodes = config.data.num_nodes
    planted = Canaries(config.run.seed, range(num_nodes), per_node)
    sim = config.model_copy(update={"run": config.run.model_copy(update={"mode": "sim"})})
    try:
        with active(planted):
            summary = run_experiment(sim, out_dir, quiet=True).summary
    except AuditUnsupported as exc:
        raise UserError(f"audit: {exc}") from None
    if planted.dim is None:
        raise UserError(f"audit: no release of the run could carry {per_node} canaries per node (the largest had "
                        f"{planted.largest_skipped} coordinates): ask for at most {num_nodes * planted.largest_skipped}"
                        if planted.largest_skipped else "audit: the run made no Gaussian release to audit")
    carried = [n for n in planted.nodes if planted.compositions[n]]
    if len(planted.observers) != 1:
        raise UserError(f"audit: the audited releases protect against several observers ({sorted(planted.observers)})")
    observer = next(iter(planted.observers))
    nodes: dict[str, Any] = summary["nodes"]
    claimed = {summary["privacy"]["accountant"]: max(nodes[str(n)]["epsilon_by_observer"].get(observer, 0.0)
                                                    for n in carried)}
    if all("epsilon_tight_by_observer" in nodes[str(n)] for n in carried):
        claimed[summary["privacy"]["tight_accountant"]] = max(
            nodes[str(n)]["epsilon_tight_by_observer"].get(observer, 0.0) for n in carried)
    return _Audited(planted, carried, observer, claimed)


def audit_run(config: Config, out_dir: Path, *, canaries: int | None = None, confidence: float = 0.95,
              runs: int = 1) -> AuditReport:
    """Audit ``config`` in sim, its run(s) written under ``out_dir``.

    Args:
        canaries: canaries per run, spread evenly over the nodes (rounded up to a multiple of them);
            default 1000 for one run, one per node for several.
        confidence: the lower bound's level.
        runs: 1: the one-run bound; more: the membership test over that many runs (seeds
            run.seed, run.seed + 1, ...).

    Raises:
        UserError: one line: an algorithm whose guarantee is not (ε, δ)-DP, or a run that is not
            private, fewer canaries than nodes, releases too small for the canaries, a release the
            audit does not model.
    """
    _check_auditable(config)
    num_nodes = config.data.num_nodes
    wanted = canaries if canaries is not None else (1000 if runs == 1 else num_nodes)
    if wanted < num_nodes:
        raise UserError(f"audit: --canaries {wanted} is fewer than the run's {num_nodes} nodes (one per node at least)")
    per_node = math.ceil(wanted / num_nodes)
    delta = config.privacy.delta
    if runs == 1:
        one = _audited_run(config, out_dir, per_node)
        c = one.canaries
        result: AuditResult | MembershipResult = audit(c.scores(one.carried), c.members(one.carried), delta=delta,
                                                       confidence=confidence)
        return AuditReport(result, one.observer, one.claimed, len(one.carried), per_node, 1,
                           max(c.compositions[n] for n in one.carried), out_dir)
    counts = np.zeros(4, dtype=np.int64)  # trials in, flagged in, trials out, flagged out
    claimed: dict[str, float] = {}
    observers, heard, compositions = set(), 0, 0
    for t in range(runs):
        seed = config.run.seed + t
        each = _audited_run(config.model_copy(update={"run": config.run.model_copy(update={"seed": seed})}),
                            out_dir / f"s{seed}", per_node)
        c = each.canaries
        members = c.members(each.carried)
        flagged = c.scores(each.carried) > c.midpoints(each.carried)
        counts += [members.sum(), (flagged & members).sum(), (~members).sum(), (flagged & ~members).sum()]
        for name, eps in each.claimed.items():
            claimed[name] = max(claimed.get(name, 0.0), eps)
        observers.add(each.observer)
        heard = max(heard, len(each.carried))
        compositions = max(compositions, max(c.compositions[n] for n in each.carried))
    if len(observers) != 1:
        raise UserError(f"audit: the runs' releases protect against different observers ({sorted(observers)})")
    if counts[0] == 0 or counts[2] == 0:
        raise UserError(f"audit: every canary of the {runs} runs was {'out' if counts[0] == 0 else 'in'}: "
                        "ask for more canaries or runs")
    result = membership_lower_bound(trials_in=int(counts[0]), flagged_in=int(counts[1]), trials_out=int(counts[2]),
                                    flagged_out=int(counts[3]), delta=delta, confidence=confidence)
    return AuditReport(result, observers.pop(), claimed, heard, per_node, runs, compositions, out_dir)
