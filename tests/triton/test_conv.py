"""The 1-D conv Triton kernels (interpreter) against float64: conv1d with every epilogue, the SincNet
blocks and the whole SincNet stage, every candidate once, and every accuracy approval re-measured."""
import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from rlx_triton.backends.triton import conv as tconv
from rlx_triton.backends.triton.conv import launch as tconv_launch
from rlx_triton.backends.triton.conv import weights as tconv_weights
from rlx_triton.backends.triton import launches
from rlx_triton.ops.conv import ConvEpilogue, sinc_filters
from tests.reference.conv import assert_matches_float64, conv1d_float64, random_sincnet, sincnet_float64

NON_FINITE = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # numpy, interpreter
# relative tolerance per dtype (error / max |reference|)
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1.6e-2}
DEFAULT = tconv.default_candidate()
# big tiles: fewer interpreter programs for the longer SincNet cases
WIDE = tconv.make_candidate(tile_pos=32, tile_co=64, tile_k=128)
# the true-fp32 tensor-core candidate H100/H200 and A100 route to (tf32x3: dot_split)
GPU_RECIPE = {c.tag(): c for c in tconv.all_candidates()}[tconv.RECIPES["sm90"]]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30)).item()


def _block_params(module):
    convs = list(module.conv1d)[1:]
    return dict(
        wav_norm_weight=module.wav_norm1d.weight, wav_norm_bias=module.wav_norm1d.bias,
        conv_weights=[c.weight for c in convs], conv_biases=[c.bias for c in convs],
        norm_weights=[n.weight for n in module.norm1d], norm_biases=[n.bias for n in module.norm1d])


def _run_sincnet(module, wav, candidate):
    p = _block_params(module)
    with torch.no_grad():
        fb = module.conv1d[0].filterbank
        filters = sinc_filters(fb.low_hz_, fb.band_hz_, window_=fb.window_, n_=fb.n_)
        return tconv.sincnet(wav, filters, p["wav_norm_weight"], p["wav_norm_bias"], p["conv_weights"],
                             p["conv_biases"], p["norm_weights"], p["norm_biases"], candidate=candidate)


# ------------------------------------------------------------------------------ conv1d


CONV_CASES = [
    # (batch, c_in, c_out, length, taps, stride, padding, dilation, bias)
    (1, 1, 1, 7, 1, 1, 0, 1, False),
    (2, 7, 7, 80, 3, 1, 1, 1, True),
    (1, 7, 80, 80, 5, 2, 2, 2, True),
    (2, 80, 7, 33, 5, 3, 0, 1, False),
    (1, 80, 60, 333, 5, 1, 0, 1, True),
    (1, 1, 16, 333, 251, 10, 0, 1, False),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "b{}_ci{}_co{}_l{}_k{}_s{}_p{}_d{}_{}".format(
    *c[:8], "bias" if c[8] else "nobias"))
def test_conv1d_matches_float64(case):
    batch, c_in, c_out, length, taps, stride, padding, dilation, has_bias = case
    x = torch.randn(batch, c_in, length)
    w = torch.randn(c_out, c_in, taps) / (c_in * taps) ** 0.5
    b = torch.randn(c_out) if has_bias else None
    out = tconv.conv1d(x, w, b, stride, padding, dilation, candidate=DEFAULT)
    ref = conv1d_float64(x, w, b, stride, padding, dilation)
    assert out.shape == ref.shape and out.dtype == x.dtype
    assert rel_err(out, ref) <= TOL[torch.float32]


def test_conv1d_reads_strided_inputs():
    x = torch.randn(2, 40, 7).transpose(1, 2)          # (2, 7, 40), length stride 7
    w = torch.randn(5, 7, 3)
    b = torch.randn(10)[::2]                              # non-contiguous bias
    out = tconv.conv1d(x, w, b, 1, 1, 1, candidate=DEFAULT)
    assert rel_err(out, conv1d_float64(x, w, b, 1, 1, 1)) <= TOL[torch.float32]


