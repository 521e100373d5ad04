"""The one-way arrows of docs/design.md ("The layers"), checked on the import statements of every module
(those inside functions too): no layer imports one above it, and no set of modules imports itself round a
circle. And the documents: the README short, every path they name there, nothing outside the repository."""

import ast
import functools
import re
from pathlib import Path

import pytest
from conftest import ROOT

PKG = ROOT / "src" / "nlp_bench"

# a part of nlp_bench (a subpackage or a top-level module) -> the parts it must never import
_ABOVE_THE_STORE = {"spec", "sweep", "launch", "train", "analysis", "report", "cli", "app", "plan", "data",
                    "kernels", "api"}
FORBIDDEN = {
    "store": _ABOVE_THE_STORE | {"registry"},
    "flops": _ABOVE_THE_STORE | {"store", "registry"},
    "registry": _ABOVE_THE_STORE | {"store", "flops"},
    "spec": {"sweep", "launch", "train", "analysis", "report", "cli", "app", "data", "plan", "store"},
    "data": {"spec", "sweep", "launch", "train", "analysis", "report", "cli", "app", "store"},
    "sweep": {"launch", "train", "analysis", "report", "cli", "app", "plan"},
    "launch": {"train", "analysis", "report", "cli", "app", "plan"},
    "train": {"sweep", "launch", "analysis", "report", "cli", "app", "plan", "store"},
    "analysis": {"launch", "train", "report", "cli", "app", "plan"},
    "report": {"launch", "train", "cli", "app"},
    "plan": {"sweep", "launch", "train", "analysis", "report", "cli", "app", "data", "kernels", "store"},
    "kernels": {"spec", "sweep", "launch", "train", "analysis", "report", "cli", "app", "plan", "data", "store"},
    "app": {"cli", "train"},
    "cli": {"train", "kernels"},
}
TORCH_FREE = ("store", "spec", "sweep", "launch", "analysis", "report", "data", "plan", "app", "cli")


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def imports(path: Path) -> set[str]:
    """Every module a file imports; `from package import name` counts package.name where that is a module."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            subs = {f"{node.module}.{a.name}" for a in node.names} & set(MODULES)
            names |= subs or {node.module}
    return names


def _files(part: str) -> list[Path]:
    folder, module = PKG / part, PKG / f"{part}.py"
    return sorted(folder.rglob("*.py")) if folder.is_dir() else [module]


def test_every_part_has_rules():
    parts = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert parts <= set(FORBIDDEN), f"add the new part(s) to FORBIDDEN: {parts - set(FORBIDDEN)}"


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_one_way_imports(part):
    for module in _files(part):
        for name in imports(module):
            parts = name.split(".")
            if parts[0] == "nlp_bench" and len(parts) > 1:
                assert parts[1] not in FORBIDDEN[part], f"{module.relative_to(PKG)} imports {name}"


@pytest.mark.parametrize("part", TORCH_FREE)
def test_torch_free_parts(part):
    for module in _files(part):
        assert not any(n.split(".")[0] in ("torch", "triton") for n in imports(module)), module


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each a circle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    """A package's __init__ that re-exports its own modules is not a circle: only module-to-module edges
    count, a package's __init__ standing for the package itself only where nothing more precise is named."""
    graph = {m: {n for n in imports(p) if n in MODULES and n != m and not m.startswith(n + ".")}
             for m, p in MODULES.items()}
    assert circles(graph) == []


def test_no_two_modules_share_a_name():
    """One meaning per name: a module's file name says what it is wherever it sits (a process grid is not
    a sweep grid)."""
    names = [m.rsplit(".", 1)[-1] for m, p in MODULES.items() if p.stem not in ("__init__", "__main__")]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


#: the run store's records: only nlp_bench.store opens them
_RECORDS = ("run.json", "point.json", "state.json", "result.json", "prediction.json")
_RECORD_CONSTANTS = {"RUN_JSON", "POINT_JSON", "STATE_JSON", "RESULT_JSON", "PREDICTION_JSON"}


