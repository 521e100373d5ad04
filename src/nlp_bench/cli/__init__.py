"""The `bench` command line (cli.root), one module per group of verbs."""

from nlp_bench.cli.root import cli, main

__all__ = ["cli", "main"]
