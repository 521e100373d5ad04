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
    words, variables = _read(text, where)
    if variables is None:
        raise SpecError(f"{where}: no TRAIN_ARGS=( ... ) array: not a jobscript nlp-bench rendered")
    return words


def _read(text: str, where: str) -> tuple[list[str], dict[str, str] | None]:
    """The TRAIN_ARGS words and the variables the script sets at its top level; None for the variables where
    the script has no TRAIN_ARGS array."""
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
    return words, variables if found else None


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


#: the layout fields of point.json and what a rendered jobscript says of each: a trainer flag of TRAIN_ARGS,
#: or a variable the script exports
_FLAGS = {"tp": "--tensor-model-parallel-size", "pp": "--pipeline-model-parallel-size", "mbs": "--micro-batch-size",
          "global_batch_size": "--global-batch-size", "cp": "--context-parallel-size",
          "ep": "--expert-model-parallel-size", "etp": "--expert-tensor-parallel-size"}
_EXPORTS = {"devices_per_node": "GPUS_PER_NODE", "dp": "DP_SIZE", "gas": "GAS"}


def jobscript_layout(text: str, where: str) -> dict[str, tuple[int, str]]:
    """The layout a rendered jobscript runs, by point.json's layout field: the value, and where the script
    says it (a flag, a variable, #SBATCH --nodes). Only what the script states as a number is there: a
    script without TRAIN_ARGS (written by hand) states its node count at most."""
    found: dict[str, tuple[int, str]] = {}
    nodes = jobscript_nodes(text)
    if nodes is not None:
        found["nodes"] = (nodes, "#SBATCH --nodes")
    words, variables = _read(text, where)
    for key, flag in _FLAGS.items():
        if flag in words[:-1]:
            value = words[words.index(flag) + 1]
            if value.isdigit():
                found[key] = (int(value), flag)
    for key, name in _EXPORTS.items():
        value = (variables or {}).get(name, "")
        if value.isdigit():
            found[key] = (int(value), name)
    return found