def record_uses(path: Path) -> list[str]:
    """Where a module names a store record as a path: a string that is the file name (or ends in /name, as in
    an f-string's path), or an import of the store's constant for it. Messages that mention a record in
    prose ("figures come from result.json") are not paths and do not count."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if any(node.value == name or node.value.endswith("/" + name) for name in _RECORDS):
                found.append(f"line {node.lineno}: {node.value!r}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("nlp_bench"):
            found += [f"line {node.lineno}: imports {a.name}" for a in node.names if a.name in _RECORD_CONSTANTS]
    return found


def test_record_uses_are_found(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('from nlp_bench.store.names import STATE_JSON\nopen(folder / "point.json")\n'
                      'path = f"{run}/result.json"\nsay("figures come from result.json")\n')
    assert sorted(record_uses(module)) == ["line 1: imports STATE_JSON", "line 2: 'point.json'", "line 3: '/result.json'"]


def test_only_the_store_opens_its_records():
    outside = {str(p.relative_to(PKG)): record_uses(p) for m, p in MODULES.items()
               if not m.startswith("nlp_bench.store")}
    assert {k: v for k, v in outside.items() if v} == {}


def test_no_two_modules_define_a_class_or_constant_of_the_same_name():
    """One meaning per name: a class (`Checked`) or a public constant (`COLUMNS`, `FORMATS`) means one thing
    wherever it is imported from."""
    defined: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            names = []
            if isinstance(node, ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Try):  # a class defined one way or another (yamlio's loader)
                names = [n.name for block in (node.body, *(h.body for h in node.handlers)) for n in block
                         if isinstance(n, ast.ClassDef)]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper() and t.id[0] != "_"]
            for name in names:
                defined.setdefault(name, set()).add(module)
    assert {name: sorted(mods) for name, mods in defined.items() if len(mods) > 1} == {}


def public_functions(path: Path) -> list[str]:
    """The public functions a module defines at its top level, those under an `if` or `try` there too (a
    function defined one way or another); methods and nested functions are not the module's names."""
    found = []
    blocks = [ast.parse(path.read_text()).body]
    while blocks:
        for node in blocks.pop():
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                found.append(node.name)
            elif isinstance(node, (ast.If, ast.Try)):
                blocks += [node.body, node.orelse, *(h.body for h in getattr(node, "handlers", ())),
                           getattr(node, "finalbody", [])]
    return sorted(found)


def entry_points() -> set[str]:
    """The modules that run as a program: a script's own `if __name__ == "__main__"`, or the module a
    package's __main__.py takes `main` from (`python -m nlp_bench.train`, and `bench` through nlp_bench.cli)."""
    found = set()
    for module, path in MODULES.items():
        body = ast.parse(path.read_text()).body
        if path.stem == "__main__":
            found |= {n.module for n in body if isinstance(n, ast.ImportFrom) and "main" in {a.name for a in n.names}}
        elif any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in body):
            found.add(module)
    return found


def test_public_functions_and_entry_points_are_found(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def run(): pass\ndef _helper(): pass\nclass C:\n    def method(self): pass\n"
                      "try:\n    def fast(): pass\nexcept ImportError:\n    def slow(): pass\n"
                      "if True:\n    def either(): pass\nelse:\n    def other(): pass\n"
                      "def outer():\n    def inner(): pass\n")
    assert public_functions(module) == ["either", "fast", "other", "outer", "run", "slow"]
    assert entry_points() == {"nlp_bench.cli.root", "nlp_bench.train.trainer", "nlp_bench.megatron_own_parser"}


def test_no_two_modules_define_a_public_function_of_the_same_name():
    """One meaning per name: `say` or `format_cell` does one thing wherever it is imported from, and a
    caller that reads `load(...)` need not look up which module's load it is. The one exception is `main`,
    what a program's entry point is called, in the modules that run as programs and nowhere else (the eager
    and the Triton version of an op are told apart by name too: eager_layer_norm, triton_layer_norm)."""
    defined: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        for name in public_functions(path):
            defined.setdefault(name, set()).add(module)
    mains = defined.pop("main", set())
    assert mains <= entry_points(), f"main outside an entry point: {sorted(mains - entry_points())}"
    shared = {name: sorted(mods) for name, mods in defined.items() if len(mods) > 1}
    assert shared == {}


#: the flags that choose a precision or activation recompute, in Megatron's and argparse's spelling
_PRECISION_FLAGS = {"bf16", "fp16"}
_RECOMPUTE_FLAGS = {"recompute-activations", "recompute-granularity", "recompute_activations", "recompute_granularity"}
#: parallel sizes, in the planner's, the trainer's and Megatron's spelling (and the world they tile)
_PARALLEL = {"tp", "pp", "cp", "dp", "vp", "ep", "etp", "edp", "expert_tp", "world", "chunks", "weight_replicas",
             "tp_cp", "replica", "stage_devices", "virtual_stages",
             "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
             "data_parallel_size", "virtual_pipeline_model_parallel_size", "expert_model_parallel_size",
             "expert_tensor_parallel_size"}


