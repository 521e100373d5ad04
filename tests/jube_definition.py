"""What jube/nlp_benchmark.yaml must say of the shipped tags and system profiles: its block of `bench_tag`
and `system` parameters, made from the registries (benchmark/nlp.yaml's tags, slurm/systems/), so that a
test can compare the checked-in block with this one and print it to paste when a tag or a profile changes."""

import json
import re

from conftest import ROOT

from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.systems import known_systems

DEFINITION = ROOT / "jube" / "nlp_benchmark.yaml"
#: the comment lines that open and close the generated block in the definition
BEGIN = "generated from the registries"
END = "# end of the generated block"


def jube_tag(name: str) -> str:
    """A tag or profile name as JUBE's tag expressions take it: no '-' (nor '.')."""
    return re.sub(r"[-.]", "_", name)


def _parameter(name: str, tag: str, value: str) -> str:
    return f"      - {{name: {name}, tag: {json.dumps(tag)}, _: {json.dumps(value)}}}"


def expected_block() -> str:
    """The lines between BEGIN and END: one `bench_tag` per tag of the benchmark and its default where no tag
    is given, one `system` per profile and the tag's own system where none is given."""
    benchmark = load_benchmark("nlp")
    tags, systems = list(benchmark.tags), known_systems()
    lines = [_parameter("bench_tag", jube_tag(tag), tag) for tag in tags]
    lines.append(_parameter("bench_tag", "+".join(f"!{jube_tag(tag)}" for tag in tags), benchmark.default_tag))
    lines += [_parameter("system", jube_tag(system), system) for system in systems]
    lines.append(_parameter("system", "+".join(f"!{jube_tag(system)}" for system in systems), ""))
    return "\n".join(lines) + "\n"


def checked_in_block() -> str:
    """The definition's lines between BEGIN and END; empty where it has no such block."""
    text = DEFINITION.read_text()
    if BEGIN not in text or END not in text:
        return ""
    start = text.index("\n", text.index(BEGIN)) + 1
    end = text.rindex("\n", 0, text.index(END)) + 1
    return text[start:end]
