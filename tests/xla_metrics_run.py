"""Run the trainer as `python -m nlp_bench.train` does, then write torch-xla's own metrics (read here, apart
from the trainer's counting) to $NLP_BENCH_TEST_METRICS as JSON: the tests marked `xla` check the trainer's
claims against them."""

from __future__ import annotations

import json
import os
import sys

from nlp_bench.train.trainer import main

if __name__ == "__main__":
    code = main(sys.argv[1:])
    import torch_xla.debug.metrics as met

    def samples(name: str) -> int:
        data = met.metric_data(name)
        return data[0] if data else 0

    found = {"executions": samples("ExecuteTime"), "compiles": samples("CompileTime"),
             "transfers": samples("TransferFromDeviceTime"),
             "counters": {name: met.counter_value(name) for name in met.counter_names()}}
    with open(os.environ["NLP_BENCH_TEST_METRICS"], "w") as fh:
        json.dump(found, fh)
    sys.exit(code)
