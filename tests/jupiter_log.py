"""The Jupiter Megatron-LM log of tests/data, the log the parser-limit tests put crafted lines beside, and its
first line: a good record (iteration 10)."""

from conftest import DATA

JUPITER = (DATA / "logs" / "megatron_jupiter.log").read_text()

GOOD = JUPITER.splitlines()[0]  # iteration 10
