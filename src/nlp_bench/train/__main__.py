"""Entry point: `torchrun ... -m nlp_bench.train <Megatron-style flags>`."""

import sys

from nlp_bench.train.loop import main

sys.exit(main())
