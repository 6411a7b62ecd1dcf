"""An experiment from what a user has at hand: a TOML file's path, the dict of its tables, or a
validated config, with overrides (a dict, or the command line's ``--set`` strings), checked once
into the config a run takes. The Python API (testbed.api) and `testbed run`/`testbed sweep` build
their experiments here, so a file, its overrides and a seed mean the same in both.

Example::

    >>> tables = {"run": {"seed": 1}, "dp_pasgd": {"steps": 20, "tau": 5, "sigma": 1.0}}
    >>> experiment_config(tables, {"dp_pasgd.tau": 4}, seed=3).run.seed
    3
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Union

from pydantic import BaseModel

from testbed.assembly.config import Config, apply_overrides, build_config, load_config, to_dict
from testbed.checked import inputs
from testbed.errors import UserError

#: An experiment: a TOML file's path, the dict of its tables ({"run": {...}, "data": {...}}), or a
#: validated config (testbed.assembly.config.load_config's).
Experiment = Union[str, os.PathLike, Mapping[str, Mapping[str, Any]], Config]
#: Overrides: {"section.key": value, ...}, or the command line's ["section.key=value", ...] (the
#: value read as TOML, else as a string).
Overrides = Union[Mapping[str, Any], Sequence[str], None]


def experiment_config(experiment: Experiment, overrides: Overrides = None, *, mode: str | None = None,
                      seed: int | None = None) -> Config:
    """The validated experiment: ``experiment`` with ``overrides``, then ``mode`` (run.mode) and
    ``seed`` (run.seed) when given, applied in that order before it is validated once.

    Raises:
        ConfigError: one line naming the key (a file that is missing or not TOML, an unknown key, a
            value out of range, a run id that cannot go into an MQTT topic).
    """
    items = _override_items(overrides)
    items += [(key, v) for key, v in (("run.mode", mode), ("run.seed", seed)) if v is not None]
    if isinstance(experiment, (str, os.PathLike)):
        config = load_config(inputs.experiment_file(Path(experiment)), items)
    elif isinstance(experiment, BaseModel):
        config = build_config(apply_overrides(to_dict(experiment, used_only=False), items)) if items else experiment
    elif isinstance(experiment, Mapping):
        tables = {name: dict(t) if isinstance(t, Mapping) else t for name, t in experiment.items()}
        config = build_config(apply_overrides(copy.deepcopy(tables), items))  # the caller's dict stays as it was
    else:
        raise UserError(f"an experiment is a file's path, a dict of its tables or a config, got "
                        f"{type(experiment).__name__}")
    inputs.run_id(config.mqtt.run_id)  # it goes into MQTT topics: refused in sim too (see testbed run)
    return config


def _override_items(overrides: Overrides) -> list[str | tuple[str, Any]]:
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [(key, v) for key, v in overrides.items()]
    if isinstance(overrides, Sequence) and not isinstance(overrides, str) and all(isinstance(o, str) for o in overrides):
        return list(overrides)
    raise UserError('overrides: a dict {"section.key": value} or a list of "section.key=value" strings, got '
                    f"{overrides!r:.80}")
