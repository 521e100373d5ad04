"""`bench result export --format submission`: one run as the benchmark asks a submission to be handed in:
the result table, each point's jobscript and arguments as run, its logs, the software it ran on
(torch, CUDA, NCCL, Megatron-LM's commit when it trained) and the rules verdict, with a manifest of
checksums so that what is read back is what was written."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from nlp_bench.analysis.results import run_results
from nlp_bench.errors import ResultError, SpecError
from nlp_bench.fsio import read_json, write_json_atomic, write_text_atomic
from nlp_bench.report.table import read_export, render
from nlp_bench.spec.trainers import BUILTIN
from nlp_bench.store.files import os_reason
from nlp_bench.store.point_folder import PointDir
from nlp_bench.store.runs import Run

MANIFEST, TABLE, RULES, PROVENANCE = "manifest.json", "results.csv", "rules.json", "provenance.json"


def write_submission(run: Run, out: Path) -> dict[str, Any]:
    """The bundle of `run` in the new folder `out` (written beside it, then moved in place whole)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ResultError(f"{out} exists and is not an empty folder; a submission bundle goes into a new one")
    results = run_results(run)
    try:
        _write(run, results, out)
    except OSError as exc:  # a full disk, a read-only folder: the bundle is named, not the file inside it
        if exc.filename is not None and not str(exc.filename).startswith((str(out), str(out.parent / f".{out.name}."))):
            raise  # a file the bundle is made from, which the error names
        raise ResultError(f"{out}: cannot write the submission bundle: {os_reason(exc)}") from None
    return read_submission(out)


def _write(run: Run, results: list, out: Path) -> None:
    from nlp_bench.app.rules_check import check_point

    meta = run.record()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))  # beside it: the move is a rename
    try:
        write_text_atomic(tmp / TABLE, render([row for row, _ in results], "csv"))
        verdicts, software = [], []
        for listed in run.points():
            if not listed.exists():  # run.json lists it: a bundle without it is not the run
                verdicts.append({"point": listed.id, "valid": False, "verdict": "missing: its folder is gone"})
                continue
            folder = listed.path
            target = tmp / "points" / folder.name
            target.mkdir(parents=True)
            listed.archive(target)
            point = listed.point().data
            software.append(_software(folder, point))
            if point.get("rules"):
                try:
                    verdicts.append(check_point(folder, point, point["rules"]).to_dict())
                except SpecError as exc:
                    verdicts.append({"point": point["id"], "valid": False, "verdict": f"cannot be checked: {exc}"})
            else:
                verdicts.append({"point": point["id"], "valid": False, "verdict": f"tag {point['tag']} has no rules"})
        write_json_atomic(tmp / RULES, {"valid": all(v["valid"] for v in verdicts), "points": verdicts})
        write_json_atomic(tmp / PROVENANCE, {"run": run.id, "benchmark": run.benchmark, "command": list(meta.command),
                                             "versions": meta.versions, "points": software})
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        write_json_atomic(tmp / MANIFEST, {str(p.relative_to(tmp)): _sha256(p) for p in files})
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _software(folder: Path, point: dict[str, Any]) -> dict[str, Any]:
    """What the job ran on, as its log and its environment record say."""
    result = PointDir(folder).result() or {}
    found = result.get("provenance") or {}
    environment = {**(found.get("environment") or {}), **PointDir(folder).environment()}
    return {"point": point["id"], "trainer": point.get("trainer", BUILTIN), "torch": found.get("torch"),
            "cuda": found.get("cuda"), "nccl": found.get("nccl"),
            "megatron_lm_commit": environment.get("MEGATRON_LM_COMMIT"),
            "megatron_lm_version": environment.get("MEGATRON_LM_VERSION"),
            "megatron_lm_made_for": (point.get("megatron_lm") or {}).get("version"),
            "packages": {**(found.get("packages") or {}), **PointDir(folder).packages()},
            "nodelist": found.get("nodelist"), "jobscript_sha256": found.get("jobscript_sha256")}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_submission(folder: Path) -> dict[str, Any]:
    """A bundle read back: its table (as a DataFrame), rules verdict and provenance, every file checked
    against the manifest."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        raise ResultError(f"{folder}: no {MANIFEST}; not a submission bundle")
    manifest = read_json(folder / MANIFEST)
    for name, digest in manifest.items():
        path = folder / name
        if not path.is_file() or _sha256(path) != digest:
            raise ResultError(f"{folder}: {name} is missing or changed since the bundle was written")
    return {"table": read_export(folder / TABLE, "csv"), "rules": read_json(folder / RULES),
            "provenance": read_json(folder / PROVENANCE), "files": sorted(manifest)}
