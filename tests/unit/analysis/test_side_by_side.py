"""benchmark/perf/gpu_side_by_side.py's functions called in-process: a failed worker is named by its own
exception, and every size is the same model in each peer."""

from side_by_side_script import side_by_side


def test_a_failed_worker_is_named_by_its_exception_not_by_a_warning_printed_at_exit():
    """On the H100 every megatron-core failure was reported as NCCL's exit warning (the last line of stderr),
    which hid the error (a dtype mismatch) until a second device call."""
    why = side_by_side()._why
    stderr = ("[rank0]: Traceback (most recent call last):\n[rank0]:   File \"x.py\", line 3, in <module>\n"
              "[rank0]: RuntimeError: expected mat1 and mat2 to have the same dtype\n"
              "[rank0]:[W1126 16:00:41.42 ProcessGroupNCCL.cpp:1575] Warning: WARNING: destroy_process_group() was "
              "not called before program exit\n")
    assert why(stderr) == "RuntimeError: expected mat1 and mat2 to have the same dtype"
    assert why("torch.OutOfMemoryError: CUDA out of memory.\nsome note\n") == "torch.OutOfMemoryError: CUDA out of memory."
    assert why("the plain GPT has no SwiGLU\n") == "the plain GPT has no SwiGLU"

def test_every_size_is_the_model_its_peers_build():
    sizes = side_by_side().SIZES
    llama, mbs, gbs, _ = sizes["llama3-8b-4l"]
    assert (llama.num_layers, llama.hidden_size, llama.num_query_groups, llama.ffn_hidden_size, llama.seq_length,
            llama.vocab_size, llama.untie_embeddings) == (4, 4096, 8, 14336, 8192, 128256, True)
    wide = sizes["4096"][0]
    # Megatron's 18 bytes per parameter (bf16 weights, fp32 gradients, master weights, two moments) fit 80 GB
    assert 18 * wide.parameters(50304) < 60e9
    flags = side_by_side().builtin_flags("llama3-8b-4l", 3, "cuda")
    for flag in ("--group-query-attention", "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights"):
        assert flag in flags
    assert flags[flags.index("--num-query-groups") + 1] == "8" and flags[flags.index("--rotary-base") + 1] == "500000"
