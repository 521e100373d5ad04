"""`python -m nlp_bench.cli`: the same as `bench`."""

from nlp_bench.cli.root import main

main()
