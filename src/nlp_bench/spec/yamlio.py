"""Loading the project's YAML files with errors a user can act on.

Every YAML file the project reads (benchmark definitions, system profiles, grids, rules, the planner
corpus) goes through load_yaml, so the guards below hold everywhere: a file that is not a readable
regular file or not UTF-8 text, a key given twice in one mapping (PyYAML keeps the last one silently), aliases
that expand a small file into gigabytes ("billion laughs"), and nesting deep enough to crash a recursive
parser are each one SpecError line naming the file and, where there is one, the line.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from nlp_bench.errors import SpecError, did_you_mean

#: larger than any file the project ships by three orders of magnitude; reading stops here, so a wrong
#: path (a disk image, a log) is refused without reading it into memory
MAX_FILE_BYTES = 16 * 2**20
#: how much aliases may add to a document (nodes plus scalar characters, counted as if each alias were
#: written out), as a multiple of the file's characters: anchors shared within a file (benchmark/nlp.yaml's `<<: *jupiter`) stay far below it, an
#: alias bomb of a few hundred bytes exceeds it within its first levels
EXPANSION_FACTOR = 100
#: the expansion a small file may always reach, so a tiny file may still alias a block a few times
MIN_EXPANSION = 10_000
#: deeper than any real file; well inside Python's recursion limit, and libyaml's own composer (not used
#: here) crashes the interpreter on some tens of thousands of nested brackets
MAX_DEPTH = 100

_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"


def _guarded(construct: Callable[[SafeConstructor, Node], Any]) -> Callable[[SafeConstructor, Node], Any]:
    """A scalar constructor whose failures on a value that does not fit its tag (`!!int abc`, a 5,000-digit
    integer, `!!timestamp soon`) are ConstructorErrors with the value's mark; PyYAML lets them escape as
    ValueError, KeyError, AttributeError... which would reach the user as a traceback."""

    def guarded(loader: SafeConstructor, node: Node) -> Any:
        try:
            return construct(loader, node)
        except (ValueError, TypeError, AttributeError, IndexError, KeyError, OverflowError):
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            value = node.value if len(node.value) <= 40 else f"{node.value[:40]}..."
            raise ConstructorError(None, None, f"cannot read {value!r} as {tag}", node.start_mark) from None

    return guarded


class _Checked(Composer, SafeConstructor, Resolver):
    """PyYAML's composer and safe constructor with the checks this module promises.

    The checks live in the composer because only there are the aliases still visible with their marks
    (the composed graph shares a node wherever an alias stood) and every mapping's keys are still as
    written (the constructor's merge-key handling rewrites them). The events still come from libyaml when
    PyYAML has it; composing in Python costs a fraction of a millisecond more per file."""

    def __init__(self, path: Path, text: str) -> None:
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._path = path
        self._limit = max(MIN_EXPANSION, EXPANSION_FACTOR * len(text))
        #: nodes plus scalar characters that aliases have added to the document so far
        self._aliased = 0
        #: the same measure for each node under an aliased one, so a node aliased again costs nothing
        self._sizes: dict[int, int] = {}
        self._depth = 0

    def _fail(self, event: Any, message: str) -> SpecError:
        return SpecError(f"{self._path} line {event.start_mark.line + 1}: {message}")

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        if event.__class__ is AliasEvent:
            node = self.anchors.get(event.anchor)
            if node is not None:  # an undefined alias is the composer's own error
                if node.end_mark is None:  # the composer closes a collection's node at its end
                    raise self._fail(event, f"the alias *{event.anchor} stands inside the node it names "
                                            f"(a recursive document)")
                self._aliased += self._size(node)
                if self._aliased > self._limit:
                    raise self._fail(event, f"the alias *{event.anchor} expands the document past "
                                            f"{EXPANSION_FACTOR} times its own size (an alias bomb?); write "
                                            f"the values out or alias less")
        return super().compose_node(parent, index)

    def _size(self, node: Node) -> int:
        """Nodes plus scalar characters `node` stands for, a node shared inside it counted wherever it is."""
        sizes = self._sizes
        todo: list[tuple[Node, bool]] = [(node, False)]
        while todo:
            current, children_done = todo.pop()
            if id(current) in sizes:
                continue
            if isinstance(current, ScalarNode):
                sizes[id(current)] = 1 + len(current.value)
                continue
            children = current.value if isinstance(current, SequenceNode) else [n for kv in current.value for n in kv]
            if children_done:
                sizes[id(current)] = 1 + sum(sizes[id(child)] for child in children)
            else:
                todo.append((current, True))
                todo.extend((child, False) for child in children)
        return sizes[id(node)]

    def _enter(self) -> None:
        if self._depth == MAX_DEPTH:
            raise self._fail(self.peek_event(), f"nested more than {MAX_DEPTH} levels deep")
        self._depth += 1

    def compose_sequence_node(self, anchor: str | None) -> SequenceNode:
        self._enter()
        node = super().compose_sequence_node(anchor)
        self._depth -= 1
        return node

    def compose_mapping_node(self, anchor: str | None) -> MappingNode:
        self._enter()
        node = super().compose_mapping_node(anchor)
        self._depth -= 1
        seen: dict[Any, ScalarNode] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode):
                continue  # a collection as a key: the constructor refuses it as unhashable
            tag = key_node.tag
            key = key_node.value if tag == _STR_TAG else ("<<",) if tag == _MERGE_TAG else self.construct_object(key_node)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:
                continue
            if first is not key_node:
                lines = first.start_mark.line + 1, key_node.start_mark.line + 1
                where = f"lines {lines[0]} and {lines[1]}" if lines[0] != lines[1] else f"both on line {lines[0]}"
                raise SpecError(f"{self._path}: key {key_node.value!r} appears twice ({where})")
        return node


for _tag in ("null", "bool", "int", "float", "binary", "timestamp"):
    _tag = f"tag:yaml.org,2002:{_tag}"
    _Checked.add_constructor(_tag, _guarded(SafeConstructor.yaml_constructors[_tag]))


try:
    from yaml.cyaml import CParser

    class _Loader(_Checked, CParser):
        """libyaml's scanner and parser (several times faster than PyYAML's) under the checked composer."""

        def __init__(self, path: Path, text: str) -> None:
            CParser.__init__(self, text)
            _Checked.__init__(self, path, text)

except ImportError:  # PyYAML built without libyaml: its own parser, the same checks
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Loader(_Checked, Reader, Scanner, Parser):  # type: ignore[no-redef]
        def __init__(self, path: Path, text: str) -> None:
            Reader.__init__(self, text)
            Scanner.__init__(self)
            Parser.__init__(self)
            _Checked.__init__(self, path, text)


def _nonblocking(path: str, flags: int) -> int:
    """Open without waiting: a FIFO given as a file would otherwise block until something writes to it."""
    return os.open(path, flags | getattr(os, "O_NONBLOCK", 0))


def _read(path: Path, what: str) -> str:
    try:
        with open(path, "rb", opener=_nonblocking) as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise SpecError(f"{path}: not a regular file, so not a {what} file")
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(f"{what} file not found: {path}") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the {what} file: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise SpecError(f"{path}: more than {MAX_FILE_BYTES // 2**20} MiB, too large for a {what} file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise SpecError(f"{path} line {line}: not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} "
                        f"(save the file as UTF-8)") from None


def load_yaml(path: Path, what: str) -> dict[str, Any]:
    """A YAML mapping from `path`, or one SpecError line naming the file and the fault."""
    loader = _Loader(path, _read(path, what))
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{path}{where}: invalid YAML: {problem}") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def check_keys(data: dict[str, Any], allowed: set[str], where: str) -> None:
    """Refuse unknown keys, with a did-you-mean: a typo must not silently drop a setting."""
    for key in data:
        if key not in allowed:
            raise SpecError(f"{where}: unknown key {key!r}{did_you_mean(str(key), allowed)}")
