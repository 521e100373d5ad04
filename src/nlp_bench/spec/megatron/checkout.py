"""A Megatron-LM checkout as a point will run it: its version (megatron/core/package_info.py, read as text,
never imported) and, where it is a git repository, its commit."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from nlp_bench.errors import SpecError

PACKAGE_INFO = Path("megatron") / "core" / "package_info.py"
_FIELD = re.compile(r"^(MAJOR|MINOR|PATCH|PRE_RELEASE)\s*=\s*(?:'([^']*)'|\"([^\"]*)\"|(\d+))", re.MULTILINE)


@dataclass(frozen=True)
class Checkout:
    path: Path
    version: str
    #: the full commit hash, or None where the checkout is not a git repository (an unpacked release)
    commit: str | None
    #: tracked files differ from the commit (a patch applied, as the reference applies its own)
    modified: bool = False

    @property
    def parsed_version(self) -> Version:
        return Version(self.version)

    @property
    def label(self) -> str:
        if not self.commit:
            return f"Megatron-LM {self.version} (commit unknown: not a git checkout)"
        return f"Megatron-LM {self.version} ({self.commit[:10]}{', with local changes' if self.modified else ''})"

    def contains(self, commit: str) -> bool | None:
        """Whether `commit` is in this checkout's history; None where git cannot say (no repository, a
        shallow clone, a commit it does not have)."""
        if not self.commit:
            return None
        try:
            done = subprocess.run(["git", "-C", str(self.path), "merge-base", "--is-ancestor", commit, "HEAD"],
                                  capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return {0: True, 1: False}.get(done.returncode)

    def to_dict(self) -> dict[str, str | None]:
        return {"repo": str(self.path), "version": self.version, "commit": self.commit, "modified": self.modified}


def read_version(repo: Path) -> str:
    path = repo / PACKAGE_INFO
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise SpecError(f"cannot read Megatron-LM's version: {path}: {exc.strerror or exc}") from None
    fields = {m[1]: m[2] or m[3] or m[4] or "" for m in _FIELD.finditer(text)}
    if not {"MAJOR", "MINOR", "PATCH"} <= set(fields):
        raise SpecError(f"{path}: no MAJOR, MINOR and PATCH: not Megatron-LM's package_info")
    text = f"{fields['MAJOR']}.{fields['MINOR']}.{fields['PATCH']}{fields.get('PRE_RELEASE', '')}"
    try:
        Version(text)
    except InvalidVersion:
        raise SpecError(f"{path}: version {text!r} is not a version number") from None
    return text  # as written (the jobscript compares it with what it reads from the same file)


def _git(repo: Path, *args: str) -> str | None:
    """git's answer in `repo`, or None where it has none (no git, not a repository, a hung file system)."""
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def read_commit(repo: Path) -> str | None:
    commit, top = _git(repo, "rev-parse", "--verify", "HEAD"), _git(repo, "rev-parse", "--show-toplevel")
    # a Megatron-LM folder inside some other repository is not that repository's commit
    return commit if commit and top and Path(top).resolve() == repo.resolve() else None


def read_modified(repo: Path) -> bool:
    return bool(_git(repo, "status", "--porcelain", "--untracked-files=no"))


def read_checkout(repo: Path) -> Checkout:
    commit = read_commit(repo)
    return Checkout(repo, read_version(repo), commit, commit is not None and read_modified(repo))
