"""The Megatron-style parallel GPT trainer (`python -m nlp_bench.train`, launched by torchrun)."""
