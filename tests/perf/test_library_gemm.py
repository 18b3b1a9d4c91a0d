"""cuBLAS GEMM model (rlx_triton.perf.library.gemm): tiles, wave quantisation, split-K, bytes, what it refuses."""
import pytest

from rlx_triton.devices import profile
from rlx_triton.perf.library import Unmodelled, kernels_of, models
from rlx_triton.perf.library.gemm import SIMT_TILES, plan_gemm, tiles_for
from rlx_triton.perf.roofline import library_estimate

H200 = profile("h200")
A100 = profile("a100")


def _us(kernels, gpu=H200) -> float:
    return library_estimate(kernels, gpu)["est_us"]


def test_every_published_gemm_impl_has_a_model():
    registered = models()
    for op, impl in (("gemm", "cublas"), ("gemm", "torch"), ("conv2d", "cudnn"), ("conv2d", "torch"),
                     ("lstm", "cudnn"), ("lstm", "torch"), ("rfft", "cufft"), ("rfft", "torch")):
        assert (op, impl) in registered, (op, impl)


def test_hopper_runs_wgmma_tiles_for_half_and_tf32_and_simt_sgemm_for_fp32():
    for dtype, unit in (("fp16", "fp16_mma"), ("bf16", "bf16_mma"), ("tf32", "tf32")):
        tiles, got = tiles_for(dtype, H200)
        assert got == unit and all(t.name.startswith("sm90_xmma_gemm") for t in tiles)
        assert {t.k * (2 if dtype != "tf32" else 4) for t in tiles} == {128}   # one 128-byte row per k-step
    tiles, unit = tiles_for("fp32", H200)
    assert unit == "fp32_fma" and tiles == SIMT_TILES
    assert tiles_for("fp16", A100)[0][0].name.startswith("ampere_gemm")


def test_a_large_bf16_gemm_runs_near_the_measured_sustained_rate():
    plan = plan_gemm(8192, 8192, 8192, "bf16", H200)
    (kernel,) = plan.kernels
    tflops = 2 * 8192 ** 3 / _us([kernel]) / 1e6
    # the profile's sustained rate is an 8192^3 bf16 matmul measured at 769-798 TFLOP/s on an H200
    assert 700 < tflops < 800
    assert kernel.unit == "bf16_mma" and kernel.ctas == plan.tiles == (8192 // plan.tile.m) * (8192 // plan.tile.n)
    assert (plan.tile.m, plan.tile.n) in ((128, 256), (256, 128))    # the largest tiles amortise their fill


def test_a_grid_of_1_05_waves_costs_about_two_waves():
    tile = next(t for t in tiles_for("bf16", H200)[0] if (t.m, t.n) == (128, 256))
    k = 8192
    one_wave = plan_gemm(128 * 12, 256 * 11, k, "bf16", H200, only=[tile])     # 132 tiles: one full wave
    a_bit_more = plan_gemm(128 * 12, 256 * 11 + 256 // 20 * 7, k, "bf16", H200, only=[tile])
    assert one_wave.tiles == 132 and a_bit_more.tiles == 144 and a_bit_more.splits == 1
    one, more = _us(list(one_wave.kernels)), _us(list(a_bit_more.kernels))
    # 9% more work, but the 12 extra tiles run as a second wave as long as the first
    assert more / one == pytest.approx(2.0, rel=0.05)


def test_a_tile_that_overhangs_computes_its_whole_tile():
    tile = next(t for t in tiles_for("bf16", H200)[0] if (t.m, t.n) == (128, 128))
    # k = 250: four k-steps of 64 (too few to split), the last one a quarter full
    (kernel,) = plan_gemm(129, 128, 250, "bf16", H200, only=[tile]).kernels
    assert kernel.flops == 2 * 256 * 128 * 256      # two row tiles, the second almost empty


def test_small_m_splits_k_and_sums_the_partials_in_a_second_kernel():
    # seg_1 of the WeSpeaker embedding: (32 x 5120) @ (5120 x 256), fp32 with TF32 off
    plan = plan_gemm(32, 256, 5120, "fp32", H200)
    assert plan.splits > 1
    main, reduce = plan.kernels
    assert main.ctas == plan.tiles * plan.splits and main.ctas <= H200.sm_count * main.ctas_per_sm
    assert main.bytes_written == 4 * plan.splits * 32 * 256        # fp32 partial tiles
    assert reduce.bytes_read == main.bytes_written and reduce.bytes_written == 32 * 256 * 4
    # chosen because it is cheaper than one CTA per tile, which keeps all but a few of the 132 SMs idle
    unsplit = [t for t in SIMT_TILES if (t.m, t.n) == (32, 128)]
    single = plan_gemm(32, 256, 5120, "fp32", H200, only=unsplit)
    assert single.tiles == 2
    assert _us(list(plan.kernels)) < _us([k for k in single.kernels if single.splits == 1] or
                                         list(single.kernels))


def test_a_large_gemm_is_not_split():
    assert plan_gemm(4096, 4096, 4096, "fp16", H200).splits == 1


def test_gemm_bytes_are_a_b_and_c_once():
    (kernel,) = plan_gemm(4096, 4096, 4096, "fp16", H200).kernels
    assert kernel.bytes_read == 2 * 4096 * 4096 * 2 and kernel.bytes_written == 4096 * 4096 * 2


def test_fp32_sgemm_runs_on_the_fma_units_at_the_simt_loop_efficiency():
    (kernel,) = plan_gemm(8192, 8192, 8192, "fp32", H200).kernels
    assert kernel.unit == "fp32_fma" and 0.85 < kernel.efficiency < 0.95
    tflops = 2 * 8192 ** 3 / _us([kernel]) / 1e6
    assert 55 < tflops < 67


def test_fp8_runs_wgmma_tiles_with_a_bf16_output_where_the_gpu_has_fp8_tensor_cores():
    plan = plan_gemm(8192, 8192, 8192, "fp8", H200)
    (kernel,) = plan.kernels
    assert kernel.unit == "fp8_mma" and plan.tile.k == 128
    assert kernel.bytes_read == 2 * 8192 * 8192 and kernel.bytes_written == 8192 * 8192 * 2
    assert 1.5 < (2 * 8192 ** 3 / _us([kernel]) / 1e6) / 752 < 2.1     # about twice bf16's rate


@pytest.mark.parametrize("gpu, dtype, why", [("rtx-4090", "fp8", "states no fp8_mma rate"),
                                             ("h200", "int8", "unknown dtype")])
def test_unmodelled_says_why(gpu, dtype, why):
    with pytest.raises(Unmodelled, match=why):
        kernels_of("gemm", "cublas", {"m": 64, "n": 64, "k": 64}, dtype, profile(gpu))
    with pytest.raises(Unmodelled, match="no model of cudnn for gemm"):
        kernels_of("gemm", "cudnn", {"m": 64, "n": 64, "k": 64}, "fp16", H200)
