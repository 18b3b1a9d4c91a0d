"""2-D conv routing data, read by rlx_triton.router: COVERAGE, APPROVALS, RECIPES (per layer geometry:
recipe_key), SPEED_EVIDENCE."""
from __future__ import annotations

from rlx_triton.backends.candidates import approvals_by_precision
from rlx_triton.planner.candidates.conv import ConvVariant
from rlx_triton.router.coverage import Coverage

COVERAGE = Coverage(
    ops=frozenset({"conv2d", "stats_pool"}),
    devices=frozenset({"cuda", "cpu"}),
    dtypes=frozenset({"float32", "float16", "bfloat16"}),
    ranges={"taps": (1, 49), "stride": (1, 4), "c_in": (1, 1 << 16), "c_out": (1, 1 << 17),
            "batch": (1, 1 << 20)},
    features={
        "kernel": frozenset((kh, kw) for kh in range(1, 8) for kw in range(1, 8)),
        "padding": frozenset(range(0, 4)),
        "residual": frozenset({True, False}),
        "relu": frozenset({True, False}),
        "weighted": frozenset({True, False}),  # stats_pool with or without frame weights
        "requires_grad": frozenset({False}),  # forward-only kernels: calls autograd records go to torch
    },
)

# True-fp32 candidates (ieee, tf32x3) are approved on the error the sweep test re-measures
# (tests/triton/test_conv2d.py::test_every_conv_candidate_meets_its_approval). The interpreter computes
# fp32 dots exactly whatever the precision, so it cannot measure TF32 rounding: plain tf32 stays
# unapproved until a GPU run (tests marked gpu) measures it.
_WHERE = "interpreter, tests/triton/test_conv2d.py (3x3/1x1, stride 1/2, residual+relu, vs float64)"
CONV2D_MAX_REL_ERR = 1e-5


APPROVALS = approvals_by_precision("conv", {"ieee": CONV2D_MAX_REL_ERR, "tf32x3": CONV2D_MAX_REL_ERR}, _WHERE)


def _bucket(value: int) -> int:
    """The power of two at or above value: what the route cache buckets a field to."""
    return 1 << max(0, (int(value) - 1).bit_length())


def recipe_key(request) -> str:
    """The layer geometry a recipe is chosen for: "KHxKW/stride c_in->c_out", channels in the route
    cache's power-of-two buckets (requests that share a route share a recipe)."""
    fields = request.field_map
    kh, kw = request.feature_map.get("kernel", (1, 1))
    return f"{kh}x{kw}/{fields['stride']} {_bucket(fields['c_in'])}->{_bucket(fields['c_out'])}"


def _trunk_recipes() -> dict:
    """The tf32x3 tile of each conv geometry of a WeSpeaker ResNet (m_channels 32: ResNet34 and its kin), by
    `rlx-triton perf --device h200 / a100 embedding` (estimates until bench/embedding.py measures a GPU).

    The stride-1 3x3 layers run Winograd F(2, 3) (conv2d launch `winograd_applies`) on the 128-pixel, 32-channel
    tile: on sm_90 it holds 162 registers, 3 CTAs per SM, layer1..layer4 est. 270 / 251 / 248 / 261 us on an H200
    against the library's 925 / 641 / 501 / 434 (the direct form: 447 / 374 / 370 / 390); on sm_80 it holds 255
    with 40-48 B of spills a thread, reloaded outside the channel loop (A100 est. 771 / 776 / 786 / 774 us against
    the library's 2551 / 1865 / 1543 / 1368; the 64-channel tile 778-790 us on layer2..4). The other layers run
    the direct form: the 32-wide channel tile on the one-channel stem, the 64-wide one on the downsampling and
    shortcut convs (>= 3 CTAs per SM on both archs). The seg_1 projection (5120 -> 256 as a 1x1 conv over 32
    rows) is a weight stream on 8 CTAs: the ieee tile reads the weights once, the split halves would read them
    twice (four split terms, when this was chosen: est. 45 vs 79 us on an H200)."""
    narrow, wide = ConvVariant["TF32X3_P128_CO32"].tag(), ConvVariant["TF32X3_P64_CO64"].tag()
    table = {"3x3/1 1->32": narrow, "3x3/1 32->32": narrow, "1x1/1 8192->256": ConvVariant["IEEE_P64_CO32"].tag(),
             "*": wide}
    for c_in in (32, 64, 128):
        table.update({f"3x3/2 {c_in}->{2 * c_in}": wide, f"1x1/2 {c_in}->{2 * c_in}": wide,
                      f"3x3/1 {2 * c_in}->{2 * c_in}": narrow})
    return table


# Device class -> candidate tag, or layer geometry (recipe_key) -> tag. sm_90 and sm_80: the trunk tiles
# above (true fp32, tf32x3; estimates of rlx-triton perf until bench/embedding.py measures a GPU;
# `rlx-triton tune wespeaker` records measured winners, which take precedence). In the interpreter the
# cost is per program, so the widest ieee tile wins (measured on a 2x4x16x48 3x3 conv: 128x64 tiles
# 0.17 s, 64x32 tiles 0.34 s).
RECIPES = {"interpreter": ConvVariant["IEEE_P128_CO64"].tag(), "sm90": _trunk_recipes(), "sm80": _trunk_recipes()}
SPEED_EVIDENCE: dict = {}
