"""Training data without torch: Megatron's indexed dataset files, the GPT-2 tokenizer, preprocessing,
and the GPT sample index."""