def _word(node: ast.AST) -> str | None:
    """The name an expression reads: a variable, an attribute, or a subscript by a string."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    return None


def derivations(path: Path) -> list[str]:
    """Where a module works out precision or recompute from the flags, or any product or quotient of parallel
    sizes (dp from the world and tp x cp x pp, pp x vp, tp x cp)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        key = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args and isinstance(node.args[0], ast.Constant):
            key = node.args[0].value
        elif isinstance(node, (ast.Attribute, ast.Subscript)):
            key = _word(node)
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) \
                and any(isinstance(op, ast.In) for op in node.ops):
            key = node.left.value
        if key in _PRECISION_FLAGS:
            found.append(f"line {node.lineno}: precision from {key}")
        elif key in _RECOMPUTE_FLAGS:
            found.append(f"line {node.lineno}: recompute from {key}")
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div, ast.FloorDiv, ast.Mod)):
            left, right = _sizes(node.left), _sizes(node.right)
            if left and right:
                found.append(f"line {node.lineno}: {' x '.join(sorted(left | right))} from parallel sizes")
    return sorted(set(found))


def _sizes(node: ast.AST) -> set[str]:
    """The parallel sizes an operand reads: one, or an expression of them (a product, a quotient, a sum:
    `(pp - 1) / vp` and `x / cp * y / tp` count), or a `.get("tp")`."""
    word = _word(node)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
            and node.args and isinstance(node.args[0], ast.Constant):
        word = node.args[0].value
    if word in _PARALLEL:
        return {word}
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div, ast.FloorDiv, ast.Add, ast.Sub)):
        return _sizes(node.left) | _sizes(node.right)
    return set()


