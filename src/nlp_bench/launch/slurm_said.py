"""What Slurm's commands say when they fail, as bench repeats it: one line, and whether it means that Slurm
could not authenticate the request (munge down, a key that differs from the controller's). A command's
stderr runs to several lines (scancel writes four for one job whose credential munge could not make), and a
message bench prints is one line."""

from __future__ import annotations

import re

#: what Slurm's clients write in front of their complaints
_PREFIX = re.compile(r"^\s*(?:[\w.-]+: )?(?:error|fatal): ")
#: a hint Slurm adds to every munge failure, which says nothing of this one
_HINT = "If munged is up, restart with --num-threads="
#: Slurm's words for a request it could not authenticate (the client's credential, or the controller's check)
_AUTHENTICATION = re.compile(r"Protocol authentication error|authentication error|Munge (?:en|de)code failed|"
                             r"Invalid authentication credential|auth_g_(?:create|verify)", re.I)
#: the credential was never made, so the request never left this machine: Slurm cannot have acted on it
_NOT_SENT = re.compile(r"Munge encode failed|auth_g_create", re.I)
_MUNGE = re.compile(r"Munge (?:en|de)code failed: .*", re.I)

#: how much of a complaint a message repeats
LIMIT = 400


def one_line(text: str, limit: int = LIMIT) -> str:
    """A command's complaint as one line: each line once, in order, without the `tool: error: ` in front,
    joined by "; " and cut at `limit` characters."""
    said = []
    for line in text.splitlines():
        line = _PREFIX.sub("", line).strip()
        if line and line not in said and not line.startswith(_HINT):
            said.append(line)
    joined = "; ".join(said)
    return joined if len(joined) <= limit else joined[:limit - 1] + "…"


def unauthenticated(text: str) -> str | None:
    """Why Slurm could not authenticate the request, in one line (munge's own words where it gave them);
    None where the command failed for another reason."""
    if not _AUTHENTICATION.search(text):
        return None
    munge = _MUNGE.search(text)
    return f"authentication failed ({munge.group(0).strip() if munge else 'Protocol authentication error'})"


def never_sent(text: str) -> bool:
    """Whether the failed request never reached Slurm (its credential could not be made): then nothing it
    asked for (a job submitted, a job cancelled) can have happened."""
    return bool(_NOT_SENT.search(text))
