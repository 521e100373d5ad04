"""The planner's answers as text: ranked layouts, what was pruned and why, the node count for a target,
and a calibration's fit."""

from __future__ import annotations

import textwrap

from tabulate import tabulate

from nlp_bench.report.fit import wrap
from nlp_bench.report.folded import Columns, folded

HEADERS = ["#", "nodes", "tp", "pp", "dp", "vp", "mbs", "gas", "GBS", "recompute", "dist-opt", "GiB/device",
           "tokens/s", "interval", "time_to_report s", "corpus"]
#: the figures stay at any width; the layout goes first, as each row's `bench run` line names it
_COLUMNS = Columns(
    right=("#", "nodes", "tp", "pp", "ep", "etp", "dp", "vp", "mbs", "gas", "GBS", "GiB/device", "tokens/s", "interval",
           "time_to_report s"),
    kept=("#", "GiB/device", "tokens/s", "interval", "time_to_report s"),
    least_needed=("dp", "GBS", "corpus", "mbs", "dist-opt", "gas", "recompute", "vp", "etp", "ep", "pp", "tp", "nodes"),
    narrow={"dist-opt": "dist-\nopt", "GiB/device": "GiB/\ndevice", "time_to_report s": "time_to_\nreport s"},
    hint="each row's `bench run` line names its layout; --json: every column")


def _row(rank: int, p, experts: bool = False) -> list:
    d = p.to_dict()
    interval = (f"{d['tokens_per_s_low']:,.0f}-{d['tokens_per_s_high']:,.0f}"
                if d["tokens_per_s_low"] is not None else "")
    expert_axes = [d.get("ep", 1), d.get("etp", d["tp"])] if experts else []
    return [rank, d["nodes"], d["tp"], d["pp"], *expert_axes, d["dp"], d["vp"], d["mbs"], d["gas"], d["global_batch_size"],
            d["recompute"], "on" if d["distributed_optimizer"] else "off", f"{d['memory_gib']:.1f}",
            f"{d['tokens_per_s']:,.0f}", interval, f"{d['time_to_report_s']:,.1f}",
            "EXTRAPOLATED" if d["extrapolated"] else "inside"]


def _legend(shown: list, width: int | None) -> str:
    out = wrap("interval: where the measured tokens/s lies if the planner errs as it did on its published corpus "
               "(a 90% conformal interval of the leave-one-source-out errors, `bench plan validate`)", width) + "\n"
    far = next((p for p in shown if p.extrapolated), None)
    if far is not None:
        out += wrap(f"EXTRAPOLATED: outside the corpus ({'; '.join(far.outside)}): trust the interval less", width) + "\n"
    return out


def _table(shown: list, width: int | None) -> str:
    """The ranked rows; with the expert axes (ep, expert tp) where any row has them."""
    experts = any("ep" in p.to_dict() for p in shown)
    headers = [*HEADERS[:4], "ep", "etp", *HEADERS[4:]] if experts else HEADERS
    return folded(headers, [_row(rank, p, experts) for rank, p in enumerate(shown, 1)], width, _COLUMNS)


def _commands(commands: list[str | None], width: int | None, rules: str | None = None) -> str:
    """Each row's `bench run` line, by its #: the point it makes is predicted as the row is; a line longer than
    the width goes on over lines that end in a backslash, as a shell reads them. Where the tag has submission
    rules, the lines that change what they keep (recompute, the distributed optimizer) are named."""
    if not any(commands):
        return "no `bench run` line: no tag trains the model planned (--model)\n" if commands else ""
    out = wrap("each row as a `bench run` line, its point predicted as the row (in a grid: axes vp, recompute, "
               "distributed_optimizer):", width) + "\n"
    for rank, line in enumerate(commands, 1):
        if line is not None:
            out += _folded_command(f"#{rank}".rjust(3) + "  ", line, width) + "\n"
    departing = [f"#{rank}" for rank, line in enumerate(commands, 1)
                 if line and ("--recompute" in line or "distributed-optimizer" in line)]
    if rules and departing:
        out += wrap(f"{', '.join(departing)} change recompute or the distributed optimizer, training arguments the "
                    f"{rules} rules keep as the tag has them: `bench rules check` calls such a run no submission",
                    width) + "\n"
    return out


def _folded_command(prefix: str, line: str, width: int | None) -> str:
    """The command after `prefix`, each option with its value kept together; continued lines end in ` \\`."""
    import shlex

    words = shlex.split(line)
    parts = [shlex.join(words[:2])]
    for word in words[2:]:
        if word.startswith("--") or not parts[-1].startswith("--") or " " in parts[-1]:
            parts.append(shlex.quote(word))
        else:
            parts[-1] += " " + shlex.quote(word)
    lines, indent = [prefix + parts[0]], " " * (len(prefix) + 4)
    for part in parts[1:]:
        if width is not None and len(lines[-1]) + 1 + len(part) + 2 > width:
            lines[-1] += " \\"
            lines.append(indent + part)
        else:
            lines[-1] += " " + part
    return "\n".join(lines)