def test_derivations_are_found(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('p = "bf16" if train.get("bf16") else "fp32"\nr = args.recompute_granularity\n'
                      'dp = world // (self.tp * self.pp)\nq = ref["nodes"] // (ref["tp"] * ref["pp"])\n'
                      'ok = "--bf16" in text or flags["lr"]\nv = c.layout.pp * c.layout.vp\n'
                      'e = world / (etp * ep * pp)\nn = self.nodes * self.devices_per_node\nb = gbs // (dp * mbs)\n'
                      'u = (w.pp - 1) / w.vp\nr = s / lay.cp * full / lay.tp\ng = d.get("tp") * d.get("pp")\n')
    assert derivations(module) == sorted(["line 1: precision from bf16", "line 2: recompute from recompute_granularity",
                                   "line 3: pp x tp from parallel sizes", "line 3: pp x tp x world from parallel sizes",
                                   "line 4: pp x tp from parallel sizes", "line 6: pp x vp from parallel sizes",
                                   "line 7: ep x etp from parallel sizes", "line 7: ep x etp x pp from parallel sizes",
                                   "line 7: ep x etp x pp x world from parallel sizes",
                                   "line 10: pp x vp from parallel sizes", "line 11: cp x tp from parallel sizes",
                                   "line 12: pp x tp from parallel sizes"])


def test_precision_recompute_and_dp_are_each_worked_out_in_one_place():
    """spec.switches decodes the flags (precision, recompute, ...), spec.layout alone multiplies and divides
    parallel sizes (dp, expert dp, pp x vp, ...): the sweep, the planner, the trainer, the analysis and the
    rules check ask them."""
    homes = {"nlp_bench.spec.switches", "nlp_bench.spec.layout"}
    outside = {m: derivations(p) for m, p in MODULES.items() if m not in homes}
    assert {m: found for m, found in outside.items() if found} == {}
    switches = MODULES["nlp_bench.spec.switches"]
    assert [f for f in derivations(switches) if "parallel sizes" in f] == []


def _field_names(tree: ast.AST) -> dict[str, set[str]]:
    """The annotated fields of each class a module defines (a dataclass's, a NamedTuple's); a field that is a
    tuple of values is an axis of a search (the values to try), not a copy of one."""
    return {node.name: {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                        and not ast.unparse(s.annotation).startswith("tuple[")}
            for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def copied_settings(path: Path) -> list[str]:
    """Classes of a module that copy a field of spec.Switches (a setting) instead of holding the Switches."""
    settings = _field_names(ast.parse(MODULES["nlp_bench.spec.switches"].read_text()))["Switches"]
    return sorted(f"{name}.{field}" for name, own in _field_names(ast.parse(path.read_text())).items()
                  for field in own & settings)


def test_copied_settings_are_found(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("class Plan:\n    layout: object\n    recompute: str = 'none'\n    fp8_param_gather: bool\n"
                      "class Space:\n    sequence_parallel: tuple[bool, ...] = (True, False)\n")
    assert copied_settings(module) == ["Plan.fp8_param_gather", "Plan.recompute"]


def test_the_planner_holds_the_switches_and_copies_none_of_their_fields():
    """A setting is spelt once: a planned point is a Layout plus the Switches, and plan/ copies no field of the
    Switches (adding fp8_param_gather once touched 8 files). What the timing model derives from a setting
    (Work.gather_behind_forward) is its own input, named for what it does there; a renamed copy is what a
    review has to catch."""
    found = {m: copied_settings(p) for m, p in MODULES.items() if m.startswith("nlp_bench.plan.")}
    assert {m: f for m, f in found.items() if f} == {}


#: the longest a function may be: one that must be scrolled to be read is split into named steps
MAX_FUNCTION_LINES = 80
#: the longest a command module may be: the command line parses options and calls the app layer
MAX_COMMAND_MODULE_LINES = 250


def test_no_function_is_longer_than_it_can_be_read_at_once():
    long = [f"{p.relative_to(PKG)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for p in MODULES.values() for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def test_the_command_line_is_thin_modules_of_verbs():
    assert not (PKG / "cli.py").exists(), "the command line is the package nlp_bench.cli"
    sizes = {p.name: len(p.read_text().splitlines()) for p in (PKG / "cli").glob("*.py")}
    assert sizes and {name: n for name, n in sizes.items() if n > MAX_COMMAND_MODULE_LINES} == {}


#: the documents: the README and every page of docs/
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
#: the longest the README may be: what it is, the fresh-machine commands, a first run, the verbs, links to docs/
MAX_README_LINES = 300
#: the kinds of file a document may name in backticks and is held to
_NAMED = (".py", ".md", ".yaml", ".yml", ".sh", ".j2", ".tsv", ".csv", ".json", ".sbatch", ".toml", "/")


def readme_paths(text: str) -> list[str]:
    """The files and folders a document names in backticks: `tests/x.py`, `plan/timing.py`, `store/`,
    `views.py`, `planner-corpus.yaml` (a bare name stands for a file wherever it lies in the repository, so a
    file that moves keeps its name valid)."""
    ends = "|".join(re.escape(e) for e in _NAMED)
    return sorted({m for m in re.findall(rf"`([\w./-]+(?:{ends}))`", text) if not m.startswith(("http", "."))})


@functools.cache
def _run_files() -> frozenset[str]:
    """The names of a run's files and folders (store.names): documents name them, no checkout holds them."""
    from nlp_bench.store import names

    found = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
    return frozenset(found | {f"{v}/" for v in found})


#: names the documents use that are no paths of this repository
_NOT_OURS = {"pretrain_gpt.py": "Megatron-LM's entry point", "plots/": "an output folder of an example",
             "results/plan/calibration.json": "written by `bench plan calibrate`",
             "results/plan/corpus-validation.json": "written by `bench plan validate`",
             "profile_rank<R>.json": "written by the trainer's profiler", "tokenizer.json": "a site's tokenizer",
             "config.json": "a Hugging Face model's configuration"}


@functools.cache
def _tracked() -> tuple[Path, ...]:
    """The repository's tracked files (git ls-files), or, outside a git checkout, every file but the
    virtual environments, caches and run output."""
    import subprocess

    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False)
    if listed.returncode == 0 and listed.stdout:
        return tuple(ROOT / n for n in listed.stdout.decode().split("\0") if n and (ROOT / n).is_file())
    skip = (".git", ".venv", ".venv-xla", "__pycache__", ".pytest_cache", "results", "build", "dist")
    return tuple(p for p in ROOT.rglob("*") if p.is_file() and not set(p.relative_to(ROOT).parts[:-1]) & set(skip)
                 and not p.name.endswith(".pyc"))


def _exists(name: str) -> bool:
    bases = (ROOT, PKG, PKG.parent, ROOT / "tests", ROOT / "benchmark", ROOT / "benchmark" / "perf", ROOT / "slurm")
    if name in _NOT_OURS or name in _run_files() or any((base / name).exists() for base in bases):
        return True
    bare = name.rstrip("/")
    if "/" in bare:
        return False
    return any(p.name == bare or bare in p.relative_to(ROOT).parts[:-1] for p in _tracked())


#: how a document's link is written: [text](target), the target a path relative to the document
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """The anchor GitHub makes of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(document: Path) -> list[str]:
    """The links of a document whose file, or whose heading within it, is not there."""
    broken = []
    for target in _LINK.findall(document.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        path = (document.parent / file).resolve() if file else document
        if file and (not path.is_file() or ROOT not in path.parents):
            broken.append(target)
        elif anchor and anchor not in {_anchor(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)}:
            broken.append(target)
    return broken


def test_the_readme_is_short_and_the_map_is_in_the_design():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= MAX_README_LINES, "the README says what it is and links to docs/ for the rest"
    assert "## The map" not in text and "## The map" in (ROOT / "docs" / "design.md").read_text(), \
        "the internals live in docs/design.md, the README walks a user through the tool"
    assert {"design.md", "planner.md"} <= {p.name for p in DOCUMENTS}


def test_every_path_the_readme_names_exists():
    """The README and every page of docs/: each path named in backticks, and each link, with its heading."""
    names = readme_paths((ROOT / "docs" / "design.md").read_text())
    assert "train/trainer.py" in names or "trainer.py" in names
    missing = {doc.name: [n for n in readme_paths(doc.read_text()) if not _exists(n)] for doc in DOCUMENTS}
    assert {doc: found for doc, found in missing.items() if found} == {}
    assert {doc.name: broken_links(doc) for doc in DOCUMENTS if broken_links(doc)} == {}


def test_paths_and_links_that_are_not_there_are_found(tmp_path):
    assert readme_paths("see `plan/timing.py`, `store/`, `planner-corpus.yaml` and `bench run`") == [
        "plan/timing.py", "planner-corpus.yaml", "store/"]
    assert _exists("plan/timing.py") and _exists("planner-corpus.yaml") and _exists("result.json")
    assert not _exists("plan/no_such_module.py") and not _exists("no-such-file.yaml")
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text("# A page\n\n## Its part\n\n[here](#its-part) [gone](#no-part) [away](other.md)\n")
    assert broken_links(page) == ["#no-part", "other.md"]
    assert _anchor("`bench plan --json`") == "bench-plan---json"


#: what points at a file outside the repository: the folder shared beside the checkout, the machine's workspace
#: root, the design document and the notes and seeds kept there (the workspace root spelt in two pieces, so
#: that this line is not one of its own finds)
_OUTSIDE = re.compile(r"\.\./shared|(?:^|[\s\"'(])/" + r"work/|DESIGN\.md|shared/(?:notes|seeds|data)|"
                      r"\bformats\.md|\bnotes/\w|\bseeds?/\d|\bseeds? \d{3}")


def outside_references(path: Path) -> list[str]:
    """The lines of a file that refer to a file outside the repository."""
    try:
        text = path.read_text()
    except (UnicodeDecodeError, OSError):
        return []
    return [f"line {n}: {line.strip()[:100]}" for n, line in enumerate(text.splitlines(), 1) if _OUTSIDE.search(line)]


def test_outside_references_are_found(tmp_path):
    sample = tmp_path / "m.py"
    shared = ".." + "/shared"
    sample.write_text(f'"""As {"DESIGN"}.md says."""\n# see {shared}/megatron-lm/\nx = 1  # seed {"003"}\n'
                      f'# peak from {"formats"}.md\nroot = "/{"work"}/shared"\n'
                      '# docs/design.md, the shared memory of a GPU, a JUBE step\'s _execute/work/ folder\n')
    assert [f.split(":")[0] for f in outside_references(sample)] == ["line 1", "line 2", "line 3", "line 4", "line 5"]


def test_no_tracked_file_refers_to_a_path_outside_the_repository():
    """Everything a reader needs is in the repository: the design is docs/design.md, the planner's model
    docs/planner.md; a fact from elsewhere is stated where it is used, with its public source. CI's entry
    point is the one file that states where CI puts what the repository cannot hold (Megatron-LM's source,
    which the tests read through MEGATRON_LM_ARCHIVES), and no other file names that place."""
    found = {str(p.relative_to(ROOT)): outside_references(p) for p in _tracked() if p != ROOT / ".ci" / "run"}
    assert {name: lines for name, lines in found.items() if lines} == {}


def design_layers(text: str) -> dict[str, set[str]]:
    """The table of docs/design.md's "The layers": part -> the parts it must never import, where "any other
    part" and "any part but `x`" stand for the parts the FORBIDDEN table knows (api among them)."""
    every = set(FORBIDDEN) | {n for v in FORBIDDEN.values() for n in v}
    table = {}
    for part, never in re.findall(r"^\| `(\w+)` \| [^|]+ \| ([^|]+) \|$", text, re.M):
        never = never.strip()
        if never == "any other part":
            table[part] = every - {part}
        elif never.startswith("any part but"):
            table[part] = every - {part} - set(re.findall(r"`(\w+)`", never))
        else:
            table[part] = {n.strip() for n in never.split(",")}
    return table


def test_the_design_document_states_the_layers_as_they_are_checked():
    text = (ROOT / "docs" / "design.md").read_text()
    assert design_layers(text) == FORBIDDEN
