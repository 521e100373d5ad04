"""The run store: the run folders on disk (docs/design.md, "The run store on disk") and the only code that opens their
records (run.json, point.json, state.json, result.json, prediction.json).

It sits at the bottom of the layers: every layer reads and writes runs through it, and it imports none
of them. It owns the file names (names), the job-state vocabulary (states), the line a jobscript ends
with (protocol), typed records that are validated on every read (records), atomic writes and one-line
errors for a damaged file (files), locks (locks), and the runs and points themselves (runs, points).
"""
