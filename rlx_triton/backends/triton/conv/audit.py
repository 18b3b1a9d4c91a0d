"""1-D conv audit specs: what `rlx-triton audit` compiles for sm_80 / sm_90."""
from __future__ import annotations

from rlx_triton.backends.triton.audit import AuditSpec
from rlx_triton.backends.triton.conv.kernels import (_conv1d_kernel, _epilogue_kernel, _row_combine_stats_kernel,
                                                     _row_norm_kernel, _row_partial_stats_kernel, _sinc_conv_kernel)
from rlx_triton.backends.triton.conv.launch import (_STATS_BLOCK, _STATS_CHUNK, _meta, _sinc_meta, all_candidates,
                                                    default_candidate, sinc_tile)


def _sinc_tile_meta(candidate) -> dict:
    """The sinc kernel's tiles for SincNet's 80 filters and pool of 3, as a GPU launch takes them."""
    block_p, block_f = sinc_tile(80, 3, candidate)
    return dict(BLOCK_P=block_p, BLOCK_F=block_f)


def aligned_pointers(signature: dict) -> tuple:
    """The pointer arguments of an audit signature: what the launchers pass is torch's allocations and the
    packed / split weights, 16-byte aligned, so the JIT compiles them with the divisibility hint (vector
    loads, cp.async) and the audit does the same."""
    return tuple(name for name, kind in signature.items() if kind.startswith("*"))


