"""Triton conv2d / linear / stats_pool kernels (interpreter on CPU) against float64 references.

Each test runs one candidate (the interpreter recipe, widest ieee tiles); the sweep test runs every conv
candidate of the plan and re-measures its accuracy approval.
"""
import pytest
import torch

from rlx_triton.backends.triton import conv2d as K
from rlx_triton.backends.triton.conv2d import kernels as conv2d_kernels
from rlx_triton.backends.triton.conv2d import launch as conv2d_launch
from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton._tf32 import split_tf32
from tests.reference.conv import assert_matches_float64
from tests.reference.conv2d import (TF32_RTOL, assert_close_ref, conv2d64, linear64, rel_err, stats_pool64)

CAND = K.make_candidate(tile_pos=128, tile_co=64, tile_k=32, tg_size=256, stages=3)

# (batch, c_in, c_out, height, width, kernel, stride, padding): ResNet trunk geometry plus odd sizes
SHAPES = [
    (1, 1, 7, 7, 9, 3, 1, 1),     # the stem: one input channel
    (2, 5, 7, 9, 11, 3, 1, 1),
    (1, 7, 33, 8, 7, 3, 2, 1),    # downsampling 3x3
    (2, 17, 6, 5, 9, 1, 2, 0),    # downsampling shortcut 1x1
    (1, 33, 17, 3, 5, 1, 1, 0),
    (3, 3, 4, 1, 1, 3, 1, 1),     # 1x1 image, 3x3 kernel: only the centre tap is inside
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("epilogue", ["plain", "bias_relu", "bias_residual_relu"])
def test_conv2d_matches_float64(shape, epilogue):
    b, ci, co, h, w, k, s, p = shape
    x = torch.randn(b, ci, h, w)
    weight = torch.randn(co, ci, k, k)
    bias = torch.randn(co) if epilogue != "plain" else None
    out_h, out_w = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    residual = torch.randn(b, co, out_h, out_w) if epilogue == "bias_residual_relu" else None
    relu = epilogue != "plain"
    y = K.conv2d(x, weight, bias, stride=s, padding=p, residual=residual, relu=relu, candidate=CAND)
    ref = conv2d64(x, weight, bias, stride=s, padding=p, residual=residual, relu=relu)
    assert y.shape == ref.shape and y.dtype == torch.float32
    assert_close_ref(y, ref, torch.float32, ci * k * k)


def test_both_reduction_orders_agree(monkeypatch):
    """Fewer than 16 input channels fold the taps into each reduction chunk; the tap-major order gives
    the same convolution."""
    x, weight, bias = torch.randn(2, 5, 9, 8), torch.randn(6, 5, 3, 3), torch.randn(6)
    folded = K.conv2d(x, weight, bias, stride=2, padding=1, relu=True, candidate=CAND)
    monkeypatch.setattr(conv2d_launch, "FOLD_TAPS_BELOW", 1)
    tap_major = K.conv2d(x, weight, bias, stride=2, padding=1, relu=True, candidate=CAND)
    torch.testing.assert_close(folded, tap_major, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", [(2, 3, 0, 1), (2, 3, 1, 0)], ids=["c_in_contiguous", "c_out_contiguous"])
@pytest.mark.parametrize("c_in", [6, 20], ids=["folded_taps", "tap_major"])
def test_conv2d_reads_a_packed_weight_through_its_strides(order, c_in):
    x, weight = torch.randn(2, c_in, 7, 5), torch.randn(9, c_in, 3, 3)
    inverse = [order.index(i) for i in range(4)]
    packed = weight.permute(*order).contiguous().permute(*inverse)
    assert torch.equal(packed, weight) and not packed.is_contiguous()
    y = K.conv2d(x, packed, None, stride=1, padding=1, candidate=CAND)
    assert_close_ref(y, conv2d64(x, weight, padding=1), torch.float32, 9 * c_in)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_conv2d_half_inputs_accumulate_in_fp32_and_return_their_dtype(dtype):
    x = torch.randn(2, 8, 6, 7).to(dtype)
    weight, bias = torch.randn(5, 8, 3, 3), torch.randn(5)
    residual = torch.randn(2, 5, 3, 4).to(dtype)
    y = K.conv2d(x, weight, bias, stride=2, padding=1, residual=residual, relu=True, candidate=CAND)
    assert y.dtype == dtype
    ref = conv2d64(x, weight, bias, stride=2, padding=1, residual=residual, relu=True)
    assert_close_ref(y, ref, dtype, 72)


def test_unfused_epilogue_gives_the_fused_result():
    x, weight, bias = torch.randn(2, 6, 7, 9), torch.randn(10, 6, 3, 3), torch.randn(10)
    residual = torch.randn(2, 10, 7, 9)
    fused = K.conv2d(x, weight, bias, stride=1, padding=1, residual=residual, relu=True, candidate=CAND)
    split = K.make_candidate(tile_pos=64, tile_co=16, tile_k=16, fuse_epilogue=False)
    unfused = K.conv2d(x, weight, bias, stride=1, padding=1, residual=residual, relu=True, candidate=split)
    torch.testing.assert_close(unfused, fused, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows,inp,out", [(1, 16, 7), (3, 333, 17), (33, 80, 64)])
def test_linear_is_a_one_pixel_conv(rows, inp, out):
    x, weight, bias = torch.randn(rows, inp), torch.randn(out, inp), torch.randn(out)
    y = K.linear(x, weight, bias, candidate=CAND)
    assert y.shape == (rows, out)
    assert_close_ref(y, linear64(x, weight, bias), torch.float32, inp)


@pytest.mark.parametrize("batch,features,frames", [(1, 1, 1), (2, 7, 33), (3, 80, 130)])
def test_stats_pool_is_mean_and_unbiased_std(batch, features, frames):
    x = torch.randn(batch, features, frames) * 3 + 1
    y = K.stats_pool(x)
    assert y.shape == (batch, 2 * features)
    assert_close_ref(y, stats_pool64(x), torch.float32, frames)


def test_stats_pool_of_one_frame_has_zero_std():
    y = K.stats_pool(torch.randn(2, 5, 1))
    assert torch.equal(y[:, 5:], torch.zeros(2, 5))


@pytest.mark.parametrize("speakers", [1, 3])
def test_weighted_stats_pool_follows_pyannote(speakers):
    x = torch.randn(2, 9, 70)
    weights = torch.rand(2, speakers, 70)
    weights[:, :, :20] = 0.0  # inactive frames
    y = K.stats_pool(x, weights)
    assert y.shape == (2, speakers, 18)
    assert_close_ref(y, stats_pool64(x, weights), torch.float32, 70)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_stats_pool_half_inputs(dtype):
    x = torch.randn(2, 6, 40).to(dtype)
    weights = torch.rand(2, 1, 40).to(dtype)
    y = K.stats_pool(x, weights)
    assert y.dtype == dtype
    assert_close_ref(y, stats_pool64(x, weights), dtype, 40)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_relu_keeps_nan_and_inf_like_torch(fused):
    """relu(NaN) is NaN in torch; a plain max(x, 0) on a GPU (and in the interpreter) returns 0."""
    x = torch.randn(2, 3, 6, 5)
    x[0, 0, 2, 2] = float("nan")
    x[1, 2, 0, 0] = float("inf")
    weight, bias = torch.randn(4, 3, 3, 3), torch.randn(4)
    residual = torch.randn(2, 4, 6, 5)
    residual[1, 3, 5, 4] = -float("inf")
    cand = CAND if fused else K.make_candidate(tile_pos=64, tile_co=16, tile_k=16, fuse_epilogue=False)
    y = K.conv2d(x, weight, bias, stride=1, padding=1, residual=residual, relu=True, candidate=cand)
    ref = conv2d64(x, weight, bias, stride=1, padding=1, residual=residual, relu=True)
    assert ref.isnan().any() and ref.isinf().any()
    assert_matches_float64(y, ref, 1e-5, reduced=27)


@pytest.mark.parametrize("frames", [1, 7, 130])
def test_stats_pool_of_constant_rows_has_exactly_zero_std(frames):
    """Shifted statistics: a constant row sums to exactly 0 about its first frame, whatever its offset."""
    x = torch.tensor([0.0, 0.5, -100.0, 1e4, 3.3]).view(1, 5, 1).expand(2, 5, frames).contiguous()
    y = K.stats_pool(x)
    assert torch.equal(y[:, :5], x[:, :, 0]) and torch.equal(y[:, 5:], torch.zeros(2, 5))


def test_stats_pool_keeps_the_digits_of_an_offset():
    x = 1e4 + 0.01 * torch.randn(2, 6, 90)
    weights = torch.rand(2, 2, 90)
    assert rel_err(K.stats_pool(x)[:, 6:], stats_pool64(x)[:, 6:]) <= 1e-4
    assert rel_err(K.stats_pool(x, weights)[..., 6:], stats_pool64(x, weights)[..., 6:]) <= 1e-4


def test_every_conv_candidate_meets_its_approval():
    """The sweep: every conv candidate of the plan runs conv2d (3x3 stride 2 + residual + relu, and a 1x1
    projection); approved candidates must hold their stated bound, the others the TF32 tolerance."""
    x, weight, bias = torch.randn(2, 19, 9, 7), torch.randn(21, 19, 3, 3), torch.randn(21)
    residual = torch.randn(2, 21, 5, 4)
    ref = conv2d64(x, weight, bias, stride=2, padding=1, residual=residual, relu=True)
    rows, proj = torch.randn(5, 70), torch.randn(9, 70)
    ref_proj = linear64(rows, proj)
    candidates = K.all_candidates()
    assert len(candidates) >= 2
    for cand in candidates:
        y = K.conv2d(x, weight, bias, stride=2, padding=1, residual=residual, relu=True, candidate=cand)
        err = max(rel_err(y, ref), rel_err(K.linear(rows, proj, candidate=cand), ref_proj))
        approval = K.APPROVALS.get(K.candidate_tag(cand))
        bound = approval.max_rel_err if approval is not None else TF32_RTOL
        assert err <= bound, f"{K.candidate_tag(cand)}: rel err {err:.2e} > {bound:.1e}"


def test_only_true_fp32_candidates_are_approved():
    for cand in K.all_candidates():
        assert (K.candidate_tag(cand) in K.APPROVALS) == (cand.precision in ("ieee", "tf32x3"))


def test_audit_specs_list_every_constexpr_and_every_candidate():
    for spec in K.AUDIT_KERNELS:
        constexprs = {name for name, kind in spec.signature.items() if kind == "constexpr"}
        for cand in spec.candidates:
            meta = spec.meta(cand, "fp32")
            assert constexprs == set(meta) - {"num_warps", "num_stages"}, spec.name
        if spec.kernel is conv2d_kernels._conv2d_kernel:
            assert len(spec.candidates) == len(K.all_candidates())


def test_routed_calls_go_through_the_autotune_bridge_with_the_routed_candidate():
    """With a route, the launch injects the route's candidate into the tuned kernel's cache (no tuning in
    the interpreter) and runs it; approved fused candidates are the only configs."""
    import rlx_triton as rt
    from rlx_triton.ops import conv2d as ops

    x, weight, bias = torch.randn(3, 5, 7, 6), torch.randn(8, 5, 3, 3), torch.randn(8)
    route = rt.explain(ops.conv2d, x, weight, bias, padding=1, relu=True)
    tuned = K.tuned_kernel()
    assert set(tuned.tags) == {K.candidate_tag(c) for c in K.all_candidates()
                               if c.fuse_epilogue and K.candidate_tag(c) in K.APPROVALS}
    y = K.conv2d(x, weight, bias, padding=1, relu=True, candidate=route.candidate, route=route)
    assert_close_ref(y, conv2d64(x, weight, bias, padding=1, relu=True), torch.float32, 45)
    # x, weight, its split terms, its Winograd halves (the split terms where Winograd does not apply), bias,
    # residual, out
    key = (4, 5, 8, 7, 6, 1, 3, 3) + ("torch.float32",) * 7
    assert tuned.winner(key) == route.candidate_tag


# ------------------------------------------------------------------------------ tf32x3 (TF32 tensor cores)

TF32X3 = [c for c in K.all_candidates() if c.precision == "tf32x3"]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("cand", TF32X3, ids=K.candidate_tag)
def test_tf32x3_conv2d_matches_float64(shape, cand):
    """The split-operand GEMM (pixels x channels, one 4-term TF32 dot per step) holds the fp32 bound on the
    trunk geometries and odd sizes, with bias, residual and ReLU; the interpreter runs the kernel's own TF32
    splitting, so this is the error a GPU's tensor cores give (up to summation order)."""
    batch, c_in, c_out, h, w, k, stride, padding = shape
    x = torch.randn(batch, c_in, h, w)
    weight = torch.randn(c_out, c_in, k, k) / (c_in * k * k) ** 0.5
    bias = torch.randn(c_out)
    out_h, out_w = (h + 2 * padding - k) // stride + 1, (w + 2 * padding - k) // stride + 1
    residual = torch.randn(batch, c_out, out_h, out_w)
    y = K.conv2d(x, weight, bias, stride=stride, padding=padding, residual=residual, relu=True, candidate=cand)
    ref = conv2d64(x, weight, bias, stride=stride, padding=padding, residual=residual, relu=True)
    assert_close_ref(y, ref, torch.float32, c_in * k * k)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tf32x3_conv2d_half_inputs(dtype):
    x, weight, bias = torch.randn(2, 20, 7, 9).to(dtype), torch.randn(16, 20, 3, 3) / 13, torch.randn(16)
    y = K.conv2d(x, weight, bias, padding=1, relu=True, candidate=TF32X3[-1])
    assert y.dtype == dtype
    assert_close_ref(y, conv2d64(x, weight, bias, padding=1, relu=True), dtype, 180)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_tf32x3_conv2d_propagates_nan_and_keeps_finite_outputs_finite():
    """NaN reaches the outputs torch gives NaN; an Inf input gives non-finite outputs where torch's are
    non-finite (NaN where the weight it meets is exactly a TF32 value: inf * 0 in its low half); every other
    output is finite and within the bound."""
    x = torch.randn(2, 20, 6, 5)
    x[0, 0, 2, 2] = float("nan")
    x[1, 3, 0, 0] = float("inf")
    weight, bias = torch.randn(16, 20, 3, 3) / 13, torch.randn(16)
    y = K.conv2d(x, weight, bias, padding=1, candidate=TF32X3[-1])
    ref = conv2d64(x, weight, bias, padding=1)
    assert torch.equal(torch.isfinite(y), torch.isfinite(ref)) and y[ref.isnan()].isnan().all()
    finite = torch.isfinite(ref)
    assert_close_ref(y[finite], ref[finite], torch.float32, 180)


def test_split_weights_are_packed_tap_major_as_every_hi_then_every_lo_and_cached():
    weight = torch.randn(8, 5, 3, 3)
    k = 9 * 5
    terms = K.split_weights(weight)
    assert terms.shape == (8, 2 * k) and K.split_weights(weight) is terms       # once per weight version
    hi, lo = terms[:, :k], terms[:, k:]
    tf32_bits = torch.tensor(0x1FFF, dtype=torch.int32)
    assert not (hi.view(torch.int32) & tf32_bits).any() and not (lo.view(torch.int32) & tf32_bits).any()
    torch.testing.assert_close(hi + lo, weight.permute(0, 2, 3, 1).reshape(8, -1), rtol=2 ** -20, atol=0)
    weight.mul_(2.0)
    assert not torch.equal(K.split_weights(weight), terms)


# ------------------------------------------------------------------------------ Winograd F(2, 3) (3x3, stride 1)

# (batch, c_in, c_out, height, width, padding): odd and even widths (a last pair with one pixel), one column,
# c_in past one chunk, every padding a 3x3 takes
WINOGRAD_SHAPES = [
    (2, 20, 16, 6, 5, 1),
    (1, 33, 17, 7, 8, 1),
    (1, 16, 7, 1, 1, 1),      # one pixel: only the centre tap is inside
    (1, 17, 5, 5, 9, 0),
    (2, 16, 33, 4, 7, 2),
    (1, 80, 16, 3, 1, 1),     # one column: every pair's right pixel is past the row
]


@pytest.mark.parametrize("shape", WINOGRAD_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("cand", TF32X3, ids=K.candidate_tag)
def test_winograd_conv2d_matches_float64(shape, cand):
    """A tf32x3 3x3 stride-1 conv over >= 16 channels runs Winograd F(2, 3) along the rows and holds the fp32
    bound, with bias, residual and ReLU, at every padding and width."""
    batch, c_in, c_out, h, w, padding = shape
    x = torch.randn(batch, c_in, h, w)
    weight = torch.randn(c_out, c_in, 3, 3) / (c_in * 9) ** 0.5
    bias = torch.randn(c_out)
    out_h, out_w = h + 2 * padding - 2, w + 2 * padding - 2
    residual = torch.randn(batch, c_out, out_h, out_w)
    (record,), _ = K.conv2d_plan(x, weight, bias, padding=padding, residual=residual, relu=True, candidate=cand)
    assert record.meta["WINOGRAD"]
    y = K.conv2d(x, weight, bias, padding=padding, residual=residual, relu=True, candidate=cand)
    ref = conv2d64(x, weight, bias, padding=padding, residual=residual, relu=True)
    assert_close_ref(y, ref, torch.float32, c_in * 9)


@pytest.mark.parametrize("c_in,kernel,stride,applies", [(16, 3, 1, True), (15, 3, 1, False), (32, 3, 2, False),
                                                        (32, 1, 1, False), (256, 3, 1, True)])
def test_winograd_applies_to_3x3_stride_1_layers_of_16_channels_or_more(c_in, kernel, stride, applies):
    assert K.winograd_applies(c_in, kernel, kernel, stride) is applies
    x, weight = torch.empty(1, c_in, 8, 8, device="meta"), torch.empty(8, c_in, kernel, kernel, device="meta")
    (record,), _ = K.conv2d_plan(x, weight, stride=stride, padding=kernel // 2, candidate=TF32X3[0])
    assert record.meta["WINOGRAD"] is applies
    (ieee,), _ = K.conv2d_plan(x, weight, stride=stride, padding=kernel // 2, candidate=CAND)
    assert ieee.meta.get("WINOGRAD") is False or not applies   # the ieee form is direct whatever the flag


def test_winograd_record_counts_four_products_a_pair_and_kernel_row():
    """(2, 20, 7, 9) 3x3 -> 16 on the 128 x 32 tile: 2 x 7 x 5 = 70 pairs in one 64-pair tile, 3 rows x 2 chunks
    of 16 channels x 4 transformed columns; the weights read are the transformed halves, 2 x 12 x 20 a channel."""
    x, weight, res = torch.randn(2, 20, 7, 9), torch.randn(16, 20, 3, 3), torch.randn(2, 16, 7, 9)
    cand = TF32X3[0]
    (record,), _ = K.conv2d_plan(x, weight, padding=1, residual=res, relu=True, candidate=cand)
    pairs = cand.tile_pos // 2
    assert record.grid == (-(-70 // pairs), 1) and record.unit == "tf32x3"
    assert record.flops == 2 * record.grid[0] * 3 * 2 * 16 * 4 * pairs * cand.tile_co
    assert record.bytes_read == 4 * (x.numel() + 16 * 2 * 12 * 20 + res.numel())


def test_winograd_weights_are_each_rows_transform_split_into_halves_and_cached():
    weight = torch.randn(8, 5, 3, 3, dtype=torch.float64).float()
    k = 12 * 5
    halves = K.winograd_weights(weight)
    assert halves.shape == (8, 2 * k) and K.winograd_weights(weight) is halves      # once per weight version
    g = weight.double()
    g0, g1, g2 = g[..., 0], g[..., 1], g[..., 2]
    u = torch.stack((g0, (g0 + g1 + g2) / 2, (g0 - g1 + g2) / 2, g2), dim=-1).permute(0, 2, 3, 1).reshape(8, k)
    hi, lo = split_tf32(u.float())                    # the transform rounded once to fp32, then split
    assert torch.equal(halves, torch.cat((hi, lo), dim=1))
    torch.testing.assert_close((hi + lo).double(), u, rtol=2 ** -20, atol=0)
    weight.mul_(2.0)
    assert not torch.equal(K.winograd_weights(weight), halves)


def test_winograd_gives_the_direct_forms_infinities_where_an_input_is_infinite():
    """An infinite input meets both signs in the transform (inf - inf): its tile is recomputed directly, so the
    outputs it reaches are +inf (positive weights), as torch's, and the NaN input's outputs are NaN."""
    x = torch.rand(1, 16, 5, 6)
    x[0, 3, 2, 2] = float("inf")
    x[0, 5, 0, 5] = float("nan")
    weight = torch.rand(8, 16, 3, 3) / 12
    y = K.conv2d(x, weight, padding=1, candidate=TF32X3[0])
    ref = conv2d64(x, weight, padding=1)
    assert torch.equal(y.isinf(), ref.isinf()) and torch.equal(y.isnan(), ref.isnan()) and ref.isinf().any()
    finite = torch.isfinite(ref)
    assert_close_ref(y[finite], ref[finite], torch.float32, 16 * 9)


def test_winograd_recomputes_a_tile_whose_transformed_sum_overflows():
    """Two neighbouring inputs near fp32's largest value overflow d1 + d2 in the transform; the direct sums do
    not, and the tile's outputs are the direct form's finite values."""
    x = torch.randn(1, 16, 4, 6)
    x[0, 2, 1, 2] = x[0, 2, 1, 3] = 3e38
    weight = torch.randn(8, 16, 3, 3) * 1e-3
    y = K.conv2d(x, weight, padding=1, candidate=TF32X3[0])
    ref = conv2d64(x, weight, padding=1)
    assert torch.isfinite(ref).all() and torch.isfinite(y).all()
    assert_close_ref(y, ref, torch.float32, 16 * 9)


@pytest.mark.parametrize("fill", [0.0, 3.0, -1e-30], ids=["silence", "constant", "tiny_constant"])
def test_winograd_conv2d_of_silence_and_constant_input_matches_float64(fill):
    """Zeros give the bias (every product 0); a constant input gives the weight sums inside and the padded sums
    at the edges, with no transform residue (d1 + d2 and d0 - d2 of equal columns)."""
    x = torch.full((2, 20, 5, 7), fill)
    weight, bias = torch.randn(16, 20, 3, 3) / 13, torch.randn(16)
    y = K.conv2d(x, weight, bias, padding=1, relu=True, candidate=TF32X3[0])
    ref = conv2d64(x, weight, bias, padding=1, relu=True)
    assert_close_ref(y, ref, torch.float32, 20 * 9)


def test_winograd_conv2d_under_inference_mode_and_with_inference_tensor_weights():
    """pyannote runs models under torch.inference_mode(): the transformed weights are prepared from inference
    tensors there, and again from the same weights outside it."""
    with torch.inference_mode():
        x, weight, bias = torch.randn(2, 20, 6, 7), torch.randn(16, 20, 3, 3) / 13, torch.randn(16)
        inside = K.conv2d(x, weight, bias, padding=1, relu=True, candidate=TF32X3[0])
    outside = K.conv2d(x.clone(), weight, bias, padding=1, relu=True, candidate=TF32X3[0])
    ref = conv2d64(x, weight, bias, padding=1, relu=True)
    assert_close_ref(inside, ref, torch.float32, 20 * 9)
    assert_close_ref(outside, ref, torch.float32, 20 * 9)


def test_winograd_conv2d_from_several_threads_at_once_uses_each_weights_own_transform():
    """Four threads, each with its own weight, call at once: each weight's transform is prepared and cached
    for that weight, and every result matches its float64 reference."""
    from concurrent.futures import ThreadPoolExecutor

    x = torch.randn(1, 16, 4, 6)
    weights = [torch.randn(8, 16, 3, 3) / 12 for _ in range(4)]

    def run(weight):
        return [K.conv2d(x, weight, padding=1, candidate=TF32X3[0]) for _ in range(2)]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, weights))
    for weight, outs in zip(weights, results):
        for y in outs:
            assert_close_ref(y, conv2d64(x, weight, padding=1), torch.float32, 16 * 9)


@pytest.mark.gpu
def test_gpu_winograd_keeps_the_direct_forms_values_where_a_value_is_not_finite():
    """On CUDA, layer-sized: an infinite input's outputs are the direct form's infinities, an overflowing
    transformed sum's tile the direct form's finite values, every other output within the fp32 bound."""
    x = torch.rand(2, 64, 10, 15)
    x[0, 3, 4, 4] = float("inf")
    x[1, 7, 2, 6] = x[1, 7, 2, 7] = 3e38
    weight = torch.rand(64, 64, 3, 3) * 1e-3
    y = K.conv2d(x.cuda(), weight.cuda(), padding=1, candidate=TF32X3[0]).cpu()
    ref = conv2d64(x, weight, padding=1)
    assert torch.equal(y.isinf(), ref.isinf()) and not y.isnan().any() and ref.isinf().any()
    finite = torch.isfinite(ref)
    assert rel_err(y[finite], ref[finite]) <= K.APPROVALS[K.candidate_tag(TF32X3[0])].max_rel_err


# ------------------------------------------------------------------------------ recipes


def _trunk_layers():
    from rlx_triton.perf.cases import embedding_cases

    return [spec for spec in embedding_cases(gpu=True) if "c_in" in spec]


@pytest.mark.parametrize("device", ["h200", "a100"])
def test_every_trunk_layer_routes_to_its_fitted_tf32x3_recipe(device):
    """As on an H200 / A100: each conv geometry of the ResNet34 trunk gets a built-in true-fp32 recipe whose
    channel tile divides the layer's channels (32 on the stem and the Winograd layers, 64 on the downsampling
    ones): no first-call tuning."""
    import rlx_triton as rt
    from rlx_triton.devices import profile
    from rlx_triton.ops import conv2d as ops
    from rlx_triton.perf.trace import as_compiled
    from rlx_triton.router.device import routing_as

    meta = lambda *shape: torch.empty(*shape, device="meta")   # noqa: E731
    with as_compiled(), routing_as(profile(device)):
        for spec in _trunk_layers():
            k, c_out = spec["kernel"], spec["c_out"]
            x, weight = meta(32, spec["c_in"], spec["height"], spec["width"]), meta(c_out, spec["c_in"], k, k)
            route = rt.explain(ops.conv2d, x, weight, meta(c_out), stride=spec["stride"], padding=spec["padding"],
                               relu=True)
            assert route.evidence == "Recipe" and route.candidate.precision == "tf32x3", spec["layer"]
            # the Winograd layers (3x3, stride 1, >= 16 channels) on the 32-channel tile, the others 64 wide
            winograd = K.winograd_applies(spec["c_in"], k, k, spec["stride"])
            assert route.candidate.tile_co == (32 if winograd else min(c_out, 64)), spec["layer"]
        # seg_1 streams its weights on 8 CTAs: the ieee tile reads them once (the split halves twice)
        seg_1 = rt.explain(ops.linear, meta(32, 5120), meta(256, 5120), meta(256))
        assert seg_1.evidence == "Recipe" and seg_1.candidate.precision == "ieee"


def test_a_recipe_route_is_not_tuned_even_where_tuning_is_on(monkeypatch):
    """A built-in recipe is evidence: the bridge injects it and benchmarks nothing (`rlx-triton tune` refines it)."""
    import dataclasses

    import rlx_triton as rt
    from rlx_triton.backends.triton import autotune
    from rlx_triton.config import override_settings
    from rlx_triton.ops import conv2d as ops

    x, weight = torch.randn(1, 5, 4, 4), torch.randn(8, 5, 3, 3)
    route = dataclasses.replace(rt.explain(ops.conv2d, x, weight, padding=1), evidence="Recipe")
    benched = []
    monkeypatch.setattr(autotune, "interpreter_bench", lambda fn, quantiles=None: benched.append(fn) or 0.0)
    with override_settings(tune=True):
        assert autotune.tuning_allowed(dataclasses.replace(route, evidence="DeviceDefault"), x.device)
        assert not autotune.tuning_allowed(route, x.device)
        y = K.conv2d(x, weight, padding=1, candidate=route.candidate, route=route)
    assert benched == []
    assert_close_ref(y, conv2d64(x, weight, padding=1), torch.float32, 45)


# ------------------------------------------------------------------------------ launch plans


def test_conv2d_runs_exactly_its_plan():
    x, weight, bias, res = torch.randn(2, 20, 7, 9), torch.randn(16, 20, 3, 3), torch.randn(16), torch.randn(2, 16, 7, 9)
    for candidate in (CAND, K.all_candidates()[-1]):          # fused; unfused (GEMM + epilogue pass)
        with launches.recording() as log:
            out = K.conv2d(x, weight, bias, padding=1, residual=res, relu=True, candidate=candidate)
        plan, planned = K.conv2d_plan(x, weight, bias, padding=1, residual=res, relu=True, candidate=candidate)
        assert log.outside == [] and [r.describe() for r in log.records] == [r.describe() for r in plan]
        assert len(plan) == (1 if candidate.fuse_epilogue else 2)
        launches.run(plan)
        assert torch.equal(planned, out)


def test_conv2d_record_is_the_hand_count():
    """(2, 20, 7, 9) 3x3 -> 16 with 128 x 64 x 32 tiles: 126 pixels in one tile, 9 taps x one 32-channel chunk."""
    x, weight, bias, res = torch.randn(2, 20, 7, 9), torch.randn(16, 20, 3, 3), torch.randn(16), torch.randn(2, 16, 7, 9)
    (record,), _ = K.conv2d_plan(x, weight, bias, padding=1, residual=res, relu=True, candidate=CAND)
    assert record.grid == (1, 1) and record.num_warps == 8 and record.num_stages == 3
    assert record.flops == 2 * 9 * 32 * 128 * 64 and record.unit == "fp32_fma"
    assert record.bytes_read == 4 * (x.numel() + weight.numel() + 16 + res.numel())
    assert record.bytes_written == 4 * res.numel()
    stem = K.make_candidate(tile_pos=64, tile_co=32, tile_k=16, precision="tf32x3")
    (folded,), _ = K.conv2d_plan(torch.randn(1, 1, 8, 8), torch.randn(32, 1, 3, 3), candidate=stem, padding=1)
    # tf32x3: three TF32 products per fp32 product (three separate TF32 dots of its halves)
    assert folded.meta["FOLD_TAPS"] and folded.flops == 2 * 1 * 16 * 64 * 32 and folded.unit == "tf32x3"


def test_a_routed_conv2d_is_a_tuned_record_with_the_routes_config():
    import rlx_triton as rt
    from rlx_triton.ops import conv2d as ops

    x, weight, bias = torch.randn(3, 5, 7, 6), torch.randn(8, 5, 3, 3), torch.randn(8)
    route = rt.explain(ops.conv2d, x, weight, bias, padding=1, relu=True)
    with launches.recording() as log:
        K.conv2d(x, weight, bias, padding=1, relu=True, candidate=route.candidate, route=route)
    (record,) = log.records
    config = K.tuned_kernel().config_of(route.candidate)
    assert record.kernel is K.tuned_kernel() and record.route is route and log.outside == []
    assert {key: record.meta[key] for key in config.kwargs} == config.kwargs
    assert record.grid == (-(-3 * 7 * 6 // config.kwargs["BLOCK_P"]), 1)
    assert record.num_warps == config.num_warps and record.num_stages == config.num_stages


@pytest.mark.parametrize("op", ["conv2d", "conv2d_unfused", "linear", "stats_pool", "stats_pool_weighted"])
def test_launch_count_is_the_plan_length(op):
    from rlx_triton.ops import conv2d as ops

    meta = lambda *shape: torch.empty(*shape, device="meta")   # noqa: E731
    if op.startswith("conv2d"):
        candidate = CAND if op == "conv2d" else K.all_candidates()[-1]
        x, w = meta(2, 20, 7, 9), meta(16, 20, 3, 3)
        request = ops._conv2d_request(x, w, meta(16), padding=1, relu=True)
        plan, _ = K.conv2d_plan(x, w, meta(16), padding=1, relu=True, candidate=candidate)
    elif op == "linear":
        candidate, x, w = CAND, meta(3, 33), meta(17, 33)
        request = ops._linear_request(x, w)
        plan, _ = K.linear_plan(x, w, candidate=candidate)
    else:
        weights = meta(2, 3, 33) if op.endswith("weighted") else None
        candidate, x = CAND, meta(2, 7, 33)
        request = ops._stats_pool_request(x, weights)
        plan, _ = K.stats_pool_plan(x, weights, candidate=candidate)
    assert len(plan) == K.launch_count(request, candidate) >= 1


def test_trunk_layers_plan_on_meta_tensors():
    """layer1 of the bench (32, 32, 80, 998) 3x3 -> 32: 2.55 M pixels in 128-pixel tiles, no data needed."""
    x, w = torch.empty(32, 32, 80, 998, device="meta"), torch.empty(32, 32, 3, 3, device="meta")
    with launches.planning() as log:
        out = K.conv2d(x, w, torch.empty(32, device="meta"), padding=1, residual=torch.empty_like(x), relu=True,
                       candidate=CAND)
    assert out.shape == (32, 32, 80, 998) and [r.grid for r in log.records] == [(-(-32 * 80 * 998 // 128), 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["ieee", "tf32x3", "tf32"])
def test_gpu_precision_errors_on_a_trunk_layer(precision):
    """On CUDA the dot really rounds: approved precisions must hold their bound on a layer3-sized conv."""
    x = torch.randn(4, 128, 20, 125, device="cuda")
    weight, bias = torch.randn(128, 128, 3, 3, device="cuda") / 34, torch.randn(128, device="cuda")
    cand = K.make_candidate(tile_pos=128, tile_co=64, tile_k=32, tg_size=256, stages=3, precision=precision)
    y = K.conv2d(x, weight, bias, stride=1, padding=1, relu=True, candidate=cand)
    ref = conv2d64(x.cpu(), weight.cpu(), bias.cpu(), padding=1, relu=True)
    approval = K.APPROVALS.get(K.candidate_tag(cand))
    bound = approval.max_rel_err if approval is not None else TF32_RTOL
    assert rel_err(y.cpu(), ref) <= bound


@pytest.mark.gpu
@pytest.mark.parametrize("cand", TF32X3, ids=K.candidate_tag)
@pytest.mark.parametrize("layer", ["stem", "layer1", "layer2.0", "layer4"])
def test_gpu_tf32x3_recipes_hold_the_fp32_bound_on_trunk_layers(cand, layer):
    """The split GEMM on real tensor cores (a GPU's TF32 MMAs and cp.async pipeline) at trunk geometries, 4 chunks."""
    c_in, c_out, h, w, stride = {"stem": (1, 32, 80, 998, 1), "layer1": (32, 32, 80, 998, 1),
                                 "layer2.0": (32, 64, 80, 998, 2), "layer4": (256, 256, 10, 125, 1)}[layer]
    x = torch.randn(4, c_in, h, w, device="cuda")
    weight = torch.randn(c_out, c_in, 3, 3, device="cuda") / (9 * c_in) ** 0.5
    bias = torch.randn(c_out, device="cuda")
    y = K.conv2d(x, weight, bias, stride=stride, padding=1, relu=True, candidate=cand)
    ref = conv2d64(x.cpu(), weight.cpu(), bias.cpu(), stride=stride, padding=1, relu=True)
    assert rel_err(y.cpu(), ref) <= K.APPROVALS[K.candidate_tag(cand)].max_rel_err
