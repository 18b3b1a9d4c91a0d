"""Small decode, varlen, SincNet, ResNet trunk and LSTM launches for compute-sanitizer (bench/gpu_check.sh's `sanitizer` check).

Runs, on CUDA tensors, a split decode launch whose splits merge in one and in two levels (ragged lengths,
a paged cache, a length of 0), the varlen kernel's two passes over key tiles (unmasked tiles, then the window's
edges and last partial tile) under causal and sliding windows on contiguous and paged caches, the symmetric
sinc conv (the pool's phases as tile rows, filter lanes past the bank masked) with SincNet's blocks, the trunk's
tf32x3 convs (the split weights' hi and lo halves read per chunk, padded windows; the Winograd form's four-column
windows and a row's last pair with one pixel), then the
on-chip LSTM recurrence (a cooperative launch whose programs read each other's h through the exchange every
step; 80 hidden units and a batch of 4, so the exchange's padded rows and columns are read too, and the recurrent
product's warps split K and pass their slices through shared memory), and checks the
outputs against float64. Under `compute-sanitizer --tool memcheck`
(with PYTORCH_NO_CUDA_MEMORY_CACHING=1, so every tensor is its own allocation and a read past one is seen)
and `--tool racecheck` any out-of-bounds access or shared-memory hazard is reported by the tool; this
script exits non-zero on a wrong value.
"""
from __future__ import annotations

import sys

import torch

import rlx_triton as rt
from tests.reference.lstm import lstm_float64
from tests.reference.sdpa_decode import attention_reference


def decode() -> None:
    for kv_heads, seq_kv in ((2, 3000), (1, 5000)):   # GQA: one merge level; MQA at batch 1-2: two levels
        q = torch.randn(3, 8, 1, 64, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(3, kv_heads, seq_kv, 64, device="cuda", dtype=torch.float16) for _ in range(2))
        lengths = torch.tensor([seq_kv, 0, seq_kv // 3], device="cuda", dtype=torch.int32)
        with rt.use_backend("triton", strict=True):
            out = rt.sdpa_decode(q, k, v, lengths)
        ref, _ = attention_reference(q, k, v, causal="bottom_right", cache_seqlens=lengths)
        torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-3, atol=8e-3)
    pages = torch.randn(24, 2, 128, 64, device="cuda", dtype=torch.float16)
    table = torch.randperm(24, device="cuda").to(torch.int32).view(3, 8)
    lengths = torch.tensor([1024, 1, 500], device="cuda", dtype=torch.int32)
    with rt.use_backend("triton", strict=True):
        out = rt.sdpa_decode(q, pages, pages, lengths, block_table=table)
    gathered = pages[table.long()].transpose(1, 2).reshape(3, 2, 1024, 64)
    ref, _ = attention_reference(q, gathered, gathered, causal="bottom_right", cache_seqlens=lengths)
    torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-3, atol=8e-3)


def varlen() -> None:
    from tests.reference.varlen_attention import make_varlen_inputs, naive_flash_attn_varlen

    for window, page_size in (((-1, 0), None), ((40, 0), 16), ((17, 9), None)):
        kw = make_varlen_inputs(0, 0, 64, (8, 2), dtype=torch.float16, lengths_q=[130, 1, 77],
                                lengths_k=[300, 64, 77], causal=window[1] == 0, window=window, page_size=page_size)
        ref, _ = naive_flash_attn_varlen(**kw)
        with rt.use_backend("triton", strict=True):
            out = rt.flash_attn_varlen_func(**{name: value.cuda() if isinstance(value, torch.Tensor) else value
                                               for name, value in kw.items()})
        torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-3, atol=8e-3)


def sincnet() -> None:
    from rlx_triton.nn.conv import SincNet
    from tests.reference.conv import random_sincnet, sincnet_float64

    module = random_sincnet().cuda()
    wav = torch.randn(2, 1, 4000, device="cuda")
    with torch.no_grad(), rt.use_backend("triton", strict=True):
        out = SincNet.from_pyannote(module)(wav)
    ref = sincnet_float64(module.cpu(), wav.cpu())
    assert ((out.cpu().double() - ref).abs().max() / ref.abs().max()).item() <= 1e-4


def trunk() -> None:
    """ResNet trunk convs on the tf32x3 recipes: the stem (taps folded into the reduction), a 3x3/1 with residual
    and ReLU over 64 channels (Winograd F(2, 3), four channel chunks a kernel row, 15 columns: each row's last pair
    has one pixel), a 3x3/2 and a 1x1/2 shortcut; padded edges and a pixel count that is not a multiple of the
    tile."""
    import torch.nn.functional as F
    from rlx_triton.ops.conv2d import conv2d

    cases = [((2, 1, 20, 30), (32, 1, 3, 3), 1, 1, False), ((2, 64, 10, 15), (64, 64, 3, 3), 1, 1, True),
             ((2, 32, 20, 30), (64, 32, 3, 3), 2, 1, False), ((2, 32, 20, 30), (64, 32, 1, 1), 2, 0, False)]
    for x_shape, w_shape, stride, padding, residual in cases:
        x, weight, bias = torch.randn(x_shape), torch.randn(w_shape) * 0.1, torch.randn(w_shape[0])
        ref = F.conv2d(x.double(), weight.double(), bias.double(), stride=stride, padding=padding)
        res = torch.randn(ref.shape) if residual else None
        if res is not None:
            ref = torch.relu(ref + res.double())
        with rt.use_backend("triton", strict=True):
            out = conv2d(x.cuda(), weight.cuda(), bias.cuda(), stride=stride, padding=padding,
                         residual=res.cuda() if res is not None else None, relu=residual)
        torch.testing.assert_close(out.cpu().double(), ref, rtol=1e-4, atol=1e-4)


def lstm() -> None:
    # hidden 80: the routed candidate's tensor-core recurrent product splits K across its warps, whose slices
    # pass through shared memory (racecheck)
    torch.backends.cudnn.allow_tf32 = False
    stock = torch.nn.LSTM(20, 80, 2, bidirectional=True, batch_first=True).cuda().eval()
    module = rt.nn.LSTM.from_torch(stock)
    x = torch.randn(4, 50, 20, device="cuda")
    with torch.no_grad(), rt.use_backend("triton", strict=True):
        out, (h_n, c_n) = module(x)
    ref, _ = lstm_float64(x.cpu(), [w.cpu() for w in stock._flat_weights], num_layers=2, bidirectional=True,
                          batch_first=True, has_biases=True)
    torch.testing.assert_close(out.cpu().double(), ref, rtol=1e-4, atol=1e-4)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("gpu_sanitize: no CUDA GPU visible to torch")
    for name in sys.argv[1:] or ["decode", "varlen", "sincnet", "trunk", "lstm"]:
        {"decode": decode, "varlen": varlen, "sincnet": sincnet, "trunk": trunk, "lstm": lstm}[name]()
        torch.cuda.synchronize()
        print("gpu_sanitize:", name, "ok", flush=True)