def _basis(calibrated: bool, base, width: int | None = None) -> str:
    how = ("calibrated on this system's measured runs (bench plan calibrate)" if calibrated else
           "from the fit on the published corpus (not calibrated on this system; see `bench plan calibrate`)")
    memory = (f"{base.system.device_memory_gib:g} GiB each" if base.system.device_memory_gib is not None
              else "device memory not in the profile")
    rate, source = base.system.matmul_rate()
    gemms = f"; GEMMs timed against {rate:g} TFLOP/s ({_short(source)})" if rate is not None else ""
    on = base.candidate.switches
    fp8, fp8_source = base.system.matmul_rate(fp8=True, precision=on.compute_precision)
    if on.fp8 and fp8 is not None:
        gemms += f", {on.compute_precision.upper()} linear layers against {fp8:g} ({_short(fp8_source)})"
    return wrap(f"{base.model.name} on {base.system.name} ({base.system.devices_per_node} x "
                f"{base.system.device_name or base.system.device}, {memory}); predictions {how}{gemms}", width) + "\n"


def _short(source: str) -> str:
    """A matmul rate's basis in a few words: measured (where) or assumed."""
    if source.startswith("no measured"):
        return source.split(": ", 1)[1]
    return "measured, device table" if "(device table)" in source else "measured, system profile"


def _batch(shown: list, base) -> str:
    """The global batch the layouts shown train, and the tag's beside it where they differ."""
    sizes = sorted({p.candidate.layout.global_batch_size for p in shown})
    tag = base.candidate.layout.global_batch_size
    if sizes == [tag]:
        return f"global batch {tag} (the tag's, kept; gas follows from dp x mbs)\n"
    listed = ", ".join(str(s) for s in sizes[:6]) + (", ..." if len(sizes) > 6 else "")
    return f"global batch {listed} (decided by the gas kept or pinned, or the batch given; the tag's is {tag})\n"


def render_plan(good: list, pruned: list, calibrated: bool, base, top: int, width: int | None = None,
                commands: list[str | None] | None = None, rules: str | None = None) -> str:
    """The ranked layouts, the `bench run` line of each (`commands`, by row), then what was pruned and why; with a
    `width`, every line fits it."""
    out = [_basis(calibrated, base, width)]
    if good or pruned:
        out.append(wrap(_batch(good or pruned, base).rstrip("\n"), width) + "\n")
    if good:
        out.append(_table(good, width))
        out.append(_legend(good, width))
        out.append(_commands(commands or [], width, rules))
    else:
        out.append("no layout both runs and fits in device memory; the pruned ones below say why\n")
    if pruned:
        memory = sum(1 for p in pruned if "GiB" in p.reason)
        out.append(wrap(f"pruned {len(pruned)} layout(s): {memory} do not fit in device memory"
                        + (f", {len(pruned) - memory} cannot run the model" if len(pruned) > memory else ""), width)
                   + "\n")
        for p in pruned[:min(top, 5)]:
            d = p.to_dict()
            experts = f" ep {d['ep']} etp {d['etp']}" if "ep" in d else ""
            line = (f"tp {d['tp']} pp {d['pp']}{experts} vp {d['vp']} mbs {d['mbs']} gas {d['gas']} recompute "
                    f"{d['recompute']} dist-opt {'on' if d['distributed_optimizer'] else 'off'}: {p.reason}"
                    + (f" (it would reach {d['tokens_per_s']:,.0f} tokens/s)" if d["tokens_per_s"] else ""))
            out.append(textwrap.indent(wrap(line, width and width - 2), "  ") + "\n")
    return "".join(out)


def render_target(best, seconds: float, calibrated: bool, base, width: int | None = None,
                  command: str | None = None, rules: str | None = None) -> str:
    out = [_basis(calibrated, base, width)]
    if best is None:
        limit = base.system.max_nodes
        out.append(f"no node count up to {limit} reaches time_to_report <= {seconds:g} s\n")
        return "".join(out)
    out.append(f"fewest nodes for time_to_report <= {seconds:g} s: {best.candidate.layout.nodes}\n")
    out.append(_table([best], width))
    out.append(_legend([best], width))
    out.append(_commands([command], width, rules))
    return "".join(out)


def render_calibration(fits: dict) -> str:
    out = []
    for system, (result, checks) in fits.items():
        eff = result.efficiency
        out.append(f"calibrated {system}: GEMM efficiency {eff.gemm:.3f} (half size {eff.gemm_half:.0f}), network "
                   f"efficiency {eff.network:.3f}, memory efficiency {eff.memory:.3f}; refitted "
                   f"{', '.join(result.free)} on {len(checks)} point(s), the rest from the corpus fit; "
                   f"rms log error {result.rms_log_error:.4f}, largest error {100 * result.max_error:.1f}%\n")
        for line in result.pinned:
            out.append(f"  the fit ended on a bound: {line}\n")
        rows = [[label, f"{pred:,.0f}", f"{meas:,.0f}", f"{100 * (pred / meas - 1):+.1f}%"] for label, pred, meas in checks]
        out.append(tabulate(rows, headers=["point", "predicted tokens/s", "measured", "error"], disable_numparse=True)
                   + "\n")
    return "".join(out)


