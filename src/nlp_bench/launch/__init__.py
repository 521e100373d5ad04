"""Rendering jobscripts and running them: executors behind one interface, one job-state vocabulary."""
