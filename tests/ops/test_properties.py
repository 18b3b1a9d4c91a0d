"""Property tests: rt's ops equal torch (math SDPA in float64, the float64 Kaldi reference) on random inputs,
or raise the exception type torch raises.

Random shapes, GQA ratios, dtypes, layouts (contiguous, transposed, expanded, strided views), masks (none,
bool, float, broadcast), is_causal and scale for attention; random lengths and options for fbank. The
Triton kernels run in the interpreter, so examples are few and small (derandomized: the same examples each
run); cases hypothesis once found failing stay below as @example."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel

import rlx_triton as rt
from tests.reference.fbank import fbank64, rel_error, speech_like

PROPERTY = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _laid_out(values: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values (B, H, L, D) in another memory layout: a transposed view, an expanded batch (stride 0)
    or a strided view of a larger tensor."""
    if layout == "transposed":   # built as (B, L, H, D), as FlashAttention-layout callers hold it
        return values.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "expanded":
        return values[:1].expand_as(values)
    if layout == "strided":      # every other row of a tensor twice as long, and a padded last dim
        big = torch.zeros(*values.shape[:2], values.shape[2] * 2, values.shape[3] + 3, dtype=values.dtype)
        big[:, :, ::2, :values.shape[3]] = values
        return big[:, :, ::2, :values.shape[3]]
    return values


@st.composite
def attention_calls(draw):
    batch = draw(st.integers(1, 2))
    kv_heads = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 2, 3]))
    seq_q = draw(st.integers(1, 4))
    seq_kv = draw(st.integers(1, 40))
    head_dim = draw(st.sampled_from([8, 13, 16, 32]))
    dtype = draw(st.sampled_from(DTYPES))
    layouts = [draw(st.sampled_from(["contiguous", "transposed", "expanded", "strided"])) for _ in range(3)]
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, length, head_dim, generator=generator).to(dtype)
               for heads, length in ((kv_heads * group, seq_q), (kv_heads, seq_kv), (kv_heads, seq_kv)))
    if layouts[1] == "expanded" or layouts[2] == "expanded":   # an expanded batch repeats batch 0's values
        k, v = k[:1].expand_as(k).clone(), v[:1].expand_as(v).clone()
    q, k, v = (_laid_out(t, layout) for t, layout in zip((q, k, v), layouts))
    mask_kind = draw(st.sampled_from(["none", "bool", "float"]))
    kwargs = {}
    if mask_kind != "none":
        shape = draw(st.sampled_from([(seq_q, seq_kv), (1, 1, seq_q, seq_kv), (batch, 1, 1, seq_kv),
                                      (batch, kv_heads * group, seq_q, seq_kv), (seq_kv,)]))
        if mask_kind == "bool":
            kwargs["attn_mask"] = torch.rand(shape, generator=generator) > 0.3
        else:
            kwargs["attn_mask"] = (torch.randn(shape, generator=generator) * 2).to(dtype)
    # with a mask too, now and then: torch's math backend refuses that and its dispatch takes it (on torch)
    if draw(st.booleans()) if mask_kind == "none" else draw(st.integers(0, 5)) == 0:
        kwargs["is_causal"] = True
    if draw(st.booleans()):
        kwargs["scale"] = draw(st.floats(0.05, 2.0))
    if group > 1:
        kwargs["enable_gqa"] = draw(st.booleans())  # False: torch refuses unequal head counts
    return q, k, v, kwargs


def _math64(q, k, v, **kwargs):
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def _in_float64(reference, q, k, v, kwargs):
    mask = kwargs.get("attn_mask")
    if mask is not None and mask.dtype != torch.bool:
        kwargs = dict(kwargs, attn_mask=mask.double())
    return reference(q.double(), k.double(), v.double(), **kwargs)


def _assert_like_torch(call, q, k, v, kwargs, references):
    """rt's call equals the first of torch's `references` (SDPA entry points) that takes the call, in float64;
    where none takes it, rt raises the type the first one raises."""
    first_error = None
    for reference in references:
        try:
            reference(q, k, v, **kwargs)
        except Exception as error:
            first_error = first_error or error
            continue
        expected = _in_float64(reference, q, k, v, kwargs)
        break
    else:
        with pytest.raises(type(first_error)):
            call(q, k, v, **kwargs)
        return
    out = call(q, k, v, **kwargs)
    tol = TOL[q.dtype]
    assert out.shape == expected.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol * max(1.0, math.log2(k.shape[-2] + 1)),
                               equal_nan=True)


# The kernel path takes what any of torch's backends takes, with the math backend's values: a mask with
# is_causal (the math backend refuses it, torch's dispatch takes it) and a 1-D mask (torch's CPU flash kernel
# refuses it with IndexError, the math backend takes it). The torch path is torch's own dispatch.
KERNEL_REFERENCES = (_math64, F.scaled_dot_product_attention)
TORCH_REFERENCES = (F.scaled_dot_product_attention,)


def _one_query_one_key(**kwargs):
    generator = torch.Generator().manual_seed(0)
    return (*(torch.randn(1, 1, 1, 8, generator=generator) for _ in range(3)), kwargs)


@PROPERTY
@given(attention_calls())
# examples hypothesis found: a mask with is_causal, and a 1-D mask (see KERNEL_REFERENCES)
@example(_one_query_one_key(attn_mask=torch.tensor([[False]]), is_causal=True))
@example(_one_query_one_key(attn_mask=torch.tensor([False])))
def test_scaled_dot_product_attention_on_the_kernel_path_equals_torch(call):
    q, k, v, kwargs = call
    with rt.use_backend("triton"):
        _assert_like_torch(rt.scaled_dot_product_attention, q, k, v, kwargs, KERNEL_REFERENCES)


@settings(PROPERTY, max_examples=60)
@given(attention_calls())
def test_scaled_dot_product_attention_on_the_torch_path_equals_torch(call):
    q, k, v, kwargs = call
    with rt.use_backend("torch"):
        _assert_like_torch(rt.scaled_dot_product_attention, q, k, v, kwargs, TORCH_REFERENCES)


@st.composite
def fbank_calls(draw):
    options = dict(sample_frequency=8000.0,
                   num_mel_bins=draw(st.integers(5, 40)),
                   frame_length=draw(st.sampled_from([20.0, 25.0, 32.0])),
                   frame_shift=draw(st.sampled_from([8.0, 10.0])),
                   window_type=draw(st.sampled_from(["povey", "hamming", "hanning", "rectangular", "blackman"])),
                   snip_edges=draw(st.booleans()),
                   remove_dc_offset=draw(st.booleans()),
                   preemphasis_coefficient=draw(st.sampled_from([0.0, 0.5, 0.97])),
                   use_energy=draw(st.booleans()),
                   raw_energy=draw(st.booleans()),
                   use_power=draw(st.booleans()),
                   use_log_fbank=draw(st.booleans()),
                   round_to_power_of_two=draw(st.booleans()),
                   subtract_mean=draw(st.booleans()))
    samples = draw(st.integers(260, 2400))
    return speech_like(samples, seed=draw(st.integers(0, 100)), sample_rate=8000.0)[0], options


@settings(PROPERTY, max_examples=15)
@given(fbank_calls())
def test_fbank_on_the_kernel_path_equals_the_float64_reference(call):
    wave, options = call
    with rt.use_backend("triton"):
        out = rt.fbank(wave.float(), **options)
    expected = fbank64(wave, **options)
    assert out.shape == expected.shape
    assert rel_error(out, expected) <= 3e-5
