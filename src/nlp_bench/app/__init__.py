"""Application glue: the commands that join the layers (run and sweep, planning) above them."""
