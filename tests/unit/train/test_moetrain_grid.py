"""The experts' grid (which ranks hold which experts, spec.layout.expert_grid) and the experts' shares: the
parts of split and spread experts add up to the whole experts, weights drawn as one rank draws them."""

import pytest
import torch

from nlp_bench.spec.layout import expert_grid
from nlp_bench.train.config import GPTConfig, MoEConfig
from nlp_bench.train.moe import GroupedExperts, Share


def test_expert_grid_is_megatron_cores_order():
    """16 ranks, pp 2: each stage's 8 ranks laid out expert tp fastest, then ep, then expert dp."""
    grid = expert_grid(16, pp=2, etp=2, ep=2)
    assert grid["etp"][:4] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid["ep"][:4] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid["tp_ep"][:2] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert grid["edp"][:4] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert grid["ep"][4] == [8, 10]  # the second stage: the same grid shifted by 8


@pytest.mark.parametrize("etp,ep", [(1, 1), (1, 4), (2, 1), (2, 2), (4, 1)])
def test_every_group_family_covers_each_stage_once(etp, ep):
    world, pp = 16, 2
    for name, groups in expert_grid(world, pp, etp, ep).items():
        ranks = sorted(r for g in groups for r in g)
        assert ranks == list(range(world)), name
        assert all(len({r // (world // pp) for r in g}) == 1 for g in groups), name  # within one stage


def _cfg(swiglu: bool, bias: bool) -> tuple[GPTConfig, MoEConfig]:
    moe = MoEConfig(4, 2, 12, (True,), "softmax", 0.0, None, "probs", None)
    return GPTConfig(num_layers=1, hidden_size=8, num_attention_heads=2, ffn_hidden_size=16, seq_length=4,
                     max_position_embeddings=4, vocab_padded=128, num_query_groups=2, swiglu=swiglu,
                     add_bias_linear=bias, moe=moe), moe


@pytest.mark.parametrize("swiglu,bias", [(True, False), (False, True)])
@pytest.mark.parametrize("ep,split", [(2, 1), (1, 2), (1, 3), (4, 2)])
def test_shares_of_the_experts_add_up_to_the_whole_experts(swiglu, bias, ep, split):
    """Expert tp splits fc1 by columns (SwiGLU's gate and up each) and fc2 by rows: the partial outputs of the
    split ranks sum to the whole expert's (the output bias added once); ep ranks hold consecutive experts."""
    cfg, moe = _cfg(swiglu, bias)
    whole = GroupedExperts(cfg, moe, 0, Share(0, 4)).double()
    with torch.no_grad():
        for p in whole.parameters():
            p.normal_()
    groups = torch.randn(4, 5, 8, dtype=torch.float64)
    expected = whole(groups)
    per = 4 // ep
    for e in range(ep):
        parts = []
        for r in range(split):
            share = GroupedExperts(cfg, moe, 0, Share(e * per, per, split, r)).double()
            width = whole.fc1.shape[-1] // (2 if swiglu else 1) // split
            with torch.no_grad():  # the same numbers as the whole experts, cut as the share cuts them
                cols = [whole.fc1[e * per:(e + 1) * per, :, i * 12 + r * width:i * 12 + (r + 1) * width]
                        for i in range(2 if swiglu else 1)]
                share.fc1.copy_(torch.cat(cols, dim=-1))
                share.fc2.copy_(whole.fc2[e * per:(e + 1) * per, r * width:(r + 1) * width])
                if bias:
                    share.bias1.copy_(whole.bias1[e * per:(e + 1) * per, :, r * width:(r + 1) * width])
                    share.bias2.copy_(whole.bias2[e * per:(e + 1) * per])
            parts.append(share(groups[e * per:(e + 1) * per]))
        got = sum(parts) + (share.bias2 if bias and split > 1 else 0)
        assert torch.allclose(got, expected[e * per:(e + 1) * per])


def test_a_share_draws_the_same_weights_as_the_whole_experts():
    """Weights are drawn whole by name and cut: a share's fc1 and fc2 are slices of one rank's."""
    cfg, moe = _cfg(True, False)
    whole, share = GroupedExperts(cfg, moe, 0, Share(0, 4)), GroupedExperts(cfg, moe, 0, Share(2, 2, 2, 1))
    assert torch.equal(share.fc1, torch.cat([whole.fc1[2:, :, 6:12], whole.fc1[2:, :, 18:24]], dim=-1))
    assert torch.equal(share.fc2, whole.fc2[2:, 6:12])
