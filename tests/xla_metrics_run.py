"""Run the trainer as `python -m nlp_bench.train` does, then write torch-xla's own metrics (read here, apart
from the trainer's counting) and the device generator's seed as setup left it to $NLP_BENCH_TEST_METRICS as
JSON: the tests marked `xla` check the trainer's claims against them."""

from __future__ import annotations

import json
import os
import sys

import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met

from nlp_bench.train.args import parse_args
from nlp_bench.train.config import build_config
from nlp_bench.train.trainer import setup

if __name__ == "__main__":
    trainer = setup(build_config(parse_args(sys.argv[1:]), int(os.environ.get("WORLD_SIZE", "1"))))
    seed = xm.get_rng_state(trainer.device)
    code = trainer.fit()

    transfers = met.metric_data("TransferFromDeviceTime")
    # the counters bumped when a graph is launched or compiled (a graph's ExecuteTime sample lands when it ends)
    found = {"executions": met.counter_value("ExecuteComputation"), "compiles": met.counter_value("UncachedCompile"),
             "transfers": transfers[0] if transfers else 0, "device_seed_after_setup": seed,
             "counters": {name: met.counter_value(name) for name in met.counter_names()}}
    with open(os.environ["NLP_BENCH_TEST_METRICS"], "w") as fh:
        json.dump(found, fh)
    sys.exit(code)
