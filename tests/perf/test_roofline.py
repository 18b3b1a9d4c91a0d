"""The analysis model on hand counts: occupancy, waves, SM fill, floor and estimate, and the SASS mix."""
import math

import pytest
import torch

from rlx_triton.backends.triton.launches import Launch
from rlx_triton.devices import profile
from rlx_triton.perf.compiled import Compiled, sass_mix
from rlx_triton.perf.launch_estimate import estimate
from rlx_triton.perf.roofline import ASSUMPTIONS, KernelEstimate, case_totals, occupancy
from tests.perf.kernels import scaled_add_kernel

H200 = profile("h200")
A100 = profile("a100-80gb")


def test_occupancy_of_the_decode_split_tile_on_h200():
    # 97 registers, 38.9 KB shared memory, 8 warps: registers allow 2 CTAs, shared memory 5, warps 8
    occ = occupancy(H200, registers=97, shared=39834, num_warps=8)
    per_warp = math.ceil(97 * 32 / 256) * 256
    assert occ.by_registers == 65536 // (per_warp * 8) == 2
    assert occ.by_shared == 233472 // (39834 + 1024) == 5
    assert occ.by_warps == 8 and occ.hardware == 32
    assert occ.ctas_per_sm == 2 and occ.limiter == "registers"


def test_shared_memory_above_the_per_cta_limit_does_not_fit():
    assert occupancy(A100, registers=32, shared=170 * 1024, num_warps=4).ctas_per_sm == 0
    assert occupancy(A100, registers=32, shared=0, num_warps=1).ctas_per_sm == 32   # the hardware limit


def _record(ctas, bytes_read=0, flops=0, unit="fp32_fma"):
    x = torch.empty(16, device="meta")
    return Launch(scaled_add_kernel, (ctas,), (x, x, x, 16, 1, 1.0, False), meta={"BLOCK": 16}, num_warps=8,
                  num_stages=2, bytes_read=bytes_read, flops=flops, unit=unit)


def _compiled(registers=97, shared=39834):
    return Compiled(ok=True, registers=registers, shared=shared, num_warps=8, spills=0, scope="loop", mma=16,
                    ldg128=8, ldgsts=8, ffma=0, instructions=400)


def test_a_grid_smaller_than_the_sms_fills_only_its_share():
    record = _record(32, bytes_read=134_217_728)
    kernel = estimate(record, _compiled(), H200)
    floor = 134_217_728 / 4.8e12 * 1e6
    assert kernel.ctas == 32 and kernel.ctas_per_sm == 2
    assert kernel.waves == pytest.approx(32 / 264, abs=1e-4)
    assert kernel.sm_fill == pytest.approx(32 / 132, abs=1e-4)
    assert kernel.floor_us == pytest.approx(floor, abs=1e-3)
    achievable = 134_217_728 / 4.3e12 * 1e6   # the estimate moves the bytes at the achievable bandwidth
    assert kernel.est_us == pytest.approx(achievable * 132 / 32 + H200.launch_us, abs=1e-3)


def test_full_waves_run_at_peak_and_the_last_wave_at_its_fill():
    record = _record(2048, bytes_read=10**9)
    kernel = estimate(record, _compiled(), H200)
    slots = 132 * 2
    full, rest = divmod(2048, slots)              # 7 full waves, 200 CTAs left: every SM busy again
    wave_us = 10**9 / 4.3e12 * 1e6 / 2048 * slots
    assert kernel.waves == pytest.approx(2048 / slots, abs=1e-4) and kernel.sm_fill == 1.0
    assert kernel.est_us == pytest.approx(full * wave_us + wave_us * rest / slots + H200.launch_us, abs=1e-3)


def test_compute_bound_cases_have_no_bandwidth_fraction():
    memory = estimate(_record(264, bytes_read=10**8), _compiled(), H200)
    compute = estimate(_record(264, bytes_read=10**6, flops=10**12, unit="tf32x3"), _compiled(), H200)
    assert compute.floor_us == pytest.approx(10**12 / (494.7e12 / 3) * 1e6, rel=1e-4)
    assert case_totals([compute], H200)[2] is None
    floor_us, est_us, bw_fraction = case_totals([memory], H200)
    assert bw_fraction == pytest.approx(10**8 / (est_us * 1e-6) / 4.3e12, abs=1e-4)


