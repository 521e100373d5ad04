"""The planner: memory per device and time per iteration of a layout, predicted before any node-hour is
spent, ranked over a layout space, and calibrated against measured runs. Torch-free."""
