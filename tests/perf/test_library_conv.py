"""cuDNN convolution model (rlx_triton.perf.library.conv) and the conv family's torch path kernels
(backends/torch_ref/conv2d.py, conv.py): implicit GEMM, Winograd, the eager ops around the library calls."""
import pytest
import torch

from rlx_triton.backends.torch_ref import conv, conv2d
from rlx_triton.devices import profile
from rlx_triton.perf.library import Unmodelled, kernels_of
from rlx_triton.perf.library.conv import convolution_kernels, implicit_gemm
from rlx_triton.perf.library.gemm import plan_gemm
from rlx_triton.perf.roofline import library_estimate
from rlx_triton.router import Request

H200 = profile("h200")


def _us(kernels) -> float:
    return library_estimate(kernels, H200)["est_us"]


def test_a_convolution_is_an_implicit_gemm_of_output_pixels_by_channels_by_taps():
    # layer2.0 of the ResNet34 trunk: 32 x 32 x 80 x 998 -> 64 channels, 3x3 stride 2
    kernels = implicit_gemm(32, 32, 64, 80 * 998, 40 * 499, 9, "fp32", H200)
    m, n, k = 32 * 40 * 499, 64, 32 * 9
    assert "M = 32 x 19960 output pixels, N = 64, K = 32 x 9" in kernels[0].note
    tile = plan_gemm(m, n, k, "fp32", H200).tile
    assert 2 * m * n * k <= kernels[0].flops <= 2 * (m + tile.m) * (n + tile.n) * (k + tile.k)
    # it reads the input and the filters once, not the 9x larger im2col matrix
    assert kernels[0].bytes_read == (32 * 32 * 80 * 998 + 64 * 32 * 9) * 4
    assert kernels[-1].bytes_written == 32 * 64 * 40 * 499 * 4


def test_fp32_3x3_stride_1_takes_winograd_where_it_is_cheaper_and_stride_2_never():
    trunk = convolution_kernels(32, 64, 64, 40 * 499, 40 * 499, (3, 3), 1, "fp32", H200)
    assert "Winograd" in trunk[1].name and "filter transform" in trunk[0].name
    direct = implicit_gemm(32, 64, 64, 40 * 499, 40 * 499, 9, "fp32", H200)
    assert _us(trunk) < _us(direct)
    # 16 products per 2x2 output tile instead of 36 (before tile padding)
    assert trunk[1].flops < 0.6 * direct[0].flops
    strided = convolution_kernels(32, 32, 64, 80 * 998, 40 * 499, (3, 3), 2, "fp32", H200)
    assert all("Winograd" not in k.name for k in strided)
    tensor_cores = convolution_kernels(32, 64, 64, 40 * 499, 40 * 499, (3, 3), 1, "fp16", H200, layout="nhwc")
    assert all("Winograd" not in k.name for k in tensor_cores) and tensor_cores[0].unit == "fp16_mma"


def test_tensor_core_convolutions_of_nchw_tensors_add_cudnns_transposes_and_fp32_does_not():
    nhwc = convolution_kernels(8, 64, 128, 64 * 64, 62 * 62, (3, 3), 1, "tf32", H200, layout="nhwc")
    nchw = convolution_kernels(8, 64, 128, 64 * 64, 62 * 62, (3, 3), 1, "tf32", H200)
    into, *middle, back = nchw
    assert middle == nhwc and "nchwToNhwc" in into.name and "nhwcToNchw" in back.name
    assert into.bytes == 2 * 8 * 64 * 64 * 64 * 4 and back.bytes == 2 * 8 * 128 * 62 * 62 * 4
    fp32 = convolution_kernels(8, 64, 128, 64 * 64, 62 * 62, (3, 3), 2, "fp32", H200)
    assert not any("NHWC" in k.name for k in fp32)


def test_published_conv2d_rows_are_priced_and_fp8_says_why():
    shape = dict(batch=32, c_in=64, c_out=64, h=56, w=56, kernel=3, stride=1, padding=1)
    assert _us(kernels_of("conv2d", "cudnn", shape, "bf16", H200)) > 0
    assert _us(kernels_of("conv2d", "torch", shape, "fp32", H200)) > 0
    with pytest.raises(Unmodelled, match="fp8"):
        kernels_of("conv2d", "cudnn", shape, "fp8", H200)


def _conv2d_request(dtype=torch.float32, **fields):
    features = {"kernel": fields.pop("kernel", (3, 3)), "padding": fields.pop("padding", 1),
                "residual": fields.pop("residual", False), "relu": fields.pop("relu", False)}
    return Request.make("conv", "conv2d", device="cpu", dtype=dtype, fields=fields, features=features)