def test_a_kernel_that_did_not_compile_has_no_estimate():
    kernel = estimate(_record(32, bytes_read=100), Compiled(ok=False, error="PTXASError: boom"), H200)
    assert kernel.est_us is None and kernel.regs is None and "PTXASError" in kernel.error
    assert case_totals([kernel], H200)[1] is None


def test_kernel_json_has_exactly_the_agreed_keys():
    kernel = estimate(_record(32, bytes_read=100), _compiled(), H200)
    assert list(kernel.as_json()) == ["name", "grid", "ctas", "ctas_per_sm", "waves", "sm_fill", "regs", "smem",
                                      "spills", "mma", "ldg128", "bytes", "flops", "unit", "floor_us", "est_us",
                                      "issue_us", "chain_steps", "chain_us", "bound", "est_low_us", "est_high_us",
                                      "warp_instructions", "spin_loops", "trips_rule"]
    assert KernelEstimate.JSON_KEYS == tuple(kernel.as_json())


def test_every_assumption_is_a_sentence_and_uncalibrated_is_said():
    assert all(isinstance(text, str) and len(text) > 20 for text in ASSUMPTIONS)
    assert any(text.startswith("uncalibrated") for text in ASSUMPTIONS)


def test_a_library_kernels_chain_is_priced_like_a_launchs():
    from rlx_triton.perf.roofline import LibraryKernel, constants, library_estimate

    serial = LibraryKernel("recurrence", 1000, 1000, chain={"l2_hit": 100, "cta_barrier": 100})
    row = library_estimate([serial], H200)["kernels"][0]
    nominal = constants(H200)
    assert row["chain_us"] == pytest.approx(100 * (nominal["l2_hit"] + nominal["cta_barrier"]) / 1000, abs=1e-3)
    assert row["bound"] == "latency"


_SASS = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   FFMA R5, R6, R7, R8 ;
        /*0030*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR4][R10.64] ;
        /*0040*/                   HMMA.16816.F32 R12, R16, R22, R12 ;
        /*0050*/                   FFMA R5, R6, R7, R8 ;
        /*0060*/              @!P2 BRA 0x30 ;
        /*0070*/                   FFMA R1, R1, R1, R1 ;
        /*0080*/                   FFMA R1, R1, R1, R1 ;
        /*0090*/               @P0 BRA 0x70 ;
        /*00a0*/                   EXIT ;
        /*00b0*/                   BRA 0xb0;
"""


def test_sass_mix_without_a_launch_counts_the_largest_loop():
    mix = sass_mix(_SASS)
    # two loops: 0x30-0x60 (1 HMMA, 1 FFMA, 1 cp.async: 4 instructions) and 0x70-0x90 (2 FFMA, 3 instructions);
    # the branch to itself at the end is no loop
    assert mix["scope"] == "loop"
    assert (mix["mma"], mix["ffma"], mix["ldgsts"], mix["ldg128"], mix["instructions"]) == (1, 1, 1, 1, 4)


def test_sass_mix_without_a_loop_counts_the_kernel():
    listing = "\n".join(line for line in _SASS.splitlines() if "BRA 0x" not in line or "0xb0" in line)
    mix = sass_mix(listing)
    assert mix["scope"] == "kernel"
    assert (mix["mma"], mix["ffma"], mix["ldg128"], mix["ldgsts"]) == (1, 4, 2, 1)


def test_the_library_path_estimate_is_the_roofline_with_every_sm_busy_plus_a_launch_each():
    from rlx_triton.perf.roofline import LibraryKernel, library_estimate

    kernels = [LibraryKernel("copy", 48_000_000, 48_000_000), LibraryKernel("gemm", 4_800_000, 0, 6.7e11)]
    estimate = library_estimate(kernels, H200)
    copy_us, gemm_us = 96e6 / 4.8e12 * 1e6, 6.7e11 / 67e12 * 1e6          # 20 us of bytes, 10 us of FLOPs
    assert [k["floor_us"] for k in estimate["kernels"]] == [pytest.approx(copy_us), pytest.approx(gemm_us)]
    achievable_copy_us = 96e6 / 4.3e12 * 1e6                                # the same terms as a Triton launch
    assert estimate["est_us"] == pytest.approx(achievable_copy_us + gemm_us + 2 * H200.launch_us, abs=1e-3)
    assert estimate["est_low_us"] < estimate["est_us"] < estimate["est_high_us"]
    assert estimate["launches"] == 2 and "library path estimate" in estimate["label"]
    assert any(line.startswith("library path estimate") for line in ASSUMPTIONS)
