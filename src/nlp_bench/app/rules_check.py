"""`bench rules check`: a run's points (or a tag's point, rendered but not written) judged by the
benchmark's submission rules on the arguments the trainer got: the job's train.args when it ran, else
the TRAIN_ARGS of its jobscript as it is on disk now."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from nlp_bench.errors import SpecError
from nlp_bench.launch.render import render_jobscript
from nlp_bench.launch.script_args import jobscript_args, jobscript_nodes
from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.megatron.checkout import Checkout
from nlp_bench.spec.megatron.target import checkout_for, for_megatron
from nlp_bench.spec.megatron.translations import for_checkout, named
from nlp_bench.spec.rules import Deviation, Verdict, load_rules
from nlp_bench.spec.trainers import MEGATRON_LM
from nlp_bench.store.names import JOBSCRIPT, TRAIN_ARGS_FILE
from nlp_bench.store.point_folder import PointDir
from nlp_bench.store.runs import find_run


@dataclass(frozen=True)
class PointVerdict:
    point: str
    source: str  # where the arguments were read: train.args (what ran), the jobscript, or a fresh render
    verdict: Verdict
    #: the Megatron-LM the arguments were made for ("Megatron-LM 0.20.0 (d98e8a64dd)"), if that is the trainer
    megatron_lm: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"point": self.point, "source": self.source, **self.verdict.to_dict(), "megatron_lm": self.megatron_lm}


def check_tag(benchmark_name: str, tag: str | None, system: str | None, trainer: str | None) -> list[PointVerdict]:
    benchmark = load_benchmark(benchmark_name)
    point = benchmark.point(tag, system, trainer=trainer)
    if not point.rules:
        judged = [name for name, spec in benchmark.tags.items() if spec.get("rules")]
        asked = "".join(f" --{name} {value}" for name, value in (("system", system), ("trainer", trainer)) if value)
        raise SpecError(f"tag {point.tag} has no submission rules: only a tag with `rules:` in {benchmark.path} is "
                        f"judged ({', '.join(judged) or 'none there'}); `bench run --tag {point.tag}{asked} --dry-run` "
                        f"checks its layout{' and its Megatron-LM flags' if point.trainer == MEGATRON_LM else ''}")
    if point.trainer == MEGATRON_LM:
        point = for_megatron(point, checkout_for(point.system, required=False))
    text = render_jobscript(point)
    made = point.megatron_lm or {}
    verdict = load_rules(point.rules).check(point.tag, jobscript_args(text, point.id), jobscript_nodes(text),
                                            named(made.get("translations", []), point.id))
    return [PointVerdict(point.id, "rendered now", verdict, _made_for(made))]


def _made_for(made: dict[str, Any]) -> str | None:
    if not made:
        return None
    if not made.get("version"):
        return f"Megatron-LM {made.get('flag_table_version')} (no checkout was at hand: the oldest kept that takes the flags)"
    commit = made.get("commit")
    return f"Megatron-LM {made['version']} ({commit[:10] if commit else 'commit unknown'})"


def check_run(results_dir: Path, run_ref: str | None) -> list[PointVerdict]:
    """Every point of the run judged; a point whose folder is gone cannot be shown to follow the rules, so
    a run that lost one is not a submission."""
    run = find_run(results_dir, run_ref)
    out, without, missing = [], [], []
    for folder in run.points():
        if not folder.exists():
            missing.append(folder.id)
            continue
        point = folder.point().data
        rules = point.get("rules", _tag_rules(point))
        if not rules:
            without.append(point["tag"])
            continue
        out.append(check_point(folder.path, point, rules))
    for name in missing:
        gone = Deviation("the point's folder", "present", "missing (run.json lists it)",
                         "a submission holds every point of its run")
        out.append(PointVerdict(name, "nothing: its folder is gone", Verdict(out[0].verdict.rules if out else "?",
                                                                           ", ".join(run.record().tags), [gone])))
    if not out:
        raise SpecError(f"run {run.id}: no point has submission rules (tag {', '.join(sorted(set(without)))}); "
                        "rules exist for tags with `rules:` in the benchmark, such as 13 and 175")
    return out


def check_point(folder: Path, point: dict[str, Any], rules: str) -> PointVerdict:
    script = folder / JOBSCRIPT
    text = script.read_text(errors="replace") if script.is_file() else ""
    ran = folder / TRAIN_ARGS_FILE
    if ran.is_file():
        argv, source = ran.read_text(errors="replace").splitlines(), f"{TRAIN_ARGS_FILE} (as the job ran)"
    elif text:
        argv, source = jobscript_args(text, str(script)), f"{JOBSCRIPT} (not run yet)"
    else:
        raise SpecError(f"{folder}: neither {TRAIN_ARGS_FILE} nor {JOBSCRIPT}: nothing to check")
    nodes = jobscript_nodes(text) or point["layout"]["nodes"]
    made = point.get("megatron_lm") or {}
    translations = named(made.get("translations", []), str(folder))
    label = _made_for(made)
    ran_on = _version_that_ran(folder) if made and ran.is_file() else None
    if ran_on and ran_on != made.get("version"):
        # judged by what the Megatron-LM that ran does, not by the one the arguments were made for
        translations = for_checkout(Checkout(folder, ran_on, None))
        label = f"Megatron-LM {ran_on}, as it ran (the arguments were made for {made.get('version') or 'the reference'})"
    return PointVerdict(point["id"], source, load_rules(rules).check(point["tag"], argv, nodes, translations), label)


def _version_that_ran(folder: Path) -> str | None:
    """The Megatron-LM version the job found at start (provenance.env), where it is one."""
    found = PointDir(folder).environment().get("MEGATRON_LM_VERSION")
    try:
        return found if found and Version(found) else None
    except InvalidVersion:
        return None


def _tag_rules(point: dict[str, Any]) -> str | None:
    """Runs written before points named their rules: the tag's, from the benchmark definition."""
    try:
        return load_benchmark(point["benchmark"]).tags.get(point["tag"], {}).get("rules")
    except SpecError:
        return None
