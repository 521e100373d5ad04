"""nlp-bench: benchmark Megatron-style GPT training on HPC clusters.

The top-level package stays import-light: the CLI imports it on every start-up.
"""

__version__ = "0.1.0"
