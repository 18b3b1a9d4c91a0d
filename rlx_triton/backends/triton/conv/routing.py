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
# Device class -> candidate tag. sm_90 / sm_80: true fp32 on TF32 tensor cores, 32 positions x 64 channel
# lanes over 8 warps, one stage, chosen on rlx-triton perf's estimates until bench/sincnet.py measures a GPU.
# The convs are issue-bound on preparing each sample (loads, normalisation, mirrored sums, TF32 splits), so
# the widest channel tile shares that work most: all 40 + 40 sinc filters and a block's 60 channels in one
# program; the sinc kernel also takes the pool's three phases as rows of one tile (each weight tile feeds
# all of them). At the bench shape (32 x 10 s) SincNet est. 1929 -> 533 us on an H200 (library 997 us; the
# sinc conv 1365 -> 269 us at 216 registers, the blocks 381 + 129 -> 164 + 46 us, no spills) and 1587 ->
# 1195 us on an A100 (library 2835 us), where the sinc kernel spills 24 B a thread (255 registers: sm_80's
# MMAs take their A operand from registers). In the interpreter the cost is per program, so the widest ieee
# tile wins (measured on SincNet, 2 x 2000 samples, on a loaded 2-core machine: 64x32 tiles 5.8-10 s, 128x64
# tiles 3.3-5 s per forward).
RECIPES = {"interpreter": ConvVariant["IEEE_P128_CO64"].tag(), "sm90": ConvVariant["TF32X3_P32_CO64_W8"].tag(),
           "sm80": ConvVariant["TF32X3_P32_CO64_W8"].tag()}
SPEED_EVIDENCE: dict = {}
