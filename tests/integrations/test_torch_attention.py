""""RLX" in torch's flash attention registry (rlx_triton/integrations/torch_attention.py): registered on import
whichever of torch and rlx_triton comes first (and never activated), activate/restore work on any machine and
leave CPU calls of F.sdpa as they were, and the CUDA kernel it registers for aten::_scaled_dot_product_flash_attention
(called here through the CUDA dispatch key on CPU tensors) routes as rt.scaled_dot_product_attention routes: the
decode kernel where the route names one (torch's outputs: query's strides, the LSE, empty random state), torch's
own flash forward otherwise (a stand-in CPU kernel of aten::_flash_attention_forward plays it here); on a GPU,
F.sdpa with "RLX" active against torch's own flash result."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import rlx_triton as rt
from rlx_triton.backends.triton.sdpa_decode.routing import MAX_SEQ_Q
from rlx_triton.integrations import torch_attention
from rlx_triton.router import recording_routes

attention = pytest.importorskip("torch.nn.attention")
if not hasattr(attention, "register_flash_attention_impl"):
    pytest.skip("this torch has no flash attention registry", allow_module_level=True)

FLASH = torch.ops.aten._scaled_dot_product_flash_attention.default
CUDA_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)


@pytest.fixture
def rlx_active():
    attention.activate_flash_attention_impl("RLX")
    try:
        yield
    finally:
        attention.restore_flash_attention_impl()


def _cuda_kernel_source() -> str:
    lines = torch._C._dispatch_dump("aten::_scaled_dot_product_flash_attention").splitlines()
    return next((line for line in lines if line.startswith("CUDA:")), "")


def _flash_on_cuda_key(*args, **kwargs):
    """The op's CUDA kernel, called on CPU tensors (the dispatcher picks the kernel by the key it is given)."""
    return FLASH.redispatch(CUDA_KEY, *args, **kwargs)


@pytest.mark.parametrize("first", ["torch", "rlx_triton"])
def test_rlx_is_registered_on_import_and_not_activated(first):
    """In a fresh interpreter, with torch imported before rlx_triton or after it (import rlx_triton imports no
    torch)."""
    imports = "import torch, rlx_triton" if first == "torch" else \
        "import sys, rlx_triton; assert 'torch' not in sys.modules; import torch"
    code = (f"{imports}; import torch.nn.attention as a; "
            "print(a.list_flash_attention_impls(), a.current_flash_attention_impl())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    listed, current = done.stdout.strip().rsplit(" ", 1)
    assert "'RLX'" in listed and current == "None"


def test_activate_and_restore_on_a_machine_without_a_gpu_leave_cpu_sdpa_as_it_was():
    q, k, v = torch.randn(2, 4, 3, 16), torch.randn(2, 4, 9, 16), torch.randn(2, 4, 9, 16)
    before = [F.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True)]
    assert "torch_attention.py" not in _cuda_kernel_source()
    attention.activate_flash_attention_impl("RLX")
    try:
        assert attention.current_flash_attention_impl() == "RLX"
        assert "torch_attention.py" in _cuda_kernel_source()
        during = [F.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True)]
    finally:
        attention.restore_flash_attention_impl()
    assert attention.current_flash_attention_impl() is None
    assert "torch_attention.py" not in _cuda_kernel_source()
    assert all(torch.equal(a, b) for a, b in zip(before, during))


