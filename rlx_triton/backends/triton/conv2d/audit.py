"""2-D conv audit specs: what `rlx-triton audit` compiles for sm_80 / sm_90."""
from __future__ import annotations

from rlx_triton.backends.triton.audit import AuditSpec
from rlx_triton.backends.triton.conv.audit import aligned_pointers
from rlx_triton.backends.triton.conv.launch import all_candidates, default_candidate
from rlx_triton.backends.triton.conv2d.kernels import _conv2d_kernel, _stats_pool_kernel
from rlx_triton.backends.triton.conv2d.launch import _POOL_BLOCK_D, _meta


def _audit_kernels() -> list:
    candidates = tuple(all_candidates())
    conv_signature = {
        "x_ptr": "*{dt}", "w_ptr": "*fp32", "w_split_ptr": "*fp32", "w_wino_ptr": "*fp32", "bias_ptr": "*fp32",
        "res_ptr": "*{dt}", "out_ptr": "*{dt}",
        "batch": "i32", "c_in": "i32", "height": "i32", "width": "i32",
        "c_out": "i32", "out_h": "i32", "out_w": "i32", "stride": "i32", "padding": "i32",
        "stride_wo": "i32", "stride_wi": "i32", "stride_wh": "i32", "stride_ww": "i32", "batch_bucket": "i32",
        "KH": "constexpr", "KW": "constexpr", "FOLD_TAPS": "constexpr", "WINOGRAD": "constexpr", "HAS_BIAS": "constexpr",
        "HAS_RESIDUAL": "constexpr",
        "APPLY_RELU": "constexpr", "PRECISION": "constexpr",
        "BLOCK_P": "constexpr", "BLOCK_CO": "constexpr", "BLOCK_K": "constexpr",
    }
    pool_signature = {
        "x_ptr": "*{dt}", "w_ptr": "*{dt}", "out_ptr": "*{dt}",
        "features": "i32", "frames": "i32", "num_speakers": "i32",
        "HAS_WEIGHTS": "constexpr", "BLOCK_D": "constexpr", "BLOCK_T": "constexpr",
    }
    return [
        AuditSpec(
            name="conv2d_igemm_3x3", family="conv", kernel=_conv2d_kernel, signature=conv_signature,
            meta=lambda c, dt: dict(KH=3, KW=3, FOLD_TAPS=False, WINOGRAD=False, HAS_BIAS=True, HAS_RESIDUAL=True, APPLY_RELU=True,
                                    **_meta(c)),
            candidates=candidates, default=default_candidate(), dtypes=("fp32", "fp16", "bf16"),
            expects_mma=lambda c, dt: c.precision != "ieee", divisible=aligned_pointers(conv_signature)),
        AuditSpec(  # the stride-1 3x3 layers' Winograd form (tf32x3 candidates; the others compile the direct form)
            name="conv2d_winograd_3x3", family="conv", kernel=_conv2d_kernel, signature=conv_signature,
            meta=lambda c, dt: dict(KH=3, KW=3, FOLD_TAPS=False, WINOGRAD=True, HAS_BIAS=True, HAS_RESIDUAL=True,
                                    APPLY_RELU=True, **_meta(c)),
            candidates=candidates, default=default_candidate(), dtypes=("fp32",),
            expects_mma=lambda c, dt: c.precision != "ieee", divisible=aligned_pointers(conv_signature)),
        AuditSpec(
            name="conv2d_igemm_1x1", family="conv", kernel=_conv2d_kernel, signature=conv_signature,
            meta=lambda c, dt: dict(KH=1, KW=1, FOLD_TAPS=False, WINOGRAD=False, HAS_BIAS=True, HAS_RESIDUAL=False, APPLY_RELU=False,
                                    **_meta(c)),
            candidates=candidates, default=default_candidate(), dtypes=("fp32",),
            expects_mma=lambda c, dt: c.precision != "ieee", divisible=aligned_pointers(conv_signature)),
        AuditSpec(  # the stem: one input channel, taps folded into the reduction
            name="conv2d_igemm_stem", family="conv", kernel=_conv2d_kernel, signature=conv_signature,
            meta=lambda c, dt: dict(KH=3, KW=3, FOLD_TAPS=True, WINOGRAD=False, HAS_BIAS=True, HAS_RESIDUAL=False, APPLY_RELU=True,
                                    **_meta(c)),
            candidates=candidates, default=default_candidate(), dtypes=("fp32",),
            expects_mma=lambda c, dt: c.precision != "ieee", divisible=aligned_pointers(conv_signature)),
        AuditSpec(
            name="conv2d_stats_pool", family="conv", kernel=_stats_pool_kernel, signature=pool_signature,
            meta=lambda c, dt: dict(HAS_WEIGHTS=True, BLOCK_D=_POOL_BLOCK_D, BLOCK_T=64, num_warps=4, num_stages=1),
            # the pooling kernel has fixed blocks: no candidate field changes it, so one variant is compiled
            candidates=(default_candidate(),), default=default_candidate(), dtypes=("fp32", "fp16", "bf16"),
            expects_mma=False),
    ]


AUDIT_KERNELS = _audit_kernels()
