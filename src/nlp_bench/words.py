"""Counts in prose: "1 node", "2 nodes", never "1 nodes" or "node(s)"."""

from __future__ import annotations


def counted(count: int, noun: str) -> str:
    """The count and its noun, the noun plural unless the count is one (the nouns said are regular)."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"
