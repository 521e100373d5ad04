"""The trainer's arguments read back from a rendered jobscript, without running it: the TRAIN_ARGS
array the template writes, with the script's own `export NAME=value` lines substituted. What a job
really ran is in its train.args (written by the script at start); this is for scripts not yet run."""

from __future__ import annotations

import re
import shlex

from nlp_bench.errors import SpecError

_EXPORT = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_NODES = re.compile(r"^#SBATCH\s+(?:--nodes[= ]|-N\s*)(\d+)\s*$", re.M)


def jobscript_args(text: str, where: str) -> list[str]:
    """The words of the script's TRAIN_ARGS=( ... ) (and TRAIN_ARGS+=( ... ) lines outside a condition),
    with the variables the script sets itself expanded; unknown ones stay as written."""
    variables: dict[str, str] = {}
    words: list[str] = []
    lines = iter(text.splitlines())
    found = False
    depth = 0  # inside if/fi: a conditional addition (LOAD_CHECKPOINTS) is not what a plain run passes
    for line in lines:
        stripped = line.strip()
        if re.match(r"^if\b", stripped):
            depth += 1
        elif stripped == "fi":
            depth = max(0, depth - 1)
        opening = re.match(r"^TRAIN_ARGS(\+?)=\((.*)$", stripped)
        if opening and depth == 0:
            found = True
            body = [opening.group(2)]
            while not body[-1].rstrip().endswith(")"):
                body.append(next(lines, ")"))
            body[-1] = body[-1].rstrip()[:-1]
            try:
                parts = shlex.split("\n".join(body), comments=True)
            except ValueError as exc:
                raise SpecError(f"{where}: TRAIN_ARGS cannot be read ({exc})") from None
            words += [_expand(w, variables) for w in parts]
            continue
        match = _EXPORT.match(stripped)
        if match and depth == 0:
            try:
                value = shlex.split(match.group(2), comments=True)
            except ValueError:
                continue
            variables[match.group(1)] = _expand(" ".join(value), variables) if value else ""
    if not found:
        raise SpecError(f"{where}: no TRAIN_ARGS=( ... ) array: not a jobscript nlp-bench rendered")
    return words


def _expand(word: str, variables: dict[str, str]) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(3)
        if name in variables:
            return variables[name]
        if match.group(2) is not None:
            return _expand(match.group(2), variables)
        return match.group(0)

    return _REFERENCE.sub(value, word)


def jobscript_nodes(text: str) -> int | None:
    """The node count the script asks Slurm for."""
    match = _NODES.search(text)
    return int(match.group(1)) if match else None