def _reference(q, k, v, scale, is_causal):
    """(out, lse) in float64, grouped heads repeated."""
    group = q.shape[1] // k.shape[1]
    k64, v64 = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    scores = q.double() @ k64.transpose(-1, -2) * scale
    if is_causal:
        scores = scores.masked_fill(~torch.ones(scores.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    return scores.softmax(-1) @ v64, scores.logsumexp(-1)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 1e-3)], ids=["fp32", "fp16"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_a_covered_call_runs_the_decode_kernel_and_returns_torchs_outputs(rlx_active, dtype, tol, is_causal):
    """A decode step with grouped heads (and a square causal block, the only causal shape torch's flash path
    takes): the kernel's attention in query's strides, its LSE, zero random state, an empty debug mask."""
    seq_q = 4 if is_causal else 1
    q = torch.randn(2, seq_q, 8, 32).to(dtype).transpose(1, 2)   # (B, H, L, E) with (B, L, H, E) memory
    k, v = (torch.randn(2, 2, seq_q if is_causal else 37, 32).to(dtype) for _ in range(2))
    scale = 32 ** -0.5
    with rt.use_backend("triton", strict=True), recording_routes() as routes:
        out, lse, cum_q, cum_k, max_q, max_k, rng_state, unused, debug = _flash_on_cuda_key(
            q, k, v, 0.0, is_causal, False, scale=scale)
        explained = rt.explain(rt.scaled_dot_product_attention, q, k, v, is_causal=is_causal, scale=scale,
                               enable_gqa=True)
    assert routes[0].backend == "triton" and routes[0].candidate_tag == explained.candidate_tag
    want, want_lse = _reference(q, k, v, scale, is_causal)
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=4 * tol)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=4e-5)
    assert out.dtype == dtype and out.stride() == q.stride() and lse.dtype == torch.float32
    assert (cum_q, cum_k, max_q, max_k) == (None, None, seq_q, k.shape[2])
    assert rng_state.dtype == torch.uint64 and not rng_state.any() and debug.numel() == 0


@pytest.fixture
def torch_flash_on_cpu():
    """A CPU kernel for aten::_flash_attention_forward (torch has none): math SDPA on FlashAttention's
    (B, L, H, E) layout, returning its (output, softmax_logsumexp, rng_state, unused, debug_attn_mask). The calls
    it receives are recorded."""
    calls = []

    def forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, *,
                scale=None, window_size_left=None, window_size_right=None, seqused_k=None, alibi_slopes=None,
                block_table=None, num_splits=None):
        calls.append(dict(dropout_p=dropout_p, is_causal=is_causal, return_debug_mask=return_debug_mask))
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
        out = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, None, 0.0, is_causal, None, scale=scale,
                                                                 enable_gqa=True)[0]
        lse = torch.logsumexp(q @ k.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-1, -2) * scale, -1)
        empty = query.new_empty(0)
        return out.transpose(1, 2).contiguous(), lse.float(), query.new_zeros(2, dtype=torch.uint64), empty, empty

    library = torch.library.Library("aten", "IMPL", "CPU")
    library.impl("_flash_attention_forward", forward, "CPU")
    try:
        yield calls
    finally:
        library._destroy()


@pytest.mark.parametrize("why", ["torch backend", "dropout", "debug mask", "autograd", "uncovered shape"])
def test_every_other_call_runs_torchs_own_flash_forward(rlx_active, torch_flash_on_cpu, why):
    # one query token past what the decode kernel covers
    seq_q = MAX_SEQ_Q + 1 if why == "uncovered shape" else 1
    q, k, v = torch.randn(1, 4, seq_q, 16), torch.randn(1, 4, 40, 16), torch.randn(1, 4, 40, 16)
    if why == "autograd":
        q.requires_grad_(True)
    dropout_p = 0.25 if why == "dropout" else 0.0
    with rt.use_backend("torch" if why == "torch backend" else "auto"):
        out, lse, *_ = _flash_on_cuda_key(q, k, v, dropout_p, False, why == "debug mask", scale=0.25)
    assert len(torch_flash_on_cpu) == 1 and torch_flash_on_cpu[0]["dropout_p"] == dropout_p
    assert out.shape == q.shape and lse.shape == (1, 4, seq_q)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.25), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_on_cuda_rlx_runs_a_decode_sdpa_call_and_gives_torchs_flash_result():
    """bench/gpu_check.sh's rlx-flash check: F.sdpa under the flash backend, with "RLX" active and without."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(4, 8, 1, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(4, 8, 4096, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        want = F.scaled_dot_product_attention(q, k, v)
        attention.activate_flash_attention_impl("RLX")
        try:
            with rt.use_backend("triton", strict=True), recording_routes() as routes:
                got = F.scaled_dot_product_attention(q, k, v)
        finally:
            attention.restore_flash_attention_impl()
    assert [route.backend for route in routes] == ["triton"]
    torch.testing.assert_close(got, want, rtol=1e-3, atol=4e-3)
