"""Registries of named parts: the executors, the launchers and the log formats bench can use, each found by
the name a system profile, a point's state.json or `bench parse --format` gives.

Why a registry: a new executor, launcher or log format is then one added module whose class registers itself
where it is defined; no whitelist in the profile check, no table in the parser and no `if name == "slurm"` in
the doctor has to learn its name, since all of them ask the registry.

Why the registry finds its parts by walking its package: an explicit list of modules would be one more table to
edit. Each registry is made by the layer that owns its parts and names that layer's own package, so the walk
imports sideways within the layer, never up (the arrows of tests/test_boundaries.py stay one-way). Python entry
points would do the same across distributions, but need the package's metadata reinstalled for every new part,
which an editable install does not see; bench's parts all ship inside it.

Why spec does not check a profile's executor and launcher names: spec may not import launch, where those parts
live, and a registry of names kept below spec would only know the names once launch had been imported
elsewhere. spec checks that each is a name; launch (`executor_for`, `launcher_for`) refuses a name no part
answers to, naming the profile file and the known names, before a jobscript is rendered or a job submitted.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from nlp_bench.errors import BenchError, unknown

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    item: T
    #: the order `names` lists it in, lowest first (the order log formats are tried in), then by name
    rank: int = 0


class Registry(Generic[T]):
    """Named parts of one kind, filled as the modules of `package` are imported; the first question walks the
    package so that every part has registered before an answer is given."""

    def __init__(self, kind: str, package: str, error: type[BenchError]) -> None:
        self.kind = kind
        self.package = package
        self.error = error
        self.entries: dict[str, Entry[T]] = {}
        #: other names a part answers to -> its registered name
        self.aliases: dict[str, str] = {}
        self._walked = False

    def add(self, name: str, item: T, rank: int = 0, aliases: Iterable[str] = ()) -> T:
        """Register `item` under `name` (and its aliases); a name taken by another part is a programming error."""
        for word in (name, *aliases):
            taken = self.entries.get(self.aliases.get(word, word))
            if taken is not None and taken.item is not item:
                raise ValueError(f"{self.kind} {word!r} is registered twice")
        self.entries[name] = Entry(item, rank)
        self.aliases.update(dict.fromkeys(aliases, name))
        return item

    def register(self, name: str, rank: int = 0, aliases: Iterable[str] = ()) -> Callable[[T], T]:
        """Decorator form of `add`."""
        return lambda item: self.add(name, item, rank, tuple(aliases))

    def _walk(self) -> None:
        if not self._walked:
            package = importlib.import_module(self.package)
            for module in pkgutil.iter_modules(package.__path__):
                importlib.import_module(f"{self.package}.{module.name}")
            self._walked = True

    def names(self) -> list[str]:
        """The registered names, by rank then name."""
        self._walk()
        return sorted(self.entries, key=lambda name: (self.entries[name].rank, name))

    def known(self) -> list[str]:
        """Every name a part answers to: the registered names, then the aliases."""
        return self.names() + sorted(self.aliases)

    def resolve(self, name: str, where: str = "") -> str:
        """The registered name `name` stands for; an unknown one is one line, after `where` (a file) if given."""
        self._walk()
        if name in self.entries:
            return name
        if name in self.aliases:
            return self.aliases[name]
        said = unknown(self.kind, name, self.known())
        raise self.error(f"{where}: {said}" if where else said)

    def get(self, name: str, where: str = "") -> T:
        """The part registered under `name` (or an alias of it); see `resolve` for an unknown name."""
        return self.entries[self.resolve(name, where)].item
