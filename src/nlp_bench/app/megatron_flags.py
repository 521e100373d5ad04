"""`bench rules flags`: a Megatron-LM checkout's flag table, from its own argument parser, kept with the
others (benchmark/megatron-lm/flags/<version>.tsv), and the difference between two kept tables."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from nlp_bench import megatron_own_parser as own_parser
from nlp_bench.errors import SpecError
from nlp_bench.fsio import write_text_atomic
from nlp_bench.spec.megatron.checkout import read_checkout
from nlp_bench.spec.megatron.tables import known_tables, table_text, tables_dir

#: importing a current Megatron-LM takes about 10 s on a laptop; a site's shared file system may be slower
PARSER_TIMEOUT_S = 600


def own_parser_command(python: str, *args: str) -> list[str]:
    return [python, own_parser.__file__, *args]


def run_own_parser(python: str, *args: str) -> object:
    """Run Megatron-LM's own parser (nlp_bench/megatron_own_parser.py) with `python`; its JSON answer, or its own
    error as one line."""
    command = own_parser_command(python, *args)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PARSER_TIMEOUT_S)
    except FileNotFoundError:
        raise SpecError(f"no Python at {python}: give the one of the Megatron-LM environment with --python") from None
    except subprocess.TimeoutExpired:
        raise SpecError(f"Megatron-LM's parser did not answer within {PARSER_TIMEOUT_S} s: {' '.join(command)}") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise SpecError(f"Megatron-LM's own parser failed (exit {done.returncode}): "
                        f"{lines[-1] if lines else 'no message'}")
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise SpecError(f"Megatron-LM's parser printed no answer: {' '.join(command)}") from None


def write_flag_table(checkout_dir: Path, python: str | None, commit: str | None, source: str | None,
                     out_dir: Path | None) -> Path:
    """The table of `checkout_dir`'s version; `commit` names it where the checkout is not a git repository."""
    checkout = read_checkout(checkout_dir)
    commit = checkout.commit or commit
    if not commit:
        raise SpecError(f"{checkout_dir} is not a git checkout: say which commit it is with --commit")
    python = python or sys.executable
    flags = run_own_parser(python, "flags", str(checkout_dir))
    assert isinstance(flags, list)
    version_of = subprocess.run([python, "-c", "import sys, torch; print(sys.version.split()[0], torch.__version__)"],
                                capture_output=True, text=True).stdout.split()
    generated = (f"`bench rules flags .../{checkout_dir.resolve().name} --commit {commit}` on {datetime.now(timezone.utc):%Y-%m-%d} "
                 f"(Python {version_of[0] if version_of else platform.python_version()}, torch "
                 f"{version_of[1] if len(version_of) > 1 else '?'})")
    path = (out_dir or tables_dir()) / f"{checkout.version}.tsv"
    source = source or f"github.com/NVIDIA/Megatron-LM at {commit}"
    if checkout.modified:
        source += " (with local changes to tracked files)"
    text = table_text(checkout.version, commit, source, generated, flags)
    try:
        write_text_atomic(path, text)
    except OSError as exc:
        raise SpecError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def table_diff(old: str, new: str) -> list[str]:
    """Flags of version `old`'s table that `new`'s lacks: the candidates for translations.yaml."""
    tables = {t.version: t for t in known_tables()}
    for version in (old, new):
        if version not in tables:
            raise SpecError(f"no flag table for Megatron-LM {version}; kept: {', '.join(tables)}")
    return sorted(set(tables[old].flags) - set(tables[new].flags))
