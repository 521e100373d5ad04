"""`bench rules check` as text: per point, the free parameters, every deviation and the verdict."""

from __future__ import annotations

from typing import Any


def render_rules(checked: list[dict[str, Any]]) -> str:
    lines = []
    for entry in checked:
        made_for = f", for {entry['megatron_lm']}" if entry.get("megatron_lm") else ""
        lines.append(f"{entry['point']}: tag {entry['tag']}, rules {entry['rules']}, arguments from {entry['source']}"
                     f"{made_for}")
        free = [f"{name} {v['found']}" + (f" (reference {v['reference']}, changed: allowed)" if v["changed"] else "")
                for name, v in entry["free"].items()]
        lines.append(f"  free parameters: {', '.join(free)}")
        if entry.get("translations"):
            lines.append("  read as the reference's own (that Megatron-LM's spelling of a reference flag):")
            lines.extend(f"    {text}" for text in entry["translations"])
        if entry["deviations"]:
            width = max(len(d["flag"]) for d in entry["deviations"])
            lines.append("  deviations:")
            for d in entry["deviations"]:
                lines.append(f"    {d['flag']:<{width}}  expected {d['expected']}, found {d['found']}  [{d['rule']}]")
        lines.append(f"  verdict: {entry['verdict']}")
    return "\n".join(lines) + "\n"
