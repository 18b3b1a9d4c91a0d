"""1-D conv routing data, read by rlx_triton.router: COVERAGE, APPROVALS, RECIPES, SPEED_EVIDENCE."""
from __future__ import annotations

from rlx_triton.backends.candidates import approvals_by_precision
from rlx_triton.planner.candidates.conv import ConvVariant
from rlx_triton.router.coverage import Coverage

COVERAGE = Coverage(
    ops=frozenset({"sincnet", "conv1d"}),
    devices=frozenset({"cuda", "cpu"}),
    dtypes=frozenset({"float32", "float16", "bfloat16"}),
    # batch is grid dim z (CUDA limit 65535); taps/stride are loop bounds only
    ranges={"batch": (1, 65535), "c_in": (1, 1 << 16), "c_out": (1, 1 << 16), "taps": (1, 4096),
            "stride": (1, 4096)},
    features={
        "groups": frozenset({1}),
        "padding_mode": frozenset({"zeros"}),        # symmetric zero padding (not 'same' with odd total)
        "pool": frozenset(range(1, 17)),             # fused max-pool kernel = stride
        "abs": frozenset({True, False}),             # conv1d epilogue: |x| before the pool
        "leaky": frozenset({True, False}),           # conv1d epilogue: leaky ReLU after the pool
        "blocks": frozenset(range(0, 65)),           # SincNet: Conv1d blocks after the sinc conv
        "requires_grad": frozenset({False}),         # kernels are forward-only; autograd goes to torch
        "streaming": frozenset({False}),             # SincNet: the non-streaming (normalized) forward
        "sample_rate": frozenset({16000}),
    },
)

# Approvals are the max relative error the tests re-measure against float64
# (tests/triton/test_conv.py::test_every_conv_candidate_runs_and_every_approval_holds). tf32x3 candidates
# run dot_split, whose TF32 halves are exact TF32 values built by the kernel's own arithmetic, so the
# interpreter's float32 dots compute what the tensor cores compute (up to summation order): their error is
# measured there too. Plain tf32 rounds inside the MMA, which the interpreter does not: unapproved
# (diarization stays true fp32).
CONV1D_MAX_REL_ERR = 1e-5
_WHERE = "interpreter, tests/triton/test_conv.py (conv1d + SincNet blocks vs float64)"
APPROVALS = approvals_by_precision("conv", {"ieee": CONV1D_MAX_REL_ERR, "tf32x3": CONV1D_MAX_REL_ERR}, _WHERE)
# Device class -> candidate tag. sm_90 / sm_80: true fp32 on TF32 tensor cores with 64 x 32 tiles (the sinc
# conv's channel tile is its own 8 + 8 filters), chosen on rlx-triton perf's estimates until
# bench/sincnet.py measures a GPU: at the bench shape the 60-channel blocks hold 192 (sm_90) / 168 (sm_80)
# registers with 64 x 32 and 250 / 255 with 48 B of spills (sm_80) with 64 x 64; SincNet est. 229 vs 235 us
# (H200), 638 vs 658 us (A100). In the interpreter the cost is per program, so the widest ieee tile wins
# (measured on SincNet, 2 x 2000 samples, on a loaded 2-core machine: 64x32 tiles 5.8-10 s, 128x64 tiles
# 3.3-5 s per forward).
RECIPES = {"interpreter": ConvVariant["IEEE_P128_CO64"].tag(), "sm90": ConvVariant["TF32X3_P64_CO32"].tag(),
           "sm80": ConvVariant["TF32X3_P64_CO32"].tag()}
SPEED_EVIDENCE: dict = {}
