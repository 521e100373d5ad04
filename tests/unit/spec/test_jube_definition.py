"""jube/nlp_benchmark.yaml knows every shipped tag and system profile, and sets up its environment as the
README's install does (tests/integration/test_jube_every_tag.py runs it in the real JUBE)."""

import re

import yaml
from conftest import ROOT
from jube_definition import DEFINITION, checked_in_block, expected_block, jube_tag

from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.systems import known_systems


def _parameters(name: str) -> dict[str, str]:
    """The definition's values of one parameter of benchParameter, by the tag expression that selects each."""
    (params,) = [s["parameter"] for s in yaml.safe_load(DEFINITION.read_text())["parameterset"]
                 if s["name"] == "benchParameter"]
    return {str(p["tag"]): str(p["_"]) for p in params if p["name"] == name}


def test_the_generated_block_is_the_registries():
    assert checked_in_block() == expected_block(), (
        f"{DEFINITION}: its generated block is stale (a tag or a system profile was added, renamed or removed); "
        f"put these lines between its two comment lines:\n{expected_block()}")


def test_every_shipped_tag_is_a_jube_tag():
    benchmark = load_benchmark("nlp")
    chosen = _parameters("bench_tag")
    assert {tag: chosen.get(jube_tag(tag)) for tag in benchmark.tags} == {tag: tag for tag in benchmark.tags}
    (default,) = [value for expr, value in chosen.items() if expr.startswith("!")]
    assert default == benchmark.default_tag


def test_every_shipped_system_is_a_jube_tag():
    chosen = _parameters("system")
    assert {system: chosen.get(jube_tag(system)) for system in known_systems()} == {s: s for s in known_systems()}
    names = [*load_benchmark("nlp").tags, *known_systems(), "dry_run"]
    assert len({jube_tag(name) for name in names}) == len(names), "two names are one JUBE tag"


def test_setup_venv_pins_torch_before_the_project_as_the_readme_does():
    (step,) = [s for s in yaml.safe_load(DEFINITION.read_text())["step"] if s["name"] == "setup_venv"]
    pins = set(re.findall(r"pip install torch==(\S+)", (ROOT / "README.md").read_text()))
    assert len(pins) == 1, pins
    torch, project = step["do"].find(f"pip install torch=={pins.pop()} "), step["do"].find("pip install -e .")
    assert 0 <= torch < project, step["do"]
