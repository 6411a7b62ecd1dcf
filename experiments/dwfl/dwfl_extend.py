"""Adding seeds to committed DWFL data files (``reproduce.py --extend``) so that an extended file is what a
full regeneration would give: the files are checked first (same settings, seeds 0..k−1, the cheapest
committed run reproduces exactly), then the added runs are merged in a full regeneration's order."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

#: Fields of a data file that say how its runs were made: an extension must match them exactly.
SETTINGS_FIELDS = ("scenario", "task", "epsilon_scale", "trains_on", "base", "rounds", "last_rounds", "curve_every")


def extend_check(out: Path, chosen: list[str], settings: dict, seeds: int, base: str, rerun: Callable[[tuple], dict],
                 repo: Path) -> dict[str, dict]:
    """The committed data files of ``chosen`` that ``--extend`` adds seeds to, after checking that an
    extension gives what a full regeneration would: each file was made with these settings and seeds
    0..k−1, k <= ``seeds`` (a file with all its seeds is left out: an extension cut short resumes); and the
    cheapest committed run of those extended, run again by ``rerun`` (afresh, in a scratch folder), gives exactly its
    committed numbers. Anything else is a one-line refusal (SystemExit), as is a call that adds no seed."""
    import tempfile

    records: dict[str, dict] = {}
    for scenario in chosen:
        path = out / f"{scenario}.json"
        if not path.is_file():
            raise SystemExit(f"--extend: no committed {path.relative_to(repo)} to extend; run it without --extend")
        record = json.loads(path.read_text())
        differs = [f for f in SETTINGS_FIELDS if record.get(f) != {"scenario": scenario, **settings}[f]]
        if differs:
            raise SystemExit(f"--extend: {path.relative_to(repo)} was made with other settings ({', '.join(differs)}); "
                             "regenerate it in full")
        k = len(record["seeds"])
        if record["seeds"] != list(range(k)) or k > seeds:
            raise SystemExit(f"--extend: {path.relative_to(repo)} has seeds {record['seeds'][0]}–{record['seeds'][-1]}, "
                             f"not the first of --seeds {seeds}")
        if k == seeds:
            print(f"--extend: {path.relative_to(repo)} has its {seeds} seeds already", flush=True)
            continue
        records[scenario] = record
    if not records:
        raise SystemExit(f"--extend: every chosen data file has its {seeds} seeds already; --seeds {seeds} adds none")
    cheapest = min((r for rec in records.values() for r in rec["runs"]), key=lambda r: r["wall_s"])
    with tempfile.TemporaryDirectory() as scratch:
        again = rerun((base, cheapest["overrides"], cheapest["seed"], settings["rounds"] or 0, scratch,
                         cheapest["key"]))
    changed = [f for f in cheapest if f != "wall_s" and again.get(f) != cheapest[f]]
    if changed:
        raise SystemExit(f"--extend: the committed run {' / '.join(cheapest['key'])} (seed {cheapest['seed']}) does not "
                         f"reproduce ({', '.join(changed)} differ): regenerate in full, not by extension")
    print(f"--extend: the committed run {' / '.join(cheapest['key'])} (seed {cheapest['seed']}) reproduces exactly",
          flush=True)
    return records


def merge_runs(record: dict, added: list[dict], items: list[tuple[str, str, list[str]]]) -> list[dict]:
    """The committed runs and the added ones in a full regeneration's order: curve by curve, seed by seed."""
    order = {(panel, curve): i for i, (panel, curve, _ov) in enumerate(items)}
    return sorted(record["runs"] + added, key=lambda r: (order[tuple(r["key"])], r["seed"]))