def test_packed_weights_follow_in_place_updates():
    x = torch.randn(1, 7, 40)
    w = torch.randn(5, 7, 3)
    first = tconv.conv1d(x, w, None, candidate=DEFAULT)
    assert tconv_weights._packed_weight(w) is tconv_weights._packed_weight(w)     # packed once per weight version
    w.mul_(2.0)
    second = tconv.conv1d(x, w, None, candidate=DEFAULT)
    assert torch.allclose(second, 2 * first, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_conv1d_every_dtype(dtype):
    x = torch.randn(2, 7, 80).to(dtype)
    w = (torch.randn(11, 7, 5) / 6).to(dtype)
    b = torch.randn(11).to(dtype)
    out = tconv.conv1d(x, w, b, 2, 1, 1, candidate=DEFAULT)
    ref = conv1d_float64(x, w, b, 2, 1, 1)   # float64 of the same (rounded) inputs
    assert out.dtype == dtype
    assert rel_err(out, ref) <= TOL[dtype]


@pytest.mark.parametrize("epilogue", [
    ConvEpilogue(abs=True, pool=3),
    ConvEpilogue(pool=2, negative_slope=0.01),
    ConvEpilogue(abs=True, pool=1, negative_slope=0.2),
    ConvEpilogue(negative_slope=0.0),
], ids=["abs_pool3", "pool2_leaky", "abs_leaky", "relu"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_conv1d_epilogues(epilogue, fused):
    candidate = tconv.make_candidate(fuse_epilogue=fused)
    x = torch.randn(2, 7, 80)
    w = torch.randn(9, 7, 5) / 6
    b = torch.randn(9)
    out = tconv.conv1d(x, w, b, 1, 2, 1, epilogue=epilogue, candidate=candidate)
    ref = conv1d_float64(x, w, b, 1, 2, 1, abs_=epilogue.abs, pool=epilogue.pool,
                         negative_slope=epilogue.negative_slope)
    assert out.shape == ref.shape
    assert rel_err(out, ref) <= TOL[torch.float32]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_conv1d_pool_propagates_nan_like_torch(fused):
    x = torch.randn(1, 3, 30)
    x[0, 1, 7] = float("nan")
    w = torch.randn(4, 3, 3)
    epilogue = ConvEpilogue(abs=True, pool=3)
    out = tconv.conv1d(x, w, None, 1, 0, 1, epilogue=epilogue, candidate=tconv.make_candidate(fuse_epilogue=fused))
    ref = F.max_pool1d(F.conv1d(x, w).abs(), 3, 3)
    assert torch.equal(out.isnan(), ref.isnan()) and ref.isnan().any()


# ------------------------------------------------------------------------------ SincNet blocks


def test_sinc_conv_abs_pool_block_with_the_waveform_norm_folded_in():
    module = random_sincnet()
    wav = torch.randn(2, 1, 3200)
    with torch.no_grad():
        filters = module.conv1d[0].filterbank.filters()
        norm = tconv_launch._row_norm(wav, module.wav_norm1d.weight, module.wav_norm1d.bias, eps=1e-5)
        out = tconv_launch._conv_block(wav, filters, None, stride=10, padding=0, dilation=1, pool=3, abs_=True,
                                out_slope=None, out_dtype=torch.float32, in_norm=norm, candidate=WIDE)
        m64 = module.double()
        ref = m64.pool1d[0](m64.conv1d[0](m64.wav_norm1d(wav.double())).abs())
    assert out.shape == ref.shape == (2, 80, ((3200 - 251) // 10 + 1) // 3)
    assert rel_err(out, ref) <= 2e-5


@pytest.mark.parametrize("precision, tile_pos, tile_co, tg_size, expected", [
    ("tf32x3", 32, 64, 256, (32, 64)),    # the GPU recipe: all 40 + 40 filters, 4 x 32 rows
    ("tf32x3", 64, 64, 128, (16, 64)),    # 4 warps hold 4 x 16 rows of 64 + 64 filters
    ("ieee", 64, 32, 128, (8, 32)),       # the FMA path keeps 16 accumulator registers a thread
    ("ieee", 64, 16, 128, (16, 16)),
])
def test_the_sinc_tile_keeps_the_accumulators_within_the_register_budget(precision, tile_pos, tile_co, tg_size,
                                                                          expected):
    candidate = tconv.make_candidate(tile_pos=tile_pos, tile_co=tile_co, tile_k=16, tg_size=tg_size,
                                     precision=precision)
    assert tconv_launch.sinc_tile(80, 3, candidate) == expected
    assert tconv_launch.sinc_tile(80, 3, candidate, interpret=True) == (tile_pos, min(tile_co, 64))


def test_the_symmetric_sinc_kernel_halves_the_taps_and_gives_the_direct_conv():
    """sinc_filters' banks run _sinc_conv_kernel (pre-added mirrored samples); the direct kernel on the same
    filters and float64 agree."""
    module, wav = random_sincnet(), torch.randn(2, 1, 3200)
    with torch.no_grad():
        filters = _sincnet_args(module, wav)[1]
        norm = tconv_launch._row_norm(wav, module.wav_norm1d.weight, module.wav_norm1d.bias, eps=1e-5)
        common = dict(stride=10, padding=0, dilation=1, pool=3, abs_=True, out_slope=None, out_dtype=torch.float32,
                      in_norm=norm, candidate=WIDE)
        (sym,), out = tconv_launch._conv_block_plan(wav, filters, None, symmetric=True, **common)
        launches.run([sym])
        direct = tconv_launch._conv_block(wav, filters, None, **common)
    assert sym.name == "_sinc_conv_kernel" and tconv.symmetric_bank(filters, 1)
    ref = conv1d_float64(_normalized(wav, norm), filters, None, 10, abs_=True, pool=3)
    assert rel_err(out, ref) <= 1e-5 and rel_err(direct, ref) <= 1e-5


@pytest.mark.parametrize("precision", ["ieee", "tf32x3"])
@pytest.mark.parametrize("tile_co", [16, 32, 64])
@pytest.mark.parametrize("pairs", [8, 24, 40])
def test_the_symmetric_sinc_kernel_holds_any_share_of_the_filters_per_program(pairs, tile_co, precision):
    """16, 48 or 80 filters in programs of up to 16, 32 or 64 lanes per parity (sinc_tile): filter lanes past
    the bank are masked, and every filter equals float64's conv."""
    module, wav = random_sincnet(), torch.randn(1, 1, 1500)
    fb = module.conv1d[0].filterbank
    with torch.no_grad():
        filters = sinc_filters(fb.low_hz_[:pairs], fb.band_hz_[:pairs], window_=fb.window_, n_=fb.n_)
        norm = tconv_launch._row_norm(wav, module.wav_norm1d.weight, module.wav_norm1d.bias, eps=1e-5)
        candidate = tconv.make_candidate(tile_pos=32, tile_co=tile_co, tile_k=128, tg_size=256, precision=precision)
        (sym,), out = tconv_launch._conv_block_plan(wav, filters, None, stride=10, padding=0, dilation=1, pool=3,
                                                    abs_=True, out_slope=None, out_dtype=torch.float32,
                                                    in_norm=norm, candidate=candidate, symmetric=True)
        launches.run([sym])
    _, block_f = tconv_launch.sinc_tile(2 * pairs, 3, candidate, interpret=True)
    assert sym.name == "_sinc_conv_kernel" and sym.grid[1] == -(-pairs // block_f)
    ref = conv1d_float64(_normalized(wav, norm), filters, None, 10, abs_=True, pool=3)
    assert out.shape == ref.shape and rel_err(out, ref) <= 1e-5


def test_only_unchanged_sinc_filter_banks_take_the_symmetric_kernel():
    module = random_sincnet()
    filters = _sincnet_args(module, torch.zeros(1, 1, 1))[1]
    assert tconv.symmetric_bank(filters, 1)
    assert not tconv.symmetric_bank(filters.clone(), 1)            # arbitrary filters: the direct conv
    assert not tconv.symmetric_bank(filters, 2)                     # one input channel only
    assert not tconv.symmetric_bank(filters[:72], 1)                # 16 | filters
    edited = _sincnet_args(module, torch.zeros(1, 1, 1))[1]
    edited[0, 0, 0] += 1.0                                          # no longer symmetric: the version moved
    assert not tconv.symmetric_bank(edited, 1)


def test_sinc_filters_of_inference_tensors_take_the_symmetric_kernel():
    with torch.inference_mode():
        module = random_sincnet()
        wav = torch.randn(1, 1, 2000)
        args = _sincnet_args(module, wav)
        assert args[1].is_inference() and tconv.symmetric_bank(args[1], 1)
        with launches.recording() as log:
            out = tconv.sincnet(*args, candidate=WIDE)
    assert "_sinc_conv_kernel" in log.kernels
    assert rel_err(out, sincnet_float64(module, wav)) <= 1e-4


def test_routed_calls_launch_through_the_autotune_bridge():
    import rlx_triton as rt
    from rlx_triton.ops import conv as ops

    module, wav = random_sincnet(), torch.randn(1, 1, 2000)
    args = _sincnet_args(module, wav)
    with torch.no_grad():
        route = rt.explain(ops.sincnet, *args)
    assert route.backend == "triton"
    with torch.no_grad(), launches.recording() as log:
        out = tconv.sincnet(*args, candidate=route.candidate, route=route)
    tuned = [r for r in log.records if r.route is not None]
    assert [r.name for r in tuned] == ["_sinc_conv_kernel", "_conv1d_kernel", "_conv1d_kernel"]
    assert tuned[0].kernel is tconv.tuned_kernel("sinc") and tuned[1].kernel is tconv.tuned_kernel("conv1d")
    assert log.outside == [] and len(log.records) == tconv.launch_count(route.request, route.candidate)
    assert rel_err(out, sincnet_float64(module, wav)) <= 1e-4
    key = tconv.tuned_kernel("sinc").autotuner
    assert any(tconv.tuned_kernel("sinc").winner(k) == route.candidate_tag for k in key.cache)


def _normalized(x, norm):
    """x (B, C, L) through a RowNorm: (x - center) * scale + shift, in float64."""
    B, C, _ = x.shape
    center, scale, shift = (t.double().view(B, C, 1) for t in norm)
    return (x.double() - center) * scale + shift


def test_instance_norm_rows_give_center_scale_and_shift():
    x = torch.randn(3, 7, 333) * 4 + 2
    gamma, beta = torch.randn(7), torch.randn(7)
    out = torch.empty_like(x)
    norm = tconv_launch._row_norm(x, gamma, beta, eps=1e-5, slope=0.01, out=out)
    ref = F.instance_norm(x.double(), weight=gamma.double(), bias=beta.double(), eps=1e-5)
    assert rel_err(out, F.leaky_relu(ref, 0.01)) <= TOL[torch.float32]
    assert torch.equal(norm.center, x[:, :, 0].flatten())
    assert rel_err(_normalized(x, norm), ref) <= 1e-5


def test_long_rows_use_chunked_statistics():
    x = torch.randn(2, 1, 20000) * 3 + 5                  # > 16384 samples: chunked statistics
    gamma, beta = torch.tensor([1.3]), torch.tensor([-0.2])
    norm = tconv_launch._row_norm(x, gamma, beta, eps=1e-5)
    ref = F.instance_norm(x.double(), weight=gamma.double(), bias=beta.double(), eps=1e-5)
    assert torch.equal(norm.center, x[:, 0, 0])
    assert rel_err(_normalized(x, norm), ref) <= 1e-5


def test_conv_block_reads_the_previous_norm_and_leaky_in_its_prologue():
    module = random_sincnet()
    h = torch.randn(2, 80, 98).abs()
    norm, conv = module.norm1d[0], module.conv1d[1]
    with torch.no_grad():
        row_norm = tconv_launch._row_norm(h, norm.weight, norm.bias, eps=1e-5)
        out = tconv_launch._conv_block(h, conv.weight, conv.bias, stride=1, padding=0, dilation=1, pool=3,
                                abs_=False, out_slope=None, out_dtype=torch.float32, in_norm=row_norm,
                                in_slope=0.01, candidate=DEFAULT)
        m64 = module.double()
        ref = m64.pool1d[1](m64.conv1d[1](F.leaky_relu(m64.norm1d[0](h.double()))))
    assert out.shape == ref.shape == (2, 60, 31)
    assert rel_err(out, ref) <= 1e-5


@pytest.mark.parametrize("batch,samples", [(1, 3200), (2, 4000)])
def test_sincnet_matches_the_pyannote_module(batch, samples):
    module = random_sincnet()
    wav = torch.randn(batch, 1, samples)
    out = _run_sincnet(module, wav, WIDE)
    with torch.no_grad():
        ref32 = module(wav)
    ref64 = sincnet_float64(module, wav)
    assert out.shape == ref32.shape
    assert rel_err(out, ref32) <= 1e-4
    assert rel_err(out, ref64) <= 1e-4


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)])
def test_sincnet_in_half_precision_keeps_float32_intermediates(dtype, tol):
    module = random_sincnet().to(dtype)
    wav = torch.randn(1, 1, 3200).to(dtype)
    out = _run_sincnet(module, wav, WIDE)
    assert out.dtype == dtype
    assert rel_err(out, sincnet_float64(module, wav)) <= tol


def test_sincnet_with_chunked_waveform_statistics(monkeypatch):
    """Waveforms longer than _SPLIT_ROW_MIN (10 s chunks) take the chunked statistics path."""
    monkeypatch.setattr(tconv_launch, "_SPLIT_ROW_MIN", 1024)
    monkeypatch.setattr(tconv_launch, "_STATS_CHUNK", 1024)
    module = random_sincnet()
    wav = torch.randn(2, 1, 3200) + 0.5
    out = _run_sincnet(module, wav, WIDE)
    assert rel_err(out, sincnet_float64(module, wav)) <= 1e-4


def _sincnet_blocks(module, wav, candidate):
    """The SincNet chain launch by launch: every block's pooled conv output, then the final output."""
    p = _block_params(module)
    fb = module.conv1d[0].filterbank
    blocks = []
    with torch.no_grad():
        filters = sinc_filters(fb.low_hz_, fb.band_hz_, window_=fb.window_, n_=fb.n_)
        norm = tconv_launch._row_norm(wav, p["wav_norm_weight"], p["wav_norm_bias"], eps=1e-5)
        h = tconv_launch._conv_block(wav, filters, None, stride=10, padding=0, dilation=1, pool=3, abs_=True,
                              out_slope=None, out_dtype=torch.float32, in_norm=norm, candidate=candidate,
                              symmetric=tconv.symmetric_bank(filters, wav.shape[1]))
        blocks.append(h)
        for i, (w, b) in enumerate(zip(p["conv_weights"], p["conv_biases"])):
            norm = tconv_launch._row_norm(h, p["norm_weights"][i], p["norm_biases"][i], eps=1e-5)
            h = tconv_launch._conv_block(h, w, b, stride=1, padding=0, dilation=1, pool=3, abs_=False, out_slope=None,
                                  out_dtype=torch.float32, in_norm=norm, in_slope=0.01, candidate=candidate)
            blocks.append(h)
    return blocks


@pytest.mark.parametrize("value, candidate", [
    (0.0, WIDE), (0.5, WIDE), (-100.0, WIDE), (1e4, WIDE), (1e4, GPU_RECIPE)],
    ids=["zeros", "dc0.5", "dc-100", "dc1e4", "dc1e4_tf32x3"])
def test_constant_waveforms_keep_every_block_exactly_constant(value, candidate):
    """The documented rule: an exactly constant row stays exactly constant through every norm and conv
    (shifted statistics, centred prologue; the symmetric sinc kernel and the split tensor-core dots
    included), whatever BLAS kernel the interpreter's dots use, and the output is float64's constant."""
    module = random_sincnet()
    wav = torch.full((1, 1, 2000), value)
    for h in _sincnet_blocks(module, wav, candidate):
        assert torch.equal(h.amax(-1), h.amin(-1))
    assert_matches_float64(_run_sincnet(module, wav, candidate), sincnet_float64(module, wav), 1e-5)


@NON_FINITE
@pytest.mark.parametrize("candidate", [WIDE, GPU_RECIPE], ids=tconv.candidate_tag)
def test_the_symmetric_sinc_block_gives_nan_for_a_non_finite_chunk_and_leaves_the_others(candidate):
    """NaN and Inf in one chunk: its waveform norm is NaN, so torch's sinc block output for that chunk is NaN
    everywhere (the whole stage: tests/ops/test_conv.py); the symmetric kernel gives the same, and the clean
    chunk float64's values."""
    wav = torch.randn(2, 1, 2000)
    wav[0, 0, 700] = float("nan")
    wav[0, 0, 5] = float("inf")
    out, ref = _symmetric_sinc_block(wav, candidate)
    assert ref[0].isnan().all() and out[0].isnan().all()
    assert rel_err(out[1], ref[1]) <= TOL[torch.float32]


def _non_finite_tf32x3_conv1d(device: str):
    """(out, float64 reference) of the tf32x3 conv1d on an input with a NaN, an Inf and a -Inf."""
    x = torch.randn(2, 3, 40)
    x[0, 0, 5] = float("nan")
    x[0, 2, 20] = float("inf")
    x[1, 1, 33] = -float("inf")
    w, b = torch.randn(4, 3, 3), torch.randn(4)
    out = tconv.conv1d(x.to(device), w.to(device), b.to(device), 1, 1, 1,
                       epilogue=ConvEpilogue(abs=True, pool=2, negative_slope=0.01), candidate=GPU_RECIPE)
    return out.cpu(), conv1d_float64(x, w, b, 1, 1, 1, abs_=True, pool=2, negative_slope=0.01)


@NON_FINITE
def test_tf32x3_conv1d_propagates_nan_and_keeps_finite_outputs_finite():
    """The split tensor-core dots: NaN reaches every output torch gives NaN; an Inf input gives non-finite
    outputs where torch's are non-finite (NaN where the weight it meets is exactly a TF32 value: inf times
    its zero low half); every other output is finite and within the fp32 bound."""
    out, ref = _non_finite_tf32x3_conv1d("cpu")
    assert ref.isnan().any() and ref.isinf().any()
    assert torch.equal(torch.isfinite(out), torch.isfinite(ref)) and out[ref.isnan()].isnan().all()
    finite = torch.isfinite(ref)
    assert_matches_float64(out[finite], ref[finite], TOL[torch.float32], reduced=9)


@pytest.mark.gpu
def test_tf32x3_conv1d_propagates_nan_and_keeps_finite_outputs_finite_on_gpu():
    """The same on real TF32 tensor cores, which the interpreter's numpy dots only stand in for."""
    out, ref = _non_finite_tf32x3_conv1d("cuda")
    assert torch.equal(torch.isfinite(out), torch.isfinite(ref)) and out[ref.isnan()].isnan().all()
    finite = torch.isfinite(ref)
    assert_matches_float64(out[finite], ref[finite], TOL[torch.float32], reduced=9)


@pytest.mark.parametrize("value", [0.0, 0.5, -100.0, 1e4], ids=["zeros", "dc0.5", "dc-100", "dc1e4"])
@pytest.mark.parametrize("chunked", [False, True], ids=["one_pass", "chunked"])
def test_constant_rows_normalize_to_exactly_beta(value, chunked, monkeypatch):
    if chunked:
        monkeypatch.setattr(tconv_launch, "_SPLIT_ROW_MIN", 256)
        monkeypatch.setattr(tconv_launch, "_STATS_CHUNK", 256)
    x = torch.full((2, 3, 999), value)
    gamma, beta = torch.rand(3) + 0.5, torch.randn(3)
    norm = tconv_launch._row_norm(x, gamma, beta, eps=1e-5)
    assert torch.equal(_normalized(x, norm).float(), beta.view(1, 3, 1).expand(2, 3, 999))
    assert torch.equal(norm.center, x[:, :, 0].flatten())


@pytest.mark.parametrize("chunked", [False, True], ids=["one_pass", "chunked"])
def test_offset_rows_keep_their_digits(chunked, monkeypatch):
    """Shifted statistics and the centred form (x - center) * scale + shift: a small signal on a large
    offset normalizes to float64's values (x * scale + shift would cancel ~4 digits here)."""
    if chunked:
        monkeypatch.setattr(tconv_launch, "_SPLIT_ROW_MIN", 256)
        monkeypatch.setattr(tconv_launch, "_STATS_CHUNK", 256)
    x = 100 + 0.02 * torch.randn(2, 3, 999)
    gamma, beta = torch.rand(3) + 0.5, torch.randn(3)
    norm = tconv_launch._row_norm(x, gamma, beta, eps=1e-5)
    ref = F.instance_norm(x.double(), weight=gamma.double(), bias=beta.double(), eps=1e-5)
    assert rel_err(_normalized(x, norm), ref) <= 1e-5


@NON_FINITE
@pytest.mark.parametrize("apply", [False, True], ids=["stats", "stats_apply"])
def test_a_non_finite_value_gives_a_nan_row_like_torch(apply):
    x = torch.randn(1, 4, 300)
    x[0, 1, 17] = float("nan")
    x[0, 2, 0] = float("inf")          # the row's first element: the shift itself is infinite
    x[0, 3, 150] = -float("inf")
    gamma, beta = torch.rand(4) + 0.5, torch.randn(4)
    ref = F.leaky_relu(F.instance_norm(x.double(), weight=gamma.double(), bias=beta.double(), eps=1e-5), 0.01)
    out = torch.empty_like(x)
    norm = tconv_launch._row_norm(x, gamma, beta, eps=1e-5, slope=0.01, out=out if apply else None)
    got = out if apply else F.leaky_relu(_normalized(x, norm), 0.01)
    assert_matches_float64(got, ref, TOL[torch.float32])
    assert ref[0, 1:].isnan().all() and not ref[0, 0].isnan().any()


@NON_FINITE
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_non_finite_inputs_propagate_through_conv_and_epilogue_like_torch(fused):
    """NaN and +-Inf in the signal: conv, |x|, max-pool and leaky ReLU give torch's NaN/Inf pattern."""
    x = torch.randn(2, 3, 40)
    x[0, 0, 5] = float("nan")
    x[0, 2, 20] = float("inf")
    x[1, 1, 33] = -float("inf")
    w = torch.randn(4, 3, 3)
    w[1, 2, 1] = 0.0                   # Inf * 0 is NaN, in torch too
    b = torch.randn(4)
    epilogue = ConvEpilogue(abs=True, pool=2, negative_slope=0.01)
    out = tconv.conv1d(x, w, b, 1, 1, 1, epilogue=epilogue, candidate=tconv.make_candidate(fuse_epilogue=fused))
    ref = conv1d_float64(x, w, b, 1, 1, 1, abs_=True, pool=2, negative_slope=0.01)
    assert ref.isnan().any() and ref.isinf().any()
    assert_matches_float64(out, ref, TOL[torch.float32], reduced=9)


@NON_FINITE
def test_prologue_norm_of_a_nan_row_spreads_nan_like_torch():
    """A NaN in one input channel makes that channel's norm NaN, so every conv output that reads it is NaN."""
    h = torch.randn(2, 5, 30).abs()
    h[1, 3, 4] = float("nan")
    gamma, beta = torch.rand(5) + 0.5, torch.randn(5)
    w, b = torch.randn(6, 5, 3) / 4, torch.randn(6)
    norm = tconv_launch._row_norm(h, gamma, beta, eps=1e-5)
    out = tconv_launch._conv_block(h, w, b, stride=1, padding=0, dilation=1, pool=2, abs_=False, out_slope=None,
                            out_dtype=torch.float32, in_norm=norm, in_slope=0.01, candidate=DEFAULT)
    xn = F.leaky_relu(F.instance_norm(h.double(), weight=gamma.double(), bias=beta.double(), eps=1e-5), 0.01)
    ref = conv1d_float64(xn, w, b, pool=2)
    assert ref[1].isnan().all() and not ref[0].isnan().any()
    assert_matches_float64(out, ref, TOL[torch.float32], reduced=15)


def test_packed_weights_of_inference_tensors_follow_in_place_updates():
    """Inference tensors have no version counter: they are packed on every call, so an in-place edit
    inside inference mode is seen."""
    x = torch.randn(1, 7, 40)
    with torch.inference_mode():
        w = torch.randn(5, 7, 3)
        first = tconv.conv1d(x, w, None, candidate=DEFAULT)
        w.mul_(2.0)
        second = tconv.conv1d(x, w, None, candidate=DEFAULT)
    assert torch.allclose(second, 2 * first, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ candidates


def _sweep_case(candidate):
    """One small conv1d with a fused norm prologue and pool epilogue, and a small sinc block."""
    x = torch.randn(2, 7, 80)
    w = torch.randn(9, 7, 5) / 6
    b = torch.randn(9)
    norm = tconv.RowNorm(torch.randn(14), torch.rand(14) + 0.5, torch.randn(14))
    out = tconv_launch._conv_block(x, w, b, stride=1, padding=1, dilation=1, pool=3, abs_=True, out_slope=0.01,
                            out_dtype=torch.float32, in_norm=norm, in_slope=0.01, candidate=candidate)
    xn = F.leaky_relu(_normalized(x, norm), 0.01)
    ref = conv1d_float64(xn, w, b, 1, 1, 1, abs_=True, pool=3, negative_slope=0.01)
    errs = [rel_err(out, ref)]
    wav = torch.randn(1, 1, 1200)
    filt = torch.randn(32, 1, 251) / 16
    out = tconv.conv1d(wav, filt, None, 10, 0, 1, epilogue=ConvEpilogue(abs=True, pool=3), candidate=candidate)
    errs.append(rel_err(out, conv1d_float64(wav, filt, None, 10, abs_=True, pool=3)))
    errs.append(_symmetric_sinc_error(wav, candidate))
    return max(errs)


def _symmetric_sinc_error(wav, candidate):
    """The symmetric sinc conv block (the waveform norm folded in) of a registered bank, against float64."""
    return rel_err(*_symmetric_sinc_block(wav, candidate))


def _symmetric_sinc_block(wav, candidate):
    """(kernel output, float64 reference) of the symmetric sinc conv block on a registered bank."""
    module = random_sincnet()
    with torch.no_grad():
        filters = _sincnet_args(module, wav)[1]
        norm = tconv_launch._row_norm(wav, module.wav_norm1d.weight, module.wav_norm1d.bias, eps=1e-5)
        out = tconv_launch._conv_block(wav, filters, None, stride=10, padding=0, dilation=1, pool=3, abs_=True,
                                out_slope=None, out_dtype=torch.float32, in_norm=norm, candidate=candidate,
                                symmetric=True)
    ref = conv1d_float64(_normalized(wav, norm), filters, None, 10, abs_=True, pool=3)
    return out, ref


def test_every_conv_candidate_runs_and_every_approval_holds():
    """The sweep: each candidate of the plan runs once; an approved one must hold its approval's bound."""
    candidates = tconv.all_candidates()
    assert len(candidates) >= 2
    for candidate in candidates:
        err = _sweep_case(candidate)
        approval = tconv.APPROVALS.get(tconv.candidate_tag(candidate))
        bound = approval.max_rel_err if approval is not None else TOL[torch.float32]
        assert err <= bound, (tconv.candidate_tag(candidate), err, bound)


def test_gpu_dot_width_gives_the_same_sums(monkeypatch):
    """On GPUs BLOCK_K is issued as 16-wide dots (DOT_K); the interpreter uses one dot per BLOCK_K.
    Forcing the GPU width here checks the chunked loop too."""
    monkeypatch.setattr(tconv_launch, "_dot_k", lambda block_k, interpret: min(16, block_k))
    assert _sweep_case(tconv.make_candidate(tile_k=64)) <= TOL[torch.float32]


def test_approvals_name_only_true_fp32_candidates():
    assert tconv.APPROVALS, "the fp32 candidate must be approved"
    tags = {tconv.candidate_tag(c): c for c in tconv.all_candidates()}
    for tag in tconv.APPROVALS:
        assert tags[tag].precision in ("ieee", "tf32x3")            # never plain tf32


def test_routing_data_is_declared():
    assert tconv.COVERAGE.ops == frozenset({"sincnet", "conv1d"})
    names = {spec.name for spec in tconv.AUDIT_KERNELS}
    assert {"conv1d_igemm", "conv1d_sinc_abs_pool", "conv1d_row_norm"} <= names
    for spec in tconv.AUDIT_KERNELS:
        for candidate in spec.candidates:
            meta = spec.meta(candidate, "fp32")
            assert "num_warps" in meta and "num_stages" in meta


# ------------------------------------------------------------------------------ launch plans


def _sincnet_args(module, wav):
    p = _block_params(module)
    fb = module.conv1d[0].filterbank
    with torch.no_grad():
        filters = sinc_filters(fb.low_hz_, fb.band_hz_, window_=fb.window_, n_=fb.n_)
    return (wav, filters, p["wav_norm_weight"], p["wav_norm_bias"], p["conv_weights"], p["conv_biases"],
            p["norm_weights"], p["norm_biases"])


def _summary(record):
    """What the GPU is asked to run, without the pointer specialisation: kernel, grid, constexprs, options."""
    constexprs = {key: value for key, value in record.meta.items() if key.isupper()}
    return record.name, record.grid, constexprs, record.num_warps, record.num_stages


def test_sincnet_runs_exactly_its_plan():
    module, wav = random_sincnet(), torch.randn(2, 1, 4000)
    args = _sincnet_args(module, wav)
    with torch.no_grad(), launches.recording() as log:
        out = tconv.sincnet(*args, candidate=WIDE)
    plan, planned = tconv.sincnet_plan(*args, candidate=WIDE)
    assert log.outside == [] and [r.describe() for r in log.records] == [r.describe() for r in plan]
    launches.run(plan)
    assert torch.equal(planned, out)


def test_sincnet_plan_is_the_hand_count():
    """(2, 1, 4000) with the default 64 x 32 x 32 tile: 125 pooled sinc frames, then 40 and 12."""
    module, wav = random_sincnet(), torch.randn(2, 1, 4000)
    plan, out = tconv.sincnet_plan(*_sincnet_args(module, wav), candidate=DEFAULT)
    k = DEFAULT.tile_k     # one dot per BLOCK_K in the interpreter
    conv = dict(POOL=3, BLOCK_P=64, BLOCK_CO=32, BLOCK_K=k, DOT_K=k, PRECISION="ieee")
    norm = dict(HAS_AFFINE=True, APPLY=False)
    assert [_summary(r) for r in plan] == [
        ("_row_norm_kernel", (2,), dict(norm, BLOCK_R=1, BLOCK_L=1024), 4, 3),
        # the symmetric sinc conv: 40 even + 40 odd filters in 2 programs of 32 + 32 lanes (the channel tile),
        # the pool's 3 phases as rows of one tile (4 x 64: the interpreter takes the candidate's 64 positions)
        ("_sinc_conv_kernel", (2, 2, 2), dict(HALF=125, POOL=3, PHASES=4, ABS=True, BLOCK_P=64, BLOCK_F=32,
                                              BLOCK_K=k, DOT_K=k, PRECISION="ieee"), 4, 2),
        ("_row_norm_kernel", (10,), dict(norm, BLOCK_R=16, BLOCK_L=128), 4, 3),
        ("_conv1d_kernel", (1, 2, 2), dict(TAPS=5, HAS_BIAS=True, IN_AFFINE=True, IN_LEAKY=True, ABS=False,
                                           OUT_LEAKY=False, **conv), 4, 2),
        ("_row_norm_kernel", (8,), dict(norm, BLOCK_R=16, BLOCK_L=64), 4, 3),
        ("_conv1d_kernel", (1, 2, 2), dict(TAPS=5, HAS_BIAS=True, IN_AFFINE=True, IN_LEAKY=True, ABS=False,
                                           OUT_LEAKY=False, **conv), 4, 2),
        ("_row_norm_kernel", (8,), dict(HAS_AFFINE=True, APPLY=True, BLOCK_R=16, BLOCK_L=16), 4, 3),
    ]
    sinc = plan[1]
    # 8 programs x 128 pre-added tap pairs (126 padded) x 4 x 64 rows x 64 filter lanes (80 of 128 used)
    assert sinc.flops == 2 * (2 * 2 * 2) * 128 * 4 * 64 * 64
    assert sinc.bytes_read == 4 * (2 * 4000 + 126 * 80 + 80 + 3 * 2) and sinc.bytes_written == 4 * 2 * 80 * 125
    assert sinc.unit == "fp32_fma" and out.shape == (2, 60, 12)


def test_conv1d_record_counts_bytes_once_and_executed_flops():
    x, w, b = torch.randn(2, 7, 80), torch.randn(5, 7, 3), torch.randn(5)
    tf32x3 = tconv.make_candidate(precision="tf32x3")
    (record,), out = tconv.conv1d_plan(x, w, b, 2, 0, 1, epilogue=ConvEpilogue(abs=True, pool=3), candidate=tf32x3)
    # 39 conv positions -> 13 pooled: one 64-position tile, one 32-channel tile, 2 batch rows
    assert record.grid == (1, 1, 2) and out.shape == (2, 5, 13)
    assert record.flops == 2 * 2 * 3 * 32 * 64 * 32 and record.unit == "tf32x4"   # four TF32 products each
    # the tf32x3 kernel reads the split weight terms: 4 x 21 per output channel
    assert record.bytes_read == 4 * (2 * 7 * 80 + 4 * 21 * 5 + 5) and record.bytes_written == 4 * 2 * 5 * 13


def _routed(op, *args, **kwargs):
    import rlx_triton as rt

    return rt.explain(op, *args, **kwargs)


@pytest.mark.parametrize("case", ["one_pass", "chunked", "unfused", "no_blocks", "pool1"])
def test_launch_count_is_the_plan_length(case, monkeypatch):
    from rlx_triton.ops import conv as ops

    if case == "chunked":
        monkeypatch.setattr(tconv_launch, "_SPLIT_ROW_MIN", 300)
    module = random_sincnet()
    wav = torch.empty(2, 1, 4000 if case != "chunked" else 12000, device="meta")
    args = list(_sincnet_args(module.to("meta"), wav))
    pool = 1 if case == "pool1" else 3
    if case == "no_blocks":
        args[4:8] = [], [], args[6][:1], args[7][:1]
    request = ops._sincnet_request(*args, pool=pool)
    candidate = tconv.all_candidates()[-1] if case == "unfused" else DEFAULT
    assert candidate.fuse_epilogue == (case != "unfused")
    with launches.planning() as log:
        tconv.sincnet(*args, pool=pool, candidate=candidate)
    assert len(log.records) == tconv.launch_count(request, candidate) and log.outside == []


@pytest.mark.parametrize("epilogue", [None, ConvEpilogue(abs=True), ConvEpilogue(pool=2),
                                      ConvEpilogue(negative_slope=0.1)], ids=["plain", "abs", "pool", "leaky"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_conv1d_launch_count_is_the_plan_length(epilogue, fused):
    from rlx_triton.ops import conv as ops

    x, w = torch.empty(2, 7, 80, device="meta"), torch.empty(5, 7, 3, device="meta")
    candidate = DEFAULT if fused else tconv.all_candidates()[-1]
    plan, _ = tconv.conv1d_plan(x, w, None, epilogue=epilogue, candidate=candidate)
    assert len(plan) == tconv.launch_count(ops._conv1d_request(x, w, epilogue=epilogue), candidate)


def test_sincnet_plans_on_meta_tensors_at_the_bench_shape():
    """32 chunks of 10 s plan without data: the chunked waveform statistics, then the three blocks."""
    wav = torch.empty(32, 1, 160000, device="meta")
    filters = torch.empty(80, 1, 251, device="meta")
    vec = lambda n: torch.empty(n, device="meta")   # noqa: E731
    convs = [torch.empty(60, 80, 5, device="meta"), torch.empty(60, 60, 5, device="meta")]
    with launches.planning() as log:
        out = tconv.sincnet(wav, filters, vec(1), vec(1), convs, [vec(60), vec(60)], [vec(80), vec(60), vec(60)],
                            [vec(80), vec(60), vec(60)], candidate=DEFAULT)
    assert out.shape == (32, 60, 589) and out.device.type == "meta"
    assert [r.name for r in log.records] == [
        "_row_partial_stats_kernel", "_row_combine_stats_kernel", "_conv1d_kernel", "_row_norm_kernel",
        "_conv1d_kernel", "_row_norm_kernel", "_conv1d_kernel", "_row_norm_kernel"]
    assert log.records[2].grid == (triton.cdiv(5325, 64), 3, 32)       # arbitrary filters: the direct conv


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32x3", "tf32"])
def test_tf32_candidates_measured_on_gpu(precision):
    """GPU evidence for the TF32 candidates (the interpreter cannot round to TF32)."""
    module = random_sincnet().cuda()
    wav = torch.randn(4, 1, 16000, device="cuda")
    out = _run_sincnet(module, wav, tconv.make_candidate(tile_pos=128, tile_co=64, tile_k=32, precision=precision))
    ref = sincnet_float64(module.cpu(), wav.cpu())
    print(f"sincnet {precision}: rel err {rel_err(out.cpu(), ref):.2e}")
    assert rel_err(out.cpu(), ref) <= (1e-4 if precision == "tf32x3" else 1e-2)


@pytest.mark.gpu
def test_sincnet_on_gpu_matches_the_module_on_10s_chunks():
    """The pyannote shape on a real GPU (default candidate, true fp32) against the fp32 module, TF32 off."""
    import rlx_triton as rt
    from rlx_triton.nn.conv import SincNet

    torch.backends.cudnn.allow_tf32 = False
    module = random_sincnet().cuda()
    wav = torch.randn(4, 1, 160000, device="cuda")
    with torch.no_grad(), rt.use_backend("triton", strict=True):
        out = SincNet.from_pyannote(module)(wav)
    with torch.no_grad():
        ref = module(wav)
    assert out.shape == (4, 60, 589)
    assert rel_err(out, ref) <= 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("candidate", [c for c in tconv.all_candidates() if c.tag() in tconv.APPROVALS],
                         ids=tconv.candidate_tag)
def test_gpu_symmetric_sinc_conv_and_blocks_hold_their_approval(candidate):
    """Each approved candidate through the symmetric sinc kernel and the Conv1d blocks on a GPU, 10 s chunks."""
    module = random_sincnet().cuda()
    wav = torch.randn(2, 1, 160000, device="cuda")
    with launches.recording() as log:
        out = _run_sincnet(module, wav, candidate)
    assert "_sinc_conv_kernel" in log.kernels
    assert rel_err(out.cpu(), sincnet_float64(module.cpu(), wav.cpu())) <= 1e-4
