"""The planner's answers as text: ranked layouts, what was pruned and why, the node count for a target,
and a calibration's fit."""

from __future__ import annotations

from tabulate import tabulate

HEADERS = ["nodes", "tp", "pp", "dp", "vp", "mbs", "gas", "GBS", "recompute", "dist-opt", "GiB/device",
           "tokens/s", "time_to_report s"]


def _row(p) -> list:
    d = p.to_dict()
    return [d["nodes"], d["tp"], d["pp"], d["dp"], d["vp"], d["mbs"], d["gas"], d["global_batch_size"], d["recompute"],
            "on" if d["distributed_optimizer"] else "off", f"{d['memory_gib']:.1f}",
            f"{d['tokens_per_s']:,.0f}", f"{d['time_to_report_s']:,.1f}"]


def _basis(calibrated: bool, base) -> str:
    how = "calibrated on measured runs" if calibrated else "NOT calibrated (default efficiencies; see --calibrate)"
    memory = (f"{base.system.device_memory_gib:g} GiB each" if base.system.device_memory_gib is not None
              else "device memory not in the profile")
    return (f"{base.model.name} on {base.system.name} ({base.system.devices_per_node} x "
            f"{base.system.device_name or base.system.device}, {memory}); predictions {how}\n")


def render_plan(good: list, pruned: list, calibrated: bool, base, top: int) -> str:
    out = [_basis(calibrated, base)]
    if good:
        out.append(tabulate([_row(p) for p in good], headers=HEADERS, disable_numparse=True) + "\n")
    else:
        out.append("no layout fits and runs\n")
    if pruned:
        memory = sum(1 for p in pruned if "GiB" in p.reason)
        out.append(f"pruned {len(pruned)} layout(s): {memory} do not fit in device memory"
                   + (f", {len(pruned) - memory} cannot run the model" if len(pruned) > memory else "") + "\n")
        for p in pruned[:min(top, 5)]:
            d = p.to_dict()
            out.append(f"  tp {d['tp']} pp {d['pp']} vp {d['vp']} mbs {d['mbs']} gas {d['gas']} recompute "
                       f"{d['recompute']} dist-opt {'on' if d['distributed_optimizer'] else 'off'}: {p.reason}"
                       + (f" (it would reach {d['tokens_per_s']:,.0f} tokens/s)" if d["tokens_per_s"] else "") + "\n")
    return "".join(out)


def render_target(best, seconds: float, calibrated: bool, base) -> str:
    out = [_basis(calibrated, base)]
    if best is None:
        limit = base.system.max_nodes
        out.append(f"no node count up to {limit} reaches time_to_report <= {seconds:g} s\n")
        return "".join(out)
    out.append(f"fewest nodes for time_to_report <= {seconds:g} s: {best.candidate.nodes}\n")
    out.append(tabulate([_row(best)], headers=HEADERS, disable_numparse=True) + "\n")
    return "".join(out)


def render_calibration(fits: dict) -> str:
    out = []
    for system, (result, checks) in fits.items():
        eff = result.efficiency
        out.append(f"calibrated {system}: compute efficiency {eff.compute:.3f}, network efficiency {eff.network:.3f} "
                   f"on {len(checks)} point(s); rms log error {result.rms_log_error:.4f}, "
                   f"largest error {100 * result.max_error:.1f}%\n")
        rows = [[label, f"{pred:,.0f}", f"{meas:,.0f}", f"{100 * (pred / meas - 1):+.1f}%"] for label, pred, meas in checks]
        out.append(tabulate(rows, headers=["point", "predicted tokens/s", "measured", "error"], disable_numparse=True)
                   + "\n")
    return "".join(out)
