"""The one-way arrows of DESIGN.md, checked on the import statements of every module."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "src" / "nlp_bench"

# package -> subpackages of nlp_bench it must never import
FORBIDDEN = {
    "spec": {"sweep", "launch", "train", "analysis", "report", "cli", "runner", "data"},
    "data": {"spec", "sweep", "launch", "train", "analysis", "report", "cli", "runner"},
    "sweep": {"launch", "train", "analysis", "report", "cli", "runner"},
    "launch": {"train", "analysis", "report", "cli", "runner"},
    "train": {"sweep", "launch", "analysis", "report", "cli", "runner"},
    "analysis": {"launch", "train", "report", "cli", "runner"},
    "report": {"launch", "train", "cli", "runner"},
    "plan": {"sweep", "launch", "train", "analysis", "report", "cli", "runner", "planner", "data", "kernels"},
    "kernels": {"spec", "sweep", "launch", "train", "analysis", "report", "cli", "runner", "plan", "data"},
}
TORCH_FREE = ("spec", "sweep", "launch", "analysis", "report", "data", "plan")


def imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_one_way_imports(package):
    for module in (PKG / package).rglob("*.py"):
        for name in imports(module):
            parts = name.split(".")
            if parts[0] == "nlp_bench" and len(parts) > 1:
                assert parts[1] not in FORBIDDEN[package], f"{module.relative_to(PKG)} imports {name}"


@pytest.mark.parametrize("package", TORCH_FREE)
def test_torch_free_packages(package):
    for module in (PKG / package).rglob("*.py"):
        assert not any(n.split(".")[0] in ("torch", "triton") for n in imports(module)), module
