"""cuFFT R2C model (rlx_triton.perf.library.fft): bandwidth-bound passes, what it refuses."""
import pytest

from rlx_triton.devices import profile
from rlx_triton.perf.library import Unmodelled, kernels_of
from rlx_triton.perf.library.fft import SINGLE_PASS_POINTS, passes, rfft_kernels
from rlx_triton.perf.roofline import library_estimate

H200 = profile("h200")


def test_fbanks_512_point_transforms_are_one_bandwidth_bound_pass():
    (kernel,) = rfft_kernels(32 * 998, 512, "fp32", H200)
    assert kernel.bytes_read == 32 * 998 * 512 * 4 and kernel.bytes_written == 32 * 998 * 257 * 8
    row = library_estimate([kernel], H200)["kernels"][0]
    assert row["bound"] == "memory"
    assert row["est_us"] == pytest.approx(kernel.bytes / H200.achievable_bw * 1e6 + H200.launch_us
                                          + row["chain_us"], rel=0.01)


def test_large_transforms_take_more_passes_over_the_whole_signal():
    assert passes(2 * SINGLE_PASS_POINTS) == 1 and passes(4 * SINGLE_PASS_POINTS) == 2
    first, second = rfft_kernels(16, 1 << 20, "fp32", H200)
    assert first.bytes_read == 16 * (1 << 20) * 4 and second.bytes_read == first.bytes_written
    assert all(row["bound"] == "memory" for row in library_estimate([first, second], H200)["kernels"])


def test_fp16_moves_half_the_bytes():
    (single,) = rfft_kernels(1024, 4096, "fp32", H200)
    (half,) = rfft_kernels(1024, 4096, "fp16", H200)
    assert 2 * half.bytes == single.bytes


@pytest.mark.parametrize("n, dtype, why", [(1031, "fp32", "Bluestein"), (1000, "fp16", "power-of-two"),
                                           (1024, "bf16", "not modelled"), (1024, "tf32", "not modelled")])
def test_unmodelled_transforms_say_why(n, dtype, why):
    with pytest.raises(Unmodelled, match=why):
        kernels_of("rfft", "cufft", {"batch": 4, "n": n}, dtype, H200)
