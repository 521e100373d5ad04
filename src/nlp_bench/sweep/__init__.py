"""Which points to run, and the run workspace on disk."""
