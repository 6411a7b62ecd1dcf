"""`testbed audit`'s run: an experiment in sim with white-box canary gradients in every node's
Gaussian releases (testbed.privacy.canaries), its canaries scored, and the one-run lower bound on ε
(testbed.privacy.audit; Steinke, Nasr and Jagielski 2023) set beside the ε the run's ledger claims
against the same observer.

One run: m canaries spread evenly over the nodes (each node at most its releases' size), the run
itself otherwise unchanged (the canaries' draws are the nodes' AUDIT streams, so every other draw is
the same as a plain run's; its released values are not, they carry the canaries).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from testbed.assemble import privacy_guarantee
from testbed.config import Config
from testbed.errors import UserError
from testbed.orchestration.runner import run_experiment
from testbed.privacy.audit import AuditResult, audit
from testbed.privacy.canaries import AuditUnsupported, Canaries, active


@dataclass(frozen=True)
class AuditReport:
    """What `testbed audit` prints.

    Attributes:
        result: the lower bound and its counts (testbed.privacy.audit.AuditResult).
        observer: whom the audited releases protect against.
        claimed: the ledger's ε against ``observer`` at the run's δ, the worst over the nodes that
            carried canaries, per accountant ("zcdp": the paper's; the tight one when the run has it).
        nodes: nodes that carried canaries; per_node: canaries on each.
        compositions: Gaussian compositions each node's canaries rode (the most over the nodes).
        run_dir: the audited run.
    """

    result: AuditResult
    observer: str
    claimed: dict[str, float]
    nodes: int
    per_node: int
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
        return [
            f"claimed epsilon against the {self.observer}: {claims} at delta {r.delta:g} (ledger, worst node)",
            f"empirical lower bound: epsilon >= {r.epsilon:.4g} at {r.confidence:.0%} confidence "
            f"(Steinke, Nasr and Jagielski 2023, Theorem 3.1; one run)",
            f"canaries: {r.canaries} ({self.per_node} on each of {self.nodes} nodes, {self.compositions} "
            f"compositions each); guesses: {r.guesses} ({r.guessed_in} in, {r.guessed_out} out; "
            f"best of {len(r.guess_counts_tried)} counts, Bonferroni); correct: {r.correct}",
            f"verdict: {self.verdict}",
        ]


def audit_run(config: Config, out_dir: Path, *, canaries: int, confidence: float) -> AuditReport:
    """Run ``config`` in sim into ``out_dir`` with ``canaries`` canary gradients and audit it.

    Raises:
        UserError: one line: an algorithm whose guarantee is not (ε, δ)-DP, or a run that is not
            private, fewer canaries than nodes, releases too small for the canaries, no release.
    """
    guarantee = privacy_guarantee(config)
    if guarantee == "mi_dp":
        raise UserError(f"audit: {config.run.algorithm}'s guarantee is mutual-information DP (in nats), not "
                        "(epsilon, delta)-DP: the one-run audit of epsilon does not apply")
    if guarantee != "dp":
        raise UserError(f"audit: this {config.run.algorithm} run adds no privacy noise (guarantee {guarantee!r}): "
                        "nothing to audit")
    num_nodes = config.data.num_nodes
    if canaries < num_nodes:
        raise UserError(f"audit: --canaries {canaries} is fewer than the run's {num_nodes} nodes (one per node at least)")
    per_node = math.ceil(canaries / num_nodes)
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
    scores, members = planted.scores(carried), planted.members(carried)
    result = audit(scores, members, delta=config.privacy.delta, confidence=confidence)
    nodes = summary["nodes"]
    claimed = {summary["privacy"]["accountant"]: max(nodes[str(n)]["epsilon_by_observer"].get(observer, 0.0)
                                                    for n in carried)}
    if all("epsilon_tight_by_observer" in nodes[str(n)] for n in carried):
        claimed[summary["privacy"]["tight_accountant"]] = max(
            nodes[str(n)]["epsilon_tight_by_observer"].get(observer, 0.0) for n in carried)
    return AuditReport(result, observer, claimed, len(carried), per_node,
                       max(planted.compositions[n] for n in carried), out_dir)
