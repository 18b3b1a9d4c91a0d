"""Library-path estimates of torch's SDPA and cuDNN's LSTM: their stated kernels, read with the same constants
as the Triton launches (achievable bandwidth, the latency chain, one launch latency each)."""
import pytest
import torch

from rlx_triton.backends.torch_ref import lstm, sdpa_decode
from rlx_triton.devices import profile
from rlx_triton.perf.roofline import constants, library_estimate
from rlx_triton.router import Request

H200 = profile("h200")


def _decode_request(dtype, batch=1, heads=32, kv_heads=8, seq_kv=65536, dim=128):
    fields = {"m": heads // kv_heads, "tokens": 1, "batch": batch, "num_heads": heads, "head_dim": dim, "seq_q": 1,
              "seq_kv": seq_kv, "num_kv_heads": kv_heads, "head_dim_v": dim}
    return Request.make("sdpa_decode", "sdpa_decode", device="cpu", dtype=dtype, fields=fields)


@pytest.mark.parametrize("dtype, size, unit", [(torch.float16, 2, "fp16_mma"), (torch.bfloat16, 2, "bf16_mma"),
                                               (torch.float32, 4, "fp32_fma")], ids=str)
def test_torch_sdpa_reads_q_k_and_v_once_in_one_fused_kernel(dtype, size, unit):
    (kernel,) = sdpa_decode.library_kernels(_decode_request(dtype, batch=3, seq_kv=1001))
    assert kernel.bytes_read == (3 * 32 * 128 + 3 * 8 * 1001 * 256) * size
    assert kernel.bytes_written == 3 * 32 * 128 * size
    assert kernel.flops == 2 * 3 * 32 * 1001 * 256 and kernel.unit == unit


def test_the_decode_library_estimate_is_its_bytes_at_the_achievable_bandwidth_plus_a_launch():
    estimate = library_estimate(sdpa_decode.library_kernels(_decode_request(torch.float16)), H200)
    (kernel,) = sdpa_decode.library_kernels(_decode_request(torch.float16))
    assert estimate["est_us"] == pytest.approx(kernel.bytes / 4.3e12 * 1e6 + H200.launch_us, abs=1e-3)
    assert estimate["kernels"][0]["bound"] == "memory"


@pytest.fixture
def lstm_request():
    fields = {"batch": 32, "seq": 589, "input_size": 60, "hidden": 128, "layers": 4, "directions": 2, "tokens": 589}
    return Request.make("lstm", "lstm", device="cpu", dtype=torch.float32, fields=fields)


def test_cudnn_lstm_is_a_projection_and_one_dependent_launch_per_step_per_layer(lstm_request):
    kernels = lstm.library_kernels(lstm_request)
    assert [k.repeat for k in kernels] == [1, 589] * 4
    projection, step = kernels[0], kernels[1]
    assert projection.flops == 2 * 32 * 589 * 60 * 1024 and kernels[2].flops == 2 * 32 * 589 * 256 * 1024
    assert step.flops == 2 * 32 * 1024 * 128 and dict(step.chain) == {"l2_hit": 1}


def test_the_lstm_library_estimate_prices_every_step_launch_and_its_chain(lstm_request):
    estimate = library_estimate(lstm.library_kernels(lstm_request), H200)
    nominal = constants(H200)
    assert estimate["launches"] == 4 * (1 + 589)
    steps = [row for row in estimate["kernels"] if row["launches"] == 589]
    assert all(row["chain_us"] == pytest.approx(589 * nominal["l2_hit"] / 1000, abs=1e-3) for row in steps)
    assert estimate["est_us"] > 4 * 590 * H200.launch_us
    assert estimate["est_low_us"] < estimate["est_us"] < estimate["est_high_us"]


def _conv_request(op="conv2d", **fields):
    from rlx_triton.backends.torch_ref import conv2d

    features = {"kernel": (3, 3), "padding": 1, "residual": fields.pop("residual", False),
                "relu": fields.pop("relu", False), "weighted": fields.pop("weighted", False)}
    request = Request.make("conv", op, device="cpu", dtype=torch.float32, fields=fields, features=features)
    return conv2d.library_kernels(request)


def test_cudnn_conv2d_then_the_residual_add_and_relu_eager_torch_runs_apart():
    conv, add, relu = _conv_request(batch=3, c_in=5, c_out=7, length=11 * 13, taps=9, stride=1, tokens=11 * 13,
                                    residual=True, relu=True)
    output = 3 * 7 * 143 * 4
    assert conv.bytes_read == (3 * 5 * 143 + 7 * 5 * 9 + 7) * 4 and conv.bytes_written == output
    assert conv.flops == 2 * 3 * 7 * 143 * 5 * 9 and conv.unit == "fp32_fma"
    assert (add.bytes_read, relu.bytes_read) == (2 * output, output)


def test_stats_pool_reads_the_sequences_for_the_mean_and_for_the_std():
    mean, std, cat = _conv_request("stats_pool", batch=2, c_in=256, c_out=512, length=125, taps=1, stride=1, tokens=1)
    assert mean.bytes_read == std.bytes_read == 2 * 256 * 125 * 4 and cat.bytes_written == 2 * 2 * 256 * 4