def test_torch_conv2d_is_cudnn_then_bias_residual_and_relu_as_eager_kernels():
    request = _conv2d_request(batch=3, c_in=5, c_out=7, length=11 * 13, taps=9, stride=1, tokens=11 * 13,
                              residual=True, relu=True)
    kernels = conv2d.library_kernels(request, H200)
    names = [k.name for k in kernels]
    assert "cuDNN" in names[0] or "cuDNN" in names[1]
    assert names[-3:] == ["bias add (output.add_ after cudnn_convolution)", "residual add", "relu"]
    output = 3 * 7 * 143 * 4
    bias, add, relu = kernels[-3:]
    assert (bias.bytes_written, add.bytes_read, relu.bytes_read) == (output, 2 * output, output)


def test_half_precision_conv2d_adds_the_casts_to_fp32_and_back():
    request = _conv2d_request(torch.float16, batch=2, c_in=4, c_out=4, length=64, taps=9, stride=1, tokens=64)
    names = [k.name for k in conv2d.library_kernels(request, H200)]
    assert names[:3] == ["x cast", "weight cast", "bias cast"] and names[-1] == "output cast"


def test_the_seg_1_projection_is_one_split_k_cublas_gemm_with_its_reduction():
    request = _conv2d_request(batch=32, c_in=5120, c_out=256, length=1, taps=1, stride=1, tokens=1, kernel=(1, 1),
                              padding=0)
    main, reduce = conv2d.library_kernels(request, H200)
    assert "split-K" in main.name and "reduction" in reduce.name
    assert main.bytes_read == (32 * 5120 + 256 * 5120 + 256) * 4
    assert _us([main, reduce]) < 20      # two short launches: a few bytes per SM


def test_stats_pool_reads_the_sequences_for_the_mean_and_for_the_std():
    request = Request.make("conv", "stats_pool", device="cpu", dtype=torch.float32,
                           fields=dict(batch=2, c_in=256, c_out=512, length=125, taps=1, stride=1, tokens=1),
                           features={"weighted": False})
    mean, std, cat = conv2d.library_kernels(request, H200)
    assert mean.bytes_read == std.bytes_read == 2 * 256 * 125 * 4 and cat.bytes_written == 2 * 2 * 256 * 4


def _sincnet_request(batch=32, samples=160000):
    return Request.make("conv", "sincnet", device="cpu", dtype=torch.float32,
                        fields=dict(batch=batch, c_in=1, c_out=80, length=samples, taps=251, stride=10, tokens=589),
                        features={"pool": 3, "blocks": 2})


def test_the_sincnet_torch_path_is_pyannotes_op_sequence():
    kernels = conv.library_kernels(_sincnet_request(), H200)
    convolutions = [k for k in kernels if "cuDNN" in k.name]
    # the sinc conv (80 filters of 251 taps, stride 10) and the two 5-tap blocks, M = batch x output positions
    assert len(convolutions) == 3
    assert convolutions[0].flops >= 2 * 32 * 15975 * 80 * 251
    assert convolutions[1].flops >= 2 * 32 * 5321 * 60 * 80 * 5
    assert convolutions[2].flops >= 2 * 32 * 1769 * 60 * 60 * 5
    names = [k.name for k in kernels]
    assert names[:4] == ["waveform weight repeat", "waveform bias repeat",
                         "waveform statistics (batch_norm training)", "waveform normalisation"]
    assert sum("max_pool1d" in n for n in names) == 3 and sum("leaky_relu" in n for n in names) == 3
    assert sum("bias add" in n for n in names) == 2      # the sinc conv has no bias
    pool = next(k for k in kernels if k.name == "sinc max_pool1d (with int64 indices)")
    assert pool.bytes_written == 32 * 80 * 5325 * (4 + 8)


def test_conv1d_states_its_epilogue():
    request = Request.make("conv", "conv1d", device="cpu", dtype=torch.float32,
                           fields=dict(batch=4, c_in=80, c_out=60, length=5325, taps=5, stride=1, tokens=1773),
                           features={"pool": 3, "abs": True, "leaky": True})
    names = [k.name for k in conv.library_kernels(request, H200)]
    assert [n.split(" ", 1)[1] for n in names[-4:]] == ["bias add (after cudnn_convolution)", "abs",
                                                        "max_pool1d (with int64 indices)", "leaky_relu"]


def test_the_conv_familys_library_path_says_what_it_does_not_model():
    request = _conv2d_request(torch.float64, batch=1, c_in=1, c_out=1, length=9, taps=9, stride=1, tokens=9)
    with pytest.raises(Unmodelled, match="float64"):
        conv2d.library_kernels(request, H200)
