"""The Triton kernels against their eager torch references, forward and backward, in-process.

Without a GPU they run under Triton's interpreter (triton_interpreter.py). Shapes are small because each
program instance costs milliseconds there, but include a single row and widths that are not powers
of two (masked lanes), and every dtype the trainer uses.
"""

from __future__ import annotations

import pytest
import torch
from conftest import PERF
from triton_interpreter import KERNEL_MARKS, interpreted

with interpreted():
    pytest.importorskip("triton")
    from nlp_bench.kernels import activations, adam, eager, loss, norm_settings, norms

pytestmark = KERNEL_MARKS

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

DTYPES = [torch.float32, torch.bfloat16, torch.float16]

# (rows..., width): a single row, non-power-of-two widths, a 3-d activation [seq, batch, hidden]
SHAPES = [(1, 7), (3, 100), (2, 3, 257)]

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
       torch.float16: dict(atol=4e-3, rtol=4e-3)}

def _inputs(shape, dtype, *extra_widths, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(DEVICE, dtype).requires_grad_()
    extras = [(1 + 0.5 * torch.randn(w, generator=g)).to(DEVICE, dtype).requires_grad_() for w in extra_widths]
    dy = torch.randn(shape, generator=g).to(DEVICE, dtype)
    return x, extras, dy

def _fp32(*tensors):
    return [None if t is None else t.detach().float().requires_grad_() for t in tensors]

def _check(out, ref, dtype):
    assert out.dtype == dtype and out.shape == ref.shape
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])

def _grads(out, dy, *tensors):
    return torch.autograd.grad(out, [t for t in tensors if t is not None], dy)

@pytest.fixture(params=[8192, 0], ids=["fused-backward", "split-backward"])
def norm_backward(request, monkeypatch):
    """Both backward variants: one kernel with the parameter-gradient sums in registers (rows up to
    8192), and dx and a tiled parameter-gradient kernel apart (wider rows; forced here by a bound of 0)."""
    monkeypatch.setitem(norm_settings.LAUNCH, "fused_backward_max", request.param)

@pytest.fixture(params=[(1, 0, False), (2, 0, False), (4, 0, False), (1, 0, True), (2, 0, True), (1, 4, False)],
                ids=["rows", "2-row-tiles", "4-row-tiles", "rows-prefetched", "2-row-tiles-prefetched", "chunks-of-4"])
def norm_tile(request, monkeypatch):
    """How rows are read, forward and backward: whole, in [rows x width] tiles (the shapes' row counts, 1, 3
    and 6, leave the last tile partly masked), with the next tile loaded ahead (past the last row too), or in
    chunks of 4 columns read twice (widths 7, 100 and 257 end in a partial chunk; the backward is chunked
    where it is split)."""
    rows, chunk, prefetch = request.param
    for phase in ("forward", "backward"):
        monkeypatch.setitem(norm_settings.LAUNCH, f"{phase}_rows", rows)
        monkeypatch.setitem(norm_settings.LAUNCH, f"{phase}_chunk", chunk)
        monkeypatch.setitem(norm_settings.LAUNCH, f"{phase}_prefetch", prefetch)


