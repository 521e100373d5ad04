"""Entry point: `torchrun ... -m nlp_bench.train <Megatron-style flags>`."""

import sys

from nlp_bench.train.trainer import main

sys.exit(main())