VALIDATION_HEADERS = ["row", "publication", "model", "system", "nodes", "tp", "pp", "dp", "measured tokens/s",
                      "predicted", "error", "others' interval", "inside"]
#: the figures stay at any width; who published a row goes first
_VALIDATION_COLUMNS = Columns(
    right=("nodes", "tp", "pp", "dp", "measured tokens/s", "predicted", "error", "others' interval"),
    kept=("row", "measured tokens/s", "predicted", "error", "others' interval", "inside"),
    least_needed=("publication", "dp", "model", "system", "pp", "tp", "nodes"),
    narrow={"measured tokens/s": "measured\ntokens/s", "others' interval": "others'\ninterval", "inside": "in-\nside"},
    hint="--json: every column")


def render_validation(found: dict, width: int | None = None) -> str:
    """`bench plan validate`: each row, held out with its publication; then the errors and how often the
    intervals held; with a `width`, every line fits it."""
    rows = [[r["id"], r["publication"], r["model"], r["system"], r["nodes"], r["tp"], r["pp"], r["dp"],
             f"{r['measured']:,.0f}", f"{r['predicted']:,.0f}", f"{100 * r['error']:+.1f}%",
             f"{100 * r['interval'][0]:+.0f}..{100 * r['interval'][1]:+.0f}%", "yes" if r["inside"] else "NO"]
            for r in found["rows"]]
    eff = found["efficiency"]
    lines = [f"median absolute error {100 * found['median_abs_error']:.1f}%, largest "
             f"{100 * found['max_abs_error']:.1f}% ({len(rows)} rows, {found['publications']} publications)",
             f"inside the interval the other publications' errors give: {100 * found['coverage']:.0f}% of rows; "
             f"mean half-width ±{100 * found['mean_interval_half_width']:.1f}%",
             f"memory: {found['ran_predicted_to_fit'][0]} of the {found['ran_predicted_to_fit'][1]} published runs "
             f"predicted to fit in their devices' memory; {found['oom_predicted_not_to_fit'][0]} of the "
             f"{found['oom_predicted_not_to_fit'][1]} published layouts with no figure (taken as out of memory) "
             "predicted not to fit (results/reference/planner-memory.yaml)",
             *(f"held out by {way}: worst {k['kind']} (median {100 * k['median_abs_error']:.1f}%, largest "
               f"{100 * k['max_abs_error']:.1f}%, {100 * k['coverage']:.0f}% inside the other {way} kinds' interval; "
               f"{len(found['kinds'][way])} kinds)" for way, k in found.get("worst_kind", {}).items()),
             *([f"the intervals predictions carry (their scale band's and system's), each row's publication unseen: "
                f"{100 * found['carried_coverage']:.0f}% of rows inside, mean half-width "
                f"±{100 * found['carried_mean_half_width']:.1f}%"] if "carried_coverage" in found else []),
             f"fit on all rows: GEMM efficiency {eff['gemm']:.3f} (half size {eff['gemm_half']:.0f}), "
             f"network {eff['network']:.3f}, memory {eff['memory']:.3f}",
             *(f"the fit ended on a bound: {line}" for line in found["pinned"])]
    return (wrap("leave-one-source-out over the planner's corpus (results/reference/planner-corpus.yaml): each "
                 "publication's rows predicted by a fit on the other publications", width) + "\n"
            + folded(VALIDATION_HEADERS, rows, width, _VALIDATION_COLUMNS)
            + "".join(wrap(line, width) + "\n" for line in lines))


def render_predictions(found: list[dict]) -> str:
    """`bench plan predict`: one line per stated layout, then why each unanswered one has no figures."""
    def figure(value, fmt="{:,.0f}"):
        return "-" if value is None else fmt.format(value)

    rows = [[r["id"], r["model"], r["system"], r["nodes"], r["tp"], r["pp"], r["cp"], figure(r["dp"], "{}"), r["mbs"],
             r["global_batch_size"], figure(r["memory_gib"], "{:.1f}"), figure(r["tokens_per_s"]),
             "-" if r["tokens_per_s_low"] is None else f"{r['tokens_per_s_low']:,.0f}..{r['tokens_per_s_high']:,.0f}",
             "yes" if r["extrapolated"] else ("-" if r["extrapolated"] is None else "no")] for r in found]
    out = [tabulate(rows, headers=["row", "model", "system", "nodes", "tp", "pp", "cp", "dp", "mbs", "GBS", "GiB/device",
                                   "tokens/s", "~90% interval", "extrapolated"], disable_numparse=True) + "\n"]
    for r in found:
        if r["reason"]:
            out.append(f"{r['id']}: {r['reason']}\n")
        if r["outside_corpus"]:
            out.append(f"{r['id']}: outside the corpus: {', '.join(r['outside_corpus'])}\n")
    return "".join(out)
