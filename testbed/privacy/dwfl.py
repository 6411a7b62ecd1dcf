"""Privacy of DWFL (Chen et al., "Decentralized Wireless Federated Learning with Differential
Privacy", arXiv 2109.09142): the paper's per-round, per-receiver ε and a tight T-round accountant.

Setting (dwfl.md §4): in round t receiver i observes
v_i = c·Σ_{k≠i} x_k + Σ_{k≠i} |h_k| sqrt(β_k P_k) G_k + m_i, with G_k ~ N(0, σ² I) and
m_i ~ N(0, σ_m² I). The query c·Σ_{k≠i} x_k has L2 sensitivity Δ = 2 c γ g_max when one worker's data
set is replaced (gradients clipped to g_max, step γ), and the Gaussian noise has per-entry variance

- eq. (10): σ_s,i² = Σ_{k≠i} |h_k|² β_k P_k σ² + σ_m².

On a graph (``RoundSetting.graph``, a :class:`testbed.topology.Graph`) receiver i hears only its
neighbours N(i): the sums of eqs. (10)–(11) run over k ∈ N(i) (a receiver with few neighbours hears
less artificial noise), σ² is calibrated at the worst receiver, and a sender j is exposed to each of
its receivers i ∈ N(j) (:func:`min_over_neighbours`). A receiver with no neighbour hears no model
(ε_i = 0); every sum is one ``np.bincount`` over the 2E links, no loop over nodes.

A round's quantities besides σ² (channel amplitudes, powers, β, channel noise, γ, g_max, δ, c) travel
together as one :class:`RoundSetting`; σ² is what the calibrations solve for.

Functions (all vectorised over receivers; arrays have the node axis first, shape (N,)):

- :func:`epsilon_per_receiver`: eq. (11) / Theorem IV.1, ε_i = Δ sqrt(2 ln(1.25/δ)) / σ_s,i
  (the classic Gaussian-mechanism bound of Lemma IV.1, stated by the paper for ε < 1);
- :func:`calibrate_sigma2`: the σ² meeting a target ε at the worst receiver (dwfl.md §4.4), with the
  option of not counting channel noise;
- :func:`orthogonal_epsilon`: Remark IV.1, orthogonal transmission j → i (paper numerator α_j = 1,
  or the consistent one with α_j);
- :func:`calibrate_sigma2_orthogonal`: the σ² meeting a target ε on every orthogonal link (the
  inverse of :func:`orthogonal_epsilon`, worst sender);
- :func:`central_epsilon`, :func:`calibrate_sigma2_central`: eq. (11) at a parameter server that
  hears all N senders (the centralised baseline of Seif et al., dwfl.md §6.3);
- :func:`remark_iv1_bound`: the O(1/sqrt(N−1)) bound of Remark IV.1, as printed (erratum: it can
  fail when channel noise dominates) or corrected (σ_m²/(N−1));
- :func:`sigma_z2`: σ_z² of Lemma IV.6;
- :func:`composed_epsilon`, :func:`composed_epsilons`, :func:`dwfl_composed_epsilon`: composition
  over T rounds by the ledger's accountants (testbed.privacy.accountants: e.g. dp-accounting's RDP
  or PLD), each round a Gaussian mechanism of noise multiplier σ_s,i / Δ.

Caveats (dwfl.md §4.3, not in the paper): the per-round analysis treats x_j^(t−1/2) as fixed and
only the current gradient as data-dependent (sensitivity 2cγ g_max); the composition inherits that
assumption. A worker's G_j is heard by all N−1 receivers (collusion is not covered). With imperfect
CSI, set the effective gains as ``h_abs`` and the largest received model amplitude as ``c``; with
truncation or ``c_scale < 1`` (``channel.align_power``) set ``c=alignment.c``, since the default c is
eq. (4) over all nodes.

All noise powers are in W (or any consistent unit: only ratios to c² matter).

Example (the worked example of dwfl.md §4.5)::

    >>> import numpy as np
    >>> h = np.array([1.0] + [2.0] * 9); beta = 1 - 1 / h**2
    >>> setting = RoundSetting(h, 1.0, beta, noise_power_w=1.0, gamma=0.1, g_max=1.0, delta=1e-5)
    >>> epsilon_per_receiver(setting, sigma2=1.0)[:2].round(6).tolist()
    [0.183116, 0.193792]
    >>> round(calibrate_sigma2(0.5, setting), 6)
    0.114814
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

__all__ = [
    "gaussian_factor",
    "alignment_constant",
    "sensitivity",
    "artificial_noise_powers",
    "receiver_noise_variance",
    "neighbourhood_sums",
    "min_over_neighbours",
    "RoundSetting",
    "epsilon_per_receiver",
    "epsilon_per_sender",
    "sigma_z2",
    "calibrate_sigma2",
    "orthogonal_epsilon",
    "remark_iv1_bound",
    "noise_multipliers",
    "round_dp_event",
    "composed_epsilon",
    "composed_epsilons",
    "dwfl_composed_epsilon",
    "calibrate_sigma2_orthogonal",
    "central_epsilon",
    "calibrate_sigma2_central",
]


def gaussian_factor(delta: float) -> float:
    """sqrt(2 ln(1.25/δ)), the constant of Lemma IV.1 (Dwork & Roth, Thm. A.1).

    Example::

        >>> round(gaussian_factor(1e-5), 6)
        4.844805
    """
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return math.sqrt(2.0 * math.log(1.25 / delta))


def _vec(x: Any, n: int | None = None, name: str = "value") -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if n is None:
        return np.atleast_1d(arr)
    if arr.ndim == 0:
        return np.full(n, float(arr))
    if arr.shape != (n,):
        raise ValueError(f"{name} must be a scalar or have shape ({n},), got {arr.shape}")
    return arr


def alignment_constant(h_abs: Any, power_w: Any) -> float:
    """c = min_j |h_j| sqrt(P_j), eq. (4), sqrt(W).

    Args:
        h_abs: (N,) channel amplitudes |h_k| (>= 0).
        power_w: scalar or (N,) maximum powers P_k, W.

    Example::

        >>> alignment_constant([1.0, 2.0], [4.0, 0.25])
        1.0
    """
    h = _vec(h_abs)
    p = _vec(power_w, h.shape[0], "power_w")
    return float(np.sqrt(np.min(h**2 * p)))


def sensitivity(gamma: float, g_max: float, c: float = 1.0) -> float:
    """L2 sensitivity of c·Σ_{k≠i} x_k to replacing one data set: 2 c γ g_max (Thm IV.1 proof).

    Args:
        gamma: learning rate γ.
        g_max: gradient clipping norm.
        c: alignment constant (1 for the normalised signal v_i / c).

    Example::

        >>> round(sensitivity(0.1, 1.0, c=2.0), 12)
        0.4
    """
    return 2.0 * float(c) * float(gamma) * float(g_max)


def artificial_noise_powers(h_abs: Any, power_w: Any, beta: Any) -> np.ndarray:
    """(N,) B_k = |h_k|² β_k P_k: received power of sender k's unit-variance artificial noise, W.

    Example::

        >>> artificial_noise_powers([1.0, 2.0], 1.0, [0.0, 0.75]).tolist()
        [0.0, 3.0]
    """
    h = _vec(h_abs)
    n = h.shape[0]
    return h**2 * _vec(beta, n, "beta") * _vec(power_w, n, "power_w")


def neighbourhood_sums(values: np.ndarray, graph: Any = None) -> np.ndarray:
    """(N,) Σ_{k∈N(i)} values[k] for every receiver i: over all k ≠ i (``graph`` None, the complete
    graph: total minus own, O(N)) or over i's neighbours in ``graph`` (one bincount, O(E)).

    Example::

        >>> from testbed.topology import Graph
        >>> neighbourhood_sums(np.array([1.0, 2.0, 4.0])).tolist()
        [6.0, 5.0, 3.0]
        >>> neighbourhood_sums(np.array([1.0, 2.0, 4.0]), Graph.from_edges(3, [(0, 1)])).tolist()
        [2.0, 1.0, 0.0]
    """
    if graph is None:
        return values.sum() - values
    return np.bincount(graph.rows, weights=values[graph.indices], minlength=graph.num_nodes)


def min_over_neighbours(values: np.ndarray, graph: Any) -> np.ndarray:
    """(N,) min_{i∈N(j)} values[i] for every node j (inf for a node with no neighbour): what the
    worst of a sender's receivers sees. One ``np.minimum.reduceat`` over the 2E links.

    Example::

        >>> from testbed.topology import Graph
        >>> min_over_neighbours(np.array([3.0, 1.0, 2.0, 5.0]), Graph.from_edges(4, [(0, 1), (1, 2)])).tolist()
        [1.0, 2.0, 1.0, inf]
    """
    out = np.full(graph.num_nodes, np.inf)
    has = graph.degrees > 0
    if graph.indices.size:
        out[has] = np.minimum.reduceat(np.asarray(values, dtype=np.float64)[graph.indices], graph.indptr[:-1][has])
    return out


def receiver_noise_variance(
    h_abs: Any, power_w: Any, beta: Any, sigma2: float, noise_power_w: Any, graph: Any = None
) -> np.ndarray:
    """(N,) σ_s,i² = Σ_{k≠i} |h_k|² β_k P_k σ² + σ_m², eq. (10), W. O(N); on ``graph`` the sum runs
    over k ∈ N(i), O(E).

    Args:
        h_abs: (N,) |h_k|.
        power_w: scalar or (N,) P_k, W.
        beta: scalar or (N,) β_k.
        sigma2: σ², per-entry variance of the artificial noise G_k.
        noise_power_w: scalar or (N,) σ_m², per-entry channel-noise variance at receiver i, W.
        graph: who hears whom (a testbed.topology.Graph); None: everyone hears everyone.

    Example::

        >>> receiver_noise_variance([1.0, 2.0, 2.0], 1.0, [0.0, 0.75, 0.75], 1.0, 1.0).tolist()
        [7.0, 4.0, 4.0]
    """
    b = artificial_noise_powers(h_abs, power_w, beta) * float(sigma2)
    n = b.shape[0]
    return neighbourhood_sums(b, graph) + _vec(noise_power_w, n, "noise_power_w")


@dataclass(frozen=True, eq=False)
class RoundSetting:
    """What one DWFL round's privacy depends on besides σ², the artificial-noise variance it
    calibrates: the channel, the powers, the channel noise and the query (dwfl.md §4).

    Scalars or arrays with the node axis first, shape (N,); the functions below take one setting,
    each reading the fields its equation has.

    Attributes:
        h_abs: (N,) channel amplitudes |h_k| (dimensionless; the effective gains with imperfect CSI).
        power_w: scalar or (N,) maximum transmit powers P_k, W.
        beta: scalar or (N,) β_k, the fraction of P_k a sender spends on artificial noise.
        noise_power_w: scalar or (N,) σ_m², the per-entry channel-noise variance at a receiver, W.
        gamma: learning rate γ.
        g_max: gradient clipping norm (L2).
        delta: δ of the (ε, δ) guarantee.
        c: received model amplitude, sqrt(W); None: eq. (4), min_j |h_j| sqrt(P_j) (over all nodes:
            the alignment is global, one amplitude per sender toward all its receivers).
        graph: who hears whom (a :class:`testbed.topology.Graph`); None: the complete graph.

    Example::

        >>> s = RoundSetting([1.0, 2.0], 1.0, [0.0, 0.75], noise_power_w=1.0, gamma=0.1, g_max=1.0, delta=1e-5)
        >>> s.alignment_c(), round(s.sensitivity(), 12)
        (1.0, 0.2)
    """

    h_abs: Any
    power_w: Any
    beta: Any
    noise_power_w: Any
    gamma: float
    g_max: float
    delta: float
    c: float | None = None
    graph: Any = None

    def alignment_c(self) -> float:
        """c: the given one, else eq. (4) over all nodes."""
        return alignment_constant(self.h_abs, self.power_w) if self.c is None else float(self.c)

    def sensitivity(self) -> float:
        """Δ = 2 c γ g_max (Theorem IV.1 proof)."""
        return sensitivity(self.gamma, self.g_max, self.alignment_c())

    def noise_variance(self, sigma2: float) -> np.ndarray:
        """(N,) σ_s,i² of eq. (10) at σ² (over each receiver's neighbours on a graph)."""
        return receiver_noise_variance(self.h_abs, self.power_w, self.beta, sigma2, self.noise_power_w, self.graph)

    def listens(self) -> np.ndarray:
        """(N,) bool: the receivers that hear some sender (all of them on the complete graph)."""
        n = _vec(self.h_abs).shape[0]
        return np.ones(n, dtype=bool) if self.graph is None else self.graph.degrees > 0


def epsilon_per_receiver(setting: RoundSetting, sigma2: float) -> np.ndarray:
    """(N,) per-round ε_i of Theorem IV.1, eq. (11).

    ε_i = 2 γ g_max sqrt(min_j |h_j|² P_j) / sqrt(Σ_{k≠i} |h_k|² β_k P_k σ² + σ_m²) · sqrt(2 ln(1.25/δ)).

    Args:
        setting: the round (c defaults to eq. (4)).
        sigma2: σ², artificial-noise variance per entry.

    Returns:
        (N,) ε_i for each receiver i (inf where σ_s,i = 0; 0 for a receiver with no neighbour on a
        graph: it hears no model).

    Example::

        >>> epsilon_per_receiver(RoundSetting([1.0, 2.0], 1.0, [0.0, 0.75], 1.0, 0.1, 1.0, 1e-5), 0.0).round(6).tolist()
        [0.968961, 0.968961]
    """
    var = setting.noise_variance(sigma2)
    with np.errstate(divide="ignore"):
        eps = setting.sensitivity() * gaussian_factor(setting.delta) / np.sqrt(var)
    return eps if setting.graph is None else np.where(setting.listens(), eps, 0.0)


def epsilon_per_sender(setting: RoundSetting, sigma2: float) -> np.ndarray:
    """(N,) what sender j spends per round: the largest ε_i of eq. (11) over its receivers i (all
    i ≠ j; on a graph i ∈ N(j), 0 for a sender no one hears), the ledger's charge.

    Example::

        >>> s = RoundSetting([1.0, 2.0, 2.0], 1.0, [0.0, 0.75, 0.75], 1.0, 0.1, 1.0, 1e-5)
        >>> epsilon_per_sender(s, 1.0).round(6).tolist()
        [0.484481, 0.484481, 0.484481]
    """
    eps = epsilon_per_receiver(setting, sigma2)
    if setting.graph is None:
        order = np.argsort(-eps, kind="stable")
        out = np.full(eps.shape, eps[order[0]])
        out[order[0]] = eps[order[1]]
        return out
    worst = -min_over_neighbours(-eps, setting.graph)
    return np.where(np.isfinite(worst), worst, 0.0)


def sigma_z2(setting: RoundSetting, sigma2: float) -> float:
    """σ_z² = max_k (|h_k|² β_k P_k σ²/c² + σ_m²/(c²(N−1)²)), Lemma IV.6 (σ_m² a scalar; γ, g_max,
    δ unused).

    The largest per-entry variance of a column Φ_k^(t,i) of the effective noise (dwfl.md §2.4).

    Example::

        >>> h = [1.0] + [2.0] * 9
        >>> round(sigma_z2(RoundSetting(h, 1.0, [0.0] + [0.75] * 9, 1.0, 0.1, 1.0, 1e-5), 1.0), 6)
        3.012346
    """
    h = _vec(setting.h_abs)
    n = h.shape[0]
    if n < 2:
        raise ValueError("sigma_z2 needs N >= 2")
    cc = setting.alignment_c()
    b = artificial_noise_powers(h, setting.power_w, setting.beta) * float(sigma2)
    return float(np.max(b / cc**2 + float(setting.noise_power_w) / (cc**2 * (n - 1) ** 2)))


def calibrate_sigma2(epsilon: float, setting: RoundSetting, count_channel_noise: bool = True) -> float:
    """Smallest σ² giving every receiver ε_i <= ε in eq. (11) (dwfl.md §4.4, [DERIVED]).

    σ² = max_i max(0, (Δ² · 2 ln(1.25/δ) / ε² − σ_m²) / S_i), Δ = 2 c γ g_max,
    S_i = Σ_{k≠i} |h_k|² β_k P_k (on a graph Σ_{k∈N(i)}, over the receivers with a neighbour).

    Args:
        epsilon: target per-round ε.
        setting: the round, as :func:`epsilon_per_receiver`.
        count_channel_noise: ``False`` ignores σ_m² (option (i) of dwfl.md §4.4: channel noise is
            an extra on top of the target, which reproduces the paper's "more power is better").

    Returns:
        σ² (>= 0); ``inf`` if some receiver gets no artificial noise (S_i = 0) but needs some.

    Example::

        >>> round(calibrate_sigma2(0.5, RoundSetting([1.0, 2.0, 2.0], 1.0, [0.0, 0.75, 0.75], 1.0, 0.1, 1.0,
        ...                                          1e-5)), 6)
        0.918514
    """
    if epsilon <= 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    b = artificial_noise_powers(setting.h_abs, setting.power_w, setting.beta)
    n = b.shape[0]
    s = neighbourhood_sums(b, setting.graph)
    needed = (setting.sensitivity() * gaussian_factor(setting.delta) / epsilon) ** 2
    m = _vec(setting.noise_power_w, n, "noise_power_w") if count_channel_noise else np.zeros(n)
    gap = np.maximum(needed - m, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_rx = np.where(gap == 0.0, 0.0, gap / s)
    if setting.graph is not None:
        per_rx = np.where(setting.listens(), per_rx, 0.0)  # a receiver with no neighbour hears no one
    return float(np.max(per_rx))


def orthogonal_epsilon(setting: RoundSetting, sigma2: float, numerator: str = "paper", alpha: Any = None) -> np.ndarray:
    """(N,) ε_{j→i} of orthogonal transmission from sender j (Remark IV.1); independent of i and N.

    ε_{j→i} = 2 γ g_max sqrt(A_j) / sqrt(|h_j|² β_j P_j σ² + σ_m²) · sqrt(2 ln(1.25/δ)), with
    (σ_m² a scalar; c unused: each link is heard alone)

    - ``numerator="paper"``: A_j = |h_j|² P_j (as printed: α_j = 1 although β_j > 0, dwfl.md §4.4
      [AMBIG], an upper bound);
    - ``numerator="consistent"``: A_j = α_j |h_j|² P_j, the power actually spent on the model
      (``alpha`` required; with DWFL alignment A_j = c²).

    Example::

        >>> orthogonal_epsilon(RoundSetting([1.0, 2.0], 1.0, [0.0, 0.75], 1.0, 0.1, 1.0, 1e-5), 1.0).round(6).tolist()
        [0.968961, 0.968961]
    """
    h = _vec(setting.h_abs)
    n = h.shape[0]
    p = _vec(setting.power_w, n, "power_w")
    if numerator == "paper":
        a = h**2 * p
    elif numerator == "consistent":
        if alpha is None:
            raise ValueError('numerator="consistent" needs alpha')
        a = _vec(alpha, n, "alpha") * h**2 * p
    else:
        raise ValueError(f'numerator must be "paper" or "consistent", got {numerator!r}')
    var = artificial_noise_powers(h, p, setting.beta) * float(sigma2) + float(setting.noise_power_w)
    with np.errstate(divide="ignore"):
        return 2.0 * setting.gamma * setting.g_max * np.sqrt(a) / np.sqrt(var) * gaussian_factor(setting.delta)


def remark_iv1_bound(setting: RoundSetting, sigma2: float, erratum: str = "corrected") -> np.ndarray:
    """(N,) the O(1/sqrt(N−1)) upper bound on ε_i of Remark IV.1 (σ_m² a scalar).

    ε_i <= (1/sqrt(N−1)) · 2 γ g_max c / sqrt(min_{k≠i} |h_k|² β_k P_k σ² + M) · sqrt(2 ln(1.25/δ)),

    - ``erratum="paper"``: M = σ_m², as printed; it is *not* an upper bound when channel noise
      dominates (dwfl.md §4.4 [AMBIG], §7 item 7);
    - ``erratum="corrected"``: M = σ_m²/(N−1), which always bounds eq. (11).

    Example::

        >>> s = RoundSetting([1.0, 2.0, 2.0], 1.0, [0.0, 0.75, 0.75], 1.0, 0.1, 1.0, 1e-5)
        >>> b = remark_iv1_bound(s, 0.0, erratum="paper")
        >>> bool(np.all(b < epsilon_per_receiver(s, 0.0)))        # the printed bound fails without artificial noise
        True
    """
    h = _vec(setting.h_abs)
    n = h.shape[0]
    if n < 2:
        raise ValueError("remark_iv1_bound needs N >= 2")
    b = artificial_noise_powers(h, setting.power_w, setting.beta) * float(sigma2)
    # min over k != i: the smallest entry, or the second smallest for the receiver holding it.
    order = np.argsort(b, kind="stable")
    min_other = np.full(n, b[order[0]])
    min_other[order[0]] = b[order[1]]
    if erratum == "paper":
        m = float(setting.noise_power_w)
    elif erratum == "corrected":
        m = float(setting.noise_power_w) / (n - 1)
    else:
        raise ValueError(f'erratum must be "paper" or "corrected", got {erratum!r}')
    with np.errstate(divide="ignore"):
        return setting.sensitivity() * gaussian_factor(setting.delta) / (
            math.sqrt(n - 1) * np.sqrt(min_other + m)
        )


def noise_multipliers(setting: RoundSetting, sigma2: float) -> np.ndarray:
    """(N,) per-round noise multiplier of receiver i: σ_s,i / Δ, with Δ = 2 c γ g_max (δ unused).

    The Gaussian mechanism seen by receiver i, normalised to sensitivity 1 (the convention of
    ``dp_accounting.GaussianDpEvent``).

    Example::

        >>> noise_multipliers(RoundSetting([1.0, 2.0], 1.0, [0.0, 0.75], 1.0, 0.1, 1.0, 1e-5), 0.0).round(6).tolist()
        [5.0, 5.0]
    """
    return np.sqrt(setting.noise_variance(sigma2)) / setting.sensitivity()


def round_dp_event(noise_multiplier: float):
    """The ``dp_accounting.GaussianDpEvent`` of one round at one receiver (for the ledger).

    Example::

        >>> round_dp_event(2.0).noise_multiplier
        2.0
    """
    import dp_accounting

    return dp_accounting.GaussianDpEvent(float(noise_multiplier))


def _round_signature(noise_multiplier: float) -> tuple:
    # One round at a receiver, as the ledger's accountants read it: a Gaussian of multiplier z at
    # sensitivity 1 for replacing a worker's data set (Theorem IV.1), no sampling.
    return (float(noise_multiplier), 1.0, "replace_one", "none", 1.0)


def composed_epsilon(
    noise_multiplier: float | Sequence[float],
    delta: float,
    rounds: int | None = None,
    accountant: str = "rdp",
) -> float:
    """ε at δ after composing Gaussian rounds with a registered accountant
    (:mod:`testbed.privacy.accountants`).

    Args:
        noise_multiplier: one multiplier z (σ/Δ) for ``rounds`` identical rounds (one event
            composed T times), or a sequence with one z per round (e.g. fading redrawn every round).
        delta: δ.
        rounds: T, with a scalar ``noise_multiplier``.
        accountant: its name, e.g. ``"rdp"`` (dp-accounting's ``RdpAccountant``, an upper bound)
            or ``"pld"`` (``PLDAccountant``, tight up to discretisation).

    Returns:
        ε (inf if some z = 0).

    Example::

        >>> round(composed_epsilon(5.0, 1e-5, rounds=1, accountant="pld"), 2)
        0.73
    """
    from testbed.privacy.accountants.registry import get

    if np.ndim(noise_multiplier) == 0:
        if rounds is None or rounds < 0:
            raise ValueError("a scalar noise_multiplier needs rounds >= 0")
        items = [(_round_signature(noise_multiplier), int(rounds))] if rounds else []
    else:
        zs = [float(z) for z in noise_multiplier]
        if rounds is not None and rounds != len(zs):
            raise ValueError(f"rounds={rounds} but {len(zs)} noise multipliers were given")
        items = [(_round_signature(z), 1) for z in zs]
    return get(accountant).epsilon(items, delta)


def composed_epsilons(noise_multipliers_per_round: Sequence[float], delta: float) -> dict[str, float | None]:
    """ε at δ of the rounds (one noise multiplier z each) by every tight accountant, by name; None
    where z falls below what it can compute (a PLD's grid explodes below z = 0.1).

    Example::

        >>> {k: round(v, 2) for k, v in composed_epsilons([5.0] * 3, 1e-5).items()}
        {'rdp': 1.45, 'pld': 1.33}
    """
    from testbed.privacy.accountants.registry import get, tight_names

    z = [float(v) for v in noise_multipliers_per_round]
    # One event composed T times when every round is the same mechanism (time-invariant channel):
    # a PLD of T separate events costs T convolutions.
    same = all(v == z[0] for v in z)
    return {name: None if min(z) < get(name).min_noise_multiplier else composed_epsilon(
        z[0] if same else z, delta, rounds=len(z) if same else None, accountant=name) for name in tight_names()}


def dwfl_composed_epsilon(setting: RoundSetting, sigma2: float, rounds: int, accountant: str = "rdp") -> float:
    """ε at δ of the worst receiver after T identical DWFL rounds (time-invariant channel).

    Every round is a Gaussian mechanism of multiplier σ_s,i/Δ at receiver i (same per-round
    assumption as Theorem IV.1); the worst receiver has the smallest multiplier.

    Example::

        >>> s = RoundSetting([1.0] + [2.0] * 9, 1.0, [0.0] + [0.75] * 9, 1.0, 0.1, 1.0, 1e-5)
        >>> e1 = dwfl_composed_epsilon(s, 1.0, rounds=1, accountant="pld")
        >>> bool(e1 < 0.193792)        # tighter than the classic bound of eq. (11)
        True
    """
    z = noise_multipliers(setting, sigma2)
    return composed_epsilon(float(np.min(z)), setting.delta, rounds=rounds, accountant=accountant)


def calibrate_sigma2_orthogonal(epsilon: float, setting: RoundSetting) -> float:
    """Smallest σ² giving every link ε_{j→i} <= ε in :func:`orthogonal_epsilon` (paper numerator).

    σ² = max_j max(0, (2 γ g_max)² |h_j|² P_j · 2 ln(1.25/δ) / ε² − σ_m²) / (|h_j|² β_j P_j):
    the same rule as :func:`calibrate_sigma2`, per link, at the worst sender.

    Args:
        epsilon: target per-round ε of every link.
        setting: the round, as :func:`orthogonal_epsilon`.

    Returns:
        σ² (>= 0); ``inf`` if a sender with β_j = 0 needs artificial noise.

    Example::

        >>> s = RoundSetting([1.0, 2.0], 1.0, 1.0, 1.0, 0.1, 1.0, 1e-5)
        >>> s2 = calibrate_sigma2_orthogonal(0.5, s)
        >>> round(s2, 6), orthogonal_epsilon(s, s2).round(6).tolist()
        (3.505542, [0.456492, 0.5])
    """
    if epsilon <= 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    h = _vec(setting.h_abs)
    p = _vec(setting.power_w, h.shape[0], "power_w")
    needed = (sensitivity(setting.gamma, setting.g_max, 1.0) * gaussian_factor(setting.delta) / epsilon) ** 2 * h**2 * p
    gap = np.maximum(needed - float(setting.noise_power_w), 0.0)
    b = artificial_noise_powers(h, p, setting.beta)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.max(np.where(gap == 0.0, 0.0, gap / b)))


def central_epsilon(setting: RoundSetting, sigma2: float) -> float:
    """Per-round ε at a parameter server hearing all N aligned senders (eq. 11 with Σ over all k).

    ε = 2 c γ g_max sqrt(2 ln(1.25/δ)) / sqrt(Σ_k |h_k|² β_k P_k σ² + σ_m²): the analysis of
    Theorem IV.1 applied to y = c Σ_k u_k + noise, where every sender's u_k moves by at most γ g_max
    (the centralised over-the-air baseline of Seif et al., dwfl.md §6.3).

    Example::

        >>> s = RoundSetting([1.0] + [2.0] * 9, 1.0, [0.0] + [0.75] * 9, 1.0, 0.1, 1.0, 1e-5)
        >>> round(central_epsilon(s, 1.0), 6)
        0.183116
    """
    var = (float(artificial_noise_powers(setting.h_abs, setting.power_w, setting.beta).sum()) * float(sigma2)
           + float(setting.noise_power_w))
    return math.inf if var <= 0 else setting.sensitivity() * gaussian_factor(setting.delta) / math.sqrt(var)


def calibrate_sigma2_central(epsilon: float, setting: RoundSetting) -> float:
    """Smallest σ² giving :func:`central_epsilon` <= ε: max(0, Δ² 2 ln(1.25/δ)/ε² − σ_m²) / Σ_k B_k.

    Example::

        >>> s = RoundSetting([1.0] + [2.0] * 9, 1.0, [0.0] + [0.75] * 9, 1.0, 0.1, 1.0, 1e-5)
        >>> round(central_epsilon(s, calibrate_sigma2_central(0.5, s)), 12)
        0.5
    """
    if epsilon <= 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    needed = (setting.sensitivity() * gaussian_factor(setting.delta) / epsilon) ** 2
    gap = max(needed - float(setting.noise_power_w), 0.0)
    if gap == 0.0:
        return 0.0
    total = float(artificial_noise_powers(setting.h_abs, setting.power_w, setting.beta).sum())
    return math.inf if total <= 0 else gap / total
