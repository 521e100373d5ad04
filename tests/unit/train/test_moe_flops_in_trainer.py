"""The trainer counts the FLOPs of the MoE model its flags describe (the routed top-k experts and the shared
ones), not those of the dense model the same flags would give without experts: its log's TFLOP/s and MFU are
Megatron-LM's model FLOPs of the model it trains."""

import dataclasses

from nlp_bench import flops
from nlp_bench.train.args import build_parser
from nlp_bench.train.config import build_config

FLAGS = ["--lr", "1e-3", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
         "--ffn-hidden-size", "64", "--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear",
         "--seq-length", "16", "--train-iters", "3", "--mock-data", "--vocab-size", "200", "--global-batch-size", "4",
         "--micro-batch-size", "2"]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32",
       "--moe-shared-expert-intermediate-size", "16"]


def _spec(argv):
    return build_config(build_parser().parse_args(argv), 1).spec


def test_the_trainer_counts_the_experts_it_routes_to():
    moe = _spec([*FLAGS, *MOE])
    assert (moe.moe.num_experts, moe.moe.router_topk, moe.moe.ffn_hidden_size) == (4, 2, 32)
    counted = flops.megatron_model_flops(moe.flops_shape(4, 200))
    assert counted != flops.megatron_model_flops(dataclasses.replace(moe, moe=None).flops_shape(4, 200))
    # a token passes 2 experts of 32 columns and the shared one of 16: Megatron-LM counts that as a dense SwiGLU
    # MLP of 80 columns (the router's own GEMM it does not count)
    wider = dataclasses.replace(moe, moe=None, ffn_hidden_size=2 * 32 + 16)
    assert counted == flops.megatron_model_flops(wider.flops_shape(4, 200))
    assert flops.log_convention(moe.flops_shape(4, 200)) == flops.MEGATRON_MODEL