def _audit_kernels() -> list:
    candidates = tuple(all_candidates())
    conv_signature = {
        "x_ptr": "*{dt}", "w_ptr": "*{dt}", "w_split_ptr": "*fp32", "bias_ptr": "*{dt}", "in_center_ptr": "*fp32",
        "in_scale_ptr": "*fp32", "in_shift_ptr": "*fp32", "out_ptr": "*{dt}",
        "C_in": "i32", "L_in": "i32", "C_out": "i32", "L_out": "i32",
        "stride_xb": "i64", "stride_xc": "i32", "stride_xl": "i32",
        "stride_ob": "i64", "stride_oc": "i32", "stride_ol": "i32",
        "conv_stride": "i32", "padding": "i32", "dilation": "i32",
        "in_slope": "fp32", "out_slope": "fp32", "batch_bucket": "i32", "length_bucket": "i32",
        "TAPS": "constexpr", "POOL": "constexpr", "HAS_BIAS": "constexpr", "IN_AFFINE": "constexpr",
        "IN_LEAKY": "constexpr", "ABS": "constexpr", "OUT_LEAKY": "constexpr", "PRECISION": "constexpr",
        "BLOCK_P": "constexpr", "BLOCK_CO": "constexpr", "BLOCK_K": "constexpr", "DOT_K": "constexpr",
    }
    sinc_signature = {
        "x_ptr": "*{dt}", "w_ptr": "*fp32", "w_split_ptr": "*fp32", "tap_sum_ptr": "*fp32",
        "in_center_ptr": "*fp32", "in_scale_ptr": "*fp32", "in_shift_ptr": "*fp32", "out_ptr": "*fp32",
        "L_in": "i32", "C_out": "i32", "L_out": "i32", "stride_xb": "i64", "stride_xl": "i32",
        "stride_ob": "i64", "stride_oc": "i32", "stride_ol": "i32", "conv_stride": "i32",
        "batch_bucket": "i32", "length_bucket": "i32",
        "HALF": "constexpr", "POOL": "constexpr", "PHASES": "constexpr", "ABS": "constexpr", "PRECISION": "constexpr",
        "BLOCK_P": "constexpr", "BLOCK_F": "constexpr", "BLOCK_K": "constexpr", "DOT_K": "constexpr",
    }
    norm_signature = {
        "x_ptr": "*fp32", "gamma_ptr": "*fp32", "beta_ptr": "*fp32", "center_ptr": "*fp32",
        "scale_ptr": "*fp32", "shift_ptr": "*fp32", "out_ptr": "*{dt}", "n_rows": "i32", "C": "i32", "L": "i32",
        "stride_xb": "i64", "stride_xc": "i32", "stride_xl": "i32",
        "stride_ob": "i64", "stride_oc": "i32", "stride_ol": "i32",
        "eps": "fp32", "slope": "fp32",
        "HAS_AFFINE": "constexpr", "APPLY": "constexpr", "BLOCK_R": "constexpr", "BLOCK_L": "constexpr",
    }
    epilogue_signature = {
        "y_ptr": "*fp32", "bias_ptr": "*{dt}", "out_ptr": "*{dt}", "C": "i32", "L_conv": "i32",
        "L_out": "i32", "stride_yb": "i64", "stride_yc": "i32", "stride_yl": "i32",
        "stride_ob": "i64", "stride_oc": "i32", "stride_ol": "i32", "out_slope": "fp32",
        "POOL": "constexpr", "HAS_BIAS": "constexpr", "ABS": "constexpr", "OUT_LEAKY": "constexpr",
        "BLOCK": "constexpr",
    }
    flags_off = dict(HAS_BIAS=True, IN_AFFINE=False, IN_LEAKY=False, ABS=False, OUT_LEAKY=False)
    return [
        AuditSpec(
            name="conv1d_igemm", family="conv", kernel=_conv1d_kernel, signature=conv_signature,
            meta=lambda c, dt: dict(TAPS=5, POOL=1, **flags_off, **_meta(c)),
            candidates=candidates, default=default_candidate(), dtypes=("fp32", "fp16", "bf16"),
            expects_mma=lambda c, dt: c.precision != "ieee", divisible=aligned_pointers(conv_signature)),
        AuditSpec(
            name="conv1d_sinc_abs_pool", family="conv", kernel=_conv1d_kernel, signature=conv_signature,
            meta=lambda c, dt: dict(TAPS=251, POOL=3, HAS_BIAS=False, IN_AFFINE=True, IN_LEAKY=False,
                                    ABS=True, OUT_LEAKY=False, **_meta(c)),
            candidates=candidates, default=default_candidate(), dtypes=("fp32",),
            expects_mma=lambda c, dt: c.precision != "ieee", divisible=aligned_pointers(conv_signature)),
        AuditSpec(
            name="conv1d_sinc_symmetric", family="conv", kernel=_sinc_conv_kernel, signature=sinc_signature,
            meta=lambda c, dt: dict(HALF=125, POOL=3, PHASES=4, ABS=True, **_sinc_tile_meta(c), **_sinc_meta(c)),
            candidates=candidates, default=default_candidate(), dtypes=("fp32", "fp16", "bf16"),
            expects_mma=lambda c, dt: c.precision != "ieee", divisible=aligned_pointers(sinc_signature)),
        AuditSpec(
            name="conv1d_norm_leaky_pool", family="conv", kernel=_conv1d_kernel, signature=conv_signature,
            meta=lambda c, dt: dict(TAPS=5, POOL=3, HAS_BIAS=True, IN_AFFINE=True, IN_LEAKY=True,
                                    ABS=False, OUT_LEAKY=False, **_meta(c)),
            candidates=candidates, default=default_candidate(), dtypes=("fp32",),
            expects_mma=lambda c, dt: c.precision != "ieee", divisible=aligned_pointers(conv_signature)),
        AuditSpec(
            name="conv1d_row_norm", family="conv", kernel=_row_norm_kernel, signature=norm_signature,
            meta=lambda c, dt: dict(HAS_AFFINE=True, APPLY=True, BLOCK_R=4, BLOCK_L=1024, num_warps=4,
                                    num_stages=1),
            candidates=candidates[:1], default=candidates[0], dtypes=("fp32", "fp16", "bf16"),
            expects_mma=False),
        AuditSpec(
            name="conv1d_row_partial_stats", family="conv", kernel=_row_partial_stats_kernel,
            signature={"x_ptr": "*{dt}", "part_ptr": "*fp32", "center_ptr": "*fp32", "C": "i32", "L": "i32",
                       "n_chunks": "i32",
                       "stride_xb": "i64", "stride_xc": "i32", "stride_xl": "i32",
                       "CHUNK": "constexpr", "BLOCK_L": "constexpr"},
            meta=lambda c, dt: dict(CHUNK=_STATS_CHUNK, BLOCK_L=_STATS_BLOCK, num_warps=4, num_stages=1),
            candidates=candidates[:1], default=candidates[0], dtypes=("fp32", "fp16", "bf16"),
            expects_mma=False),
        AuditSpec(
            name="conv1d_row_combine_stats", family="conv", kernel=_row_combine_stats_kernel,
            signature={"part_ptr": "*fp32", "gamma_ptr": "*{dt}", "beta_ptr": "*{dt}", "scale_ptr": "*fp32",
                       "shift_ptr": "*fp32", "n_rows": "i32", "C": "i32", "L": "i32", "n_chunks": "i32",
                       "eps": "fp32", "HAS_AFFINE": "constexpr", "CHUNK": "constexpr",
                       "BLOCK_R": "constexpr", "BLOCK_C": "constexpr"},
            meta=lambda c, dt: dict(HAS_AFFINE=True, CHUNK=_STATS_CHUNK, BLOCK_R=16, BLOCK_C=64, num_warps=4,
                                    num_stages=1),
            candidates=candidates[:1], default=candidates[0], dtypes=("fp32", "fp16", "bf16"),
            expects_mma=False),
        AuditSpec(
            name="conv1d_epilogue", family="conv", kernel=_epilogue_kernel, signature=epilogue_signature,
            meta=lambda c, dt: dict(POOL=3, HAS_BIAS=True, ABS=True, OUT_LEAKY=True, BLOCK=1024,
                                    num_warps=4, num_stages=1),
            candidates=candidates[:1], default=candidates[0], dtypes=("fp32", "fp16", "bf16"),
            expects_mma=False),
    ]


AUDIT_KERNELS = _audit_kernels()
