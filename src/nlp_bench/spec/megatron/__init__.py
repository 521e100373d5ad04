"""What nlp-bench knows of Megatron-LM as a trainer: which version a checkout is, the flags each version's
own parser defines (tables generated from Megatron-LM itself), and how a reference flag is spelled in a
later version that removed or renamed it."""
