"""Which points a sweep runs: grid files and the expressions in them."""
