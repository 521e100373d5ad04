"""Loading the project's YAML files with errors a user can act on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from nlp_bench.errors import SpecError, did_you_mean

#: libyaml's parser when PyYAML was built with it (several times faster), the same safe subset either way
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: Path, what: str) -> dict[str, Any]:
    """A YAML mapping from `path`, or one SpecError line naming the file and the fault."""
    if not path.is_file():
        raise SpecError(f"{what} file not found: {path}")
    try:
        data = yaml.load(path.read_text(), Loader=_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{path}{where}: invalid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def check_keys(data: dict[str, Any], allowed: set[str], where: str) -> None:
    """Refuse unknown keys, with a did-you-mean: a typo must not silently drop a setting."""
    for key in data:
        if key not in allowed:
            raise SpecError(f"{where}: unknown key {key!r}{did_you_mean(str(key), allowed)}")
