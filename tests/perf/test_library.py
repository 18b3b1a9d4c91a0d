"""Library-path estimates of torch's SDPA: its stated kernels, read with the same constants as the Triton launches
(achievable bandwidth, the latency chain, one launch latency each). cuBLAS, cuDNN and cuFFT: test_library_gemm.py,
test_library_conv.py, test_library_rnn.py, test_library_fft.py."""
import pytest
import torch

from rlx_triton.backends.torch_ref import sdpa_decode
from rlx_triton.devices import profile
from rlx_triton.perf.roofline import library_estimate
from rlx_triton.router import Request

H200 = profile("h200")


def _decode_request(dtype, batch=1, heads=32, kv_heads=8, seq_kv=65536, dim=128):
    fields = {"m": heads // kv_heads, "tokens": 1, "batch": batch, "num_heads": heads, "head_dim": dim, "seq_q": 1,
              "seq_kv": seq_kv, "num_kv_heads": kv_heads, "head_dim_v": dim}
    return Request.make("sdpa_decode", "sdpa_decode", device="cpu", dtype=dtype, fields=fields)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_rt_sdpa_decode_on_torch_reads_k_and_v_and_writes_the_output(dtype):
    # rt.sdpa_decode's torch route is the decomposed fallback: every byte of K and V passes through it at least once
    size = {torch.float16: 2, torch.bfloat16: 2}.get(dtype, 4)
    kernels = sdpa_decode.library_kernels(_decode_request(dtype, batch=3, seq_kv=1001), H200)
    assert sum(k.bytes_read for k in kernels) >= 3 * 8 * 1001 * 256 * size
    gemms = [k for k in kernels if k.flops]
    assert sum(k.flops for k in gemms) == 2 * 3 * 32 * 1001 * 256 and {k.unit for k in gemms} == {"fp32_fma"}


def test_each_library_kernel_costs_a_launch_and_at_least_its_bytes_at_the_achievable_bandwidth():
    kernels = sdpa_decode.library_kernels(_decode_request(torch.float16), H200)
    estimate = library_estimate(kernels, H200)
    floor = sum(k.bytes for k in kernels) / 4.3e12 * 1e6 + len(kernels) * H200.launch_us
    assert estimate["est_us"] >= floor - 1e-3 and estimate["launches"] == len(kernels)


def test_equal_calls_side_by_side_are_each_costed_once_they_are_op_calls():
    """An op that routes twice per call is one call (`_op_calls` merges the repeat); but the calls the router
    sent to the library, picked out of a model's calls, may put two equal calls side by side (two identical
    ResNet convs with a kernel-routed one between them): each is costed."""
    from types import SimpleNamespace

    from rlx_triton.perf import library_path

    route = SimpleNamespace(request=_decode_request(torch.float16), family="sdpa_decode", op="sdpa_decode",
                            backend="torch")
    one = library_path([route], H200)["est_us"]
    assert library_path([route, route], H200)["est_us"] == pytest.approx(one)            # one call routed twice
    assert library_path([route, route], H200, merged=True)["est_us"] == pytest.approx(2 * one)   # two calls