def _wide_rows_in_wider_chunks(width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 32 columns on the 257-wide rows (still ending in a partial chunk): the interpreter takes
    about a second a chunk loop of a kernel, and 65 chunks of 4 made each of those cases half a minute."""
    if width > 128 and norm_settings.LAUNCH["forward_chunk"]:
        for phase in ("forward", "backward"):
            monkeypatch.setitem(norm_settings.LAUNCH, f"{phase}_chunk", 32)

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("persistent", [True, False])
def test_layer_norm(shape, dtype, persistent, norm_backward, norm_tile, monkeypatch):
    _wide_rows_in_wider_chunks(shape[-1], monkeypatch)
    x, (w, b), dy = _inputs(shape, dtype, shape[-1], shape[-1])
    out = norms.triton_layer_norm(x, w, b, 1e-5, persistent)
    xf, wf, bf = _fp32(x, w, b)
    ref = eager.eager_layer_norm(xf, wf, bf, 1e-5)
    _check(out, ref, dtype)
    for got, want in zip(_grads(out, dy, x, w, b), _grads(ref, dy.float(), xf, wf, bf), strict=False):
        _check(got, want, dtype)

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm(shape, dtype, norm_backward, norm_tile, monkeypatch):
    _wide_rows_in_wider_chunks(shape[-1], monkeypatch)
    x, (w,), dy = _inputs(shape, dtype, shape[-1])
    out = norms.triton_rms_norm(x, w, 1e-6)
    xf, wf = _fp32(x, w)
    ref = eager.eager_rms_norm(xf, wf, 1e-6)
    _check(out, ref, dtype)
    for got, want in zip(_grads(out, dy, x, w), _grads(ref, dy.float(), xf, wf), strict=False):
        _check(got, want, dtype)

@pytest.mark.parametrize("chunk", [0, 32])
def test_layer_norm_statistics_stay_exact_far_from_zero(monkeypatch, chunk):
    """A row whose mean is large against its spread: the chunked pass merges per-chunk mean and squared
    deviations, so it loses no more than the whole-row pass (E[x^2] - E[x]^2 would lose every digit)."""
    monkeypatch.setitem(norm_settings.LAUNCH, "forward_chunk", chunk)
    g = torch.Generator().manual_seed(3)
    x = (3000 + torch.randn(4, 257, generator=g, dtype=torch.float64)).float().to(DEVICE)
    out = norms.triton_layer_norm(x, None, None, 1e-12)
    ref = torch.nn.functional.layer_norm(x.double(), (257,), eps=1e-12)
    torch.testing.assert_close(out.double(), ref, atol=2e-3, rtol=0)

@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.float32), (torch.float32, None), (None, torch.float16)])
def test_partial_rows_sum_to_the_parameter_gradients(dtypes):
    """More partial rows than one tile holds (70 > 32) and a width that is not a multiple of the column block;
    each gradient comes back in its parameter's dtype, None where there is no parameter."""
    g = torch.Generator().manual_seed(5)
    partial = torch.randn(2, 70, 33, generator=g).to(DEVICE)
    params = [None if d is None else torch.empty(33, dtype=d, device=DEVICE) for d in dtypes]
    for got, want, param in zip(norms._param_grads(partial, *params), partial.sum(1), params, strict=False):
        if param is None:
            assert got is None
        else:
            _check(got, want.to(param.dtype), param.dtype)

@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("rows, tile, cols", [(4, 2, 16), (2, 4, 32), (8, 8, 64)],
                         ids=["2-tiles-per-group", "group-smaller-than-a-tile", "one-tile-per-group"])
def test_split_backward_parameter_tiles(monkeypatch, rms, rows, tile, cols):
    """The parameter-gradient kernel's launch settings: 11 rows in groups of `rows` (the last partial, and a
    group narrower than a tile taking a whole tile), 100 columns in blocks of `cols` (the last partial)."""
    for key, value in dict(fused_backward_max=0, param_rows=rows, param_tile=tile, param_cols=cols).items():
        monkeypatch.setitem(norm_settings.LAUNCH, key, value)
    x, (w, b), dy = _inputs((11, 100), torch.bfloat16, 100, 100)
    xf, wf, bf = _fp32(x, w, b)
    if rms:
        out, ref, ours, theirs = norms.triton_rms_norm(x, w, 1e-5), eager.eager_rms_norm(xf, wf, 1e-5), (x, w), (xf, wf)
    else:
        out, ref = norms.triton_layer_norm(x, w, b, 1e-5), eager.eager_layer_norm(xf, wf, bf, 1e-5)
        ours, theirs = (x, w, b), (xf, wf, bf)
    for got, want in zip(_grads(out, dy, *ours), _grads(ref, dy.float(), *theirs), strict=False):
        _check(got, want, torch.bfloat16)

def test_launch_settings_can_differ_by_row_width(monkeypatch):
    """LAUNCH_BY_WIDTH overrides LAUNCH for rows up to a width (the narrowest covering entry wins): here
    rows up to 64 wide take 2-row tiles and rows up to 256 wide are chunked; wider ones keep LAUNCH."""
    monkeypatch.setattr(norm_settings, "LAUNCH_BY_WIDTH", {256: {"forward_chunk": 4}, 64: {"forward_rows": 2}})
    assert norm_settings.settings(7)["forward_rows"] == norm_settings.settings(64)["forward_rows"] == 2
    assert norm_settings.settings(100)["forward_chunk"] == 4
    assert norm_settings.settings(100)["forward_rows"] == norm_settings.LAUNCH["forward_rows"]
    assert norm_settings.settings(257) == norm_settings.LAUNCH

    class Counted:
        def __init__(self, kernel):
            self.kernel, self.launches = kernel, 0

        def __getitem__(self, grid):
            self.launches += 1
            return self.kernel[grid]

    chunked = Counted(norms._norm_forward_chunked)
    monkeypatch.setattr(norms, "_norm_forward_chunked", chunked)
    for width, launches in ((7, 0), (100, 1)):
        x, (w, b), _ = _inputs((3, width), torch.bfloat16, width, width)
        xf, wf, bf = _fp32(x, w, b)
        _check(norms.triton_layer_norm(x, w, b, 1e-5), eager.eager_layer_norm(xf, wf, bf, 1e-5), torch.bfloat16)
        assert chunked.launches == launches

def test_norms_without_affine_parameters(norm_backward, norm_tile):
    x, _, dy = _inputs((4, 33), torch.float32)
    out = norms.triton_layer_norm(x, None, None, 1e-5)
    xf = _fp32(x)[0]
    ref = eager.eager_layer_norm(xf, None, None, 1e-5)
    _check(out, ref, torch.float32)
    _check(_grads(out, dy, x)[0], _grads(ref, dy, xf)[0], torch.float32)
    _check(norms.triton_rms_norm(x, None, 1e-5), eager.eager_rms_norm(xf, None, 1e-5), torch.float32)
    b = torch.randn(33, device=DEVICE, requires_grad=True)  # a bias without a weight
    bf = _fp32(b)[0]
    out, ref = norms.triton_layer_norm(x, None, b, 1e-5), eager.eager_layer_norm(xf, None, bf, 1e-5)
    for got, want in zip(_grads(out, dy, x, b), _grads(ref, dy, xf, bf), strict=False):
        _check(got, want, torch.float32)

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_bias_gelu(shape, dtype):
    x, (b,), dy = _inputs(shape, dtype, shape[-1])
    x.data.mul_(3)  # reach the flat tails of tanh as well
    out = activations.triton_bias_gelu(x, b)
    xf, bf = _fp32(x, b)
    ref = eager.eager_bias_gelu(xf, bf)
    _check(out, ref, dtype)
    for got, want in zip(_grads(out, dy, x, b), _grads(ref, dy.float(), xf, bf), strict=False):
        _check(got, want, dtype)

def test_gelu_saturates_without_nan():
    x = torch.tensor([[-1e4, -50.0, 0.0, 50.0, 1e4]], device=DEVICE, requires_grad=True)
    out = activations.triton_bias_gelu(x, None)
    torch.testing.assert_close(out.detach().cpu(), torch.tensor([[0.0, 0.0, 0.0, 50.0, 1e4]]))
    (grad,) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(grad.cpu(), torch.tensor([[0.0, 0.0, 0.5, 1.0, 1.0]]))

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 14), (3, 200), (2, 3, 514)])
def test_swiglu(shape, dtype):
    x, _, _ = _inputs(shape, dtype)
    dy = torch.randn(shape[:-1] + (shape[-1] // 2,)).to(DEVICE, dtype)
    out = activations.triton_swiglu(x)
    xf = _fp32(x)[0]
    ref = eager.eager_swiglu(xf)
    _check(out, ref, dtype)
    _check(_grads(out, dy, x)[0], _grads(ref, dy.float(), xf)[0], dtype)

def test_swiglu_refuses_an_odd_width():
    with pytest.raises(ValueError, match="even last dimension"):
        activations.triton_swiglu(torch.randn(2, 7, device=DEVICE))

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,vocab", [(1, 11), (5, 1000), (3, 9000)])  # 9000 > one 4096-wide block
@pytest.mark.parametrize("inplace", [False, True])
def test_cross_entropy(rows, vocab, dtype, inplace):
    g = torch.Generator().manual_seed(1)
    logits = (4 * torch.randn(rows, vocab, generator=g)).to(DEVICE, dtype).requires_grad_()
    target = torch.randint(0, vocab, (rows,), generator=g).to(DEVICE)
    lf = _fp32(logits)[0]
    ref = torch.nn.functional.cross_entropy(lf, target, reduction="none")
    (want,) = torch.autograd.grad(ref.mean(), lf)
    work = logits.detach().clone().requires_grad_()
    value = loss.triton_vocab_parallel_cross_entropy(work, target, 0, None, inplace)
    assert value.dtype == torch.float32
    torch.testing.assert_close(value, ref, **TOL[dtype])
    (got,) = torch.autograd.grad(value.mean(), work)
    _check(got, want, dtype)
    if inplace:
        assert got.data_ptr() == work.data_ptr(), "the gradient is written over the logits"

def test_cross_entropy_on_a_vocabulary_shard_matches_the_whole():
    """Two shards' statistics combined as the all-reduces would: the same loss as the whole vocabulary
    (the kernel's part of vocab-parallel cross-entropy; the reduction itself is tested in the trainer)."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 300, generator=g).to(DEVICE)
    target = torch.tensor([0, 149, 150, 299, 5, 200], device=DEVICE)
    rows = []
    for start in (0, 150):
        part = logits[:, start:start + 150].contiguous()
        stats = torch.empty((3, 6), device=DEVICE)
        loss._stats_kernel[(6,)](part, target, stats[0], stats[1], stats[2], part.stride(0), 150, start,
                                          BLOCK=64)
        rows.append(stats)
    big = torch.maximum(rows[0][0], rows[1][0])
    total = sum(s[1] * torch.exp(s[0] - big) for s in rows)
    whole = big + torch.log(total) - (rows[0][2] + rows[1][2])
    torch.testing.assert_close(whole, torch.nn.functional.cross_entropy(logits, target, reduction="none"))

@pytest.mark.parametrize("model_dtype", DTYPES)
@pytest.mark.parametrize("decoupled", [True, False])
def test_adam_step(model_dtype, decoupled):
    g = torch.Generator().manual_seed(3)
    for numel in (1, 1000, 5003):
        master = torch.randn(numel, generator=g).to(DEVICE)
        grad = torch.randn(numel, generator=g).to(DEVICE, model_dtype)
        m, v = torch.randn(numel, generator=g).to(DEVICE), torch.rand(numel, generator=g).to(DEVICE)
        ref = [t.clone() for t in (master, m, v)]
        out = torch.empty(numel, device=DEVICE, dtype=model_dtype) if model_dtype != torch.float32 else None
        args = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, step=7, decoupled=decoupled)
        adam.triton_adam_step(master, grad, m, v, out, **args)
        eager.eager_adam_step(ref[0], grad, ref[1], ref[2], **args)
        for got, want in zip((master, m, v), ref, strict=False):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
        if out is not None:
            # the rounded weight written back: within one ulp (the interpreter truncates where a GPU rounds)
            ulp = torch.finfo(model_dtype).eps
            torch.testing.assert_close(out.float(), master, atol=1e-30, rtol=ulp)

def test_norm_launch_refuses_a_setting_off_the_reference():
    """What keeps a fast but wrong launch setting from being chosen: one wrong row of many, or a gradient
    off by more than bf16 rounding, is reported; bf16 rounding itself is not."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("norm_launch", str(PERF / "norm_launch.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    g = torch.Generator().manual_seed(9)
    want = tuple(torch.randn(512, 64, generator=g) for _ in range(2)) + (torch.randn(64, generator=g),)
    rounded = tuple(t.to(torch.bfloat16) for t in want)
    assert module.wrong(rounded, want) == ""
    one_row = rounded[0].clone()
    one_row[300] = 0
    assert module.wrong((one_row, *rounded[1:]), want).startswith("y off by")
    assert module.wrong((*rounded[:2], rounded[2] * 1.05), want).startswith("dw off by")
