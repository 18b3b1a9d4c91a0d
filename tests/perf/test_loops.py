"""The loop the SASS counts come from, on real kernels compiled for sm_90: the loop executing the most
instructions (its own instructions x passes), with a barrier's spin loop reported apart, never chosen; and on a
written-out listing, which backward branches are loops."""
import pytest
import torch

from rlx_triton.backends.triton.launches import Launch
from rlx_triton.devices import profile
from rlx_triton.perf.compiled import CompileJob, compile_all, sass_loops
from rlx_triton.perf.launch_estimate import estimate
from tests.perf.kernels import row_sum_kernel, stepped_barrier_kernel

H200 = profile("h200")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    x = torch.empty(64 * 4096, device="meta")
    counter = torch.empty(1, device="meta", dtype=torch.int32)
    records = {
        "row_sum": Launch(row_sum_kernel, (64,), (x, x, 4096), meta={"BLOCK": 128}, num_warps=4, num_stages=2,
                          bytes_read=64 * 4096 * 4, bytes_written=64 * 4, flops=64 * 4096),
        "barrier": Launch(stepped_barrier_kernel, (64,), (x, counter, 589), meta={"BLOCK": 128}, num_warps=4,
                          num_stages=1, bytes_read=64 * 128 * 4, bytes_written=64 * 128 * 4, flops=2 * 589 * 64 * 128),
    }
    jobs = {name: CompileJob.of(record, 90) for name, record in records.items()}
    facts = compile_all(jobs.values(), cache_dir=str(tmp_path_factory.mktemp("perf-cache")), workers=2)
    return {name: (records[name], facts[job]) for name, job in jobs.items()}


def test_the_barrier_poll_is_a_spin_loop_nested_in_the_step_loop(compiled):
    _record, facts = compiled["barrier"]
    assert facts.ok, facts.error
    spin = [loop for loop in facts.loops if loop["spin"]]
    steps = [loop for loop in facts.loops if not loop["spin"]]
    assert len(spin) == 1 and spin[0]["size"] <= 32 and spin[0]["depth"] >= 1
    assert steps and all(loop["size"] > spin[0]["size"] for loop in steps)
    assert any(loop["start"] <= spin[0]["start"] and spin[0]["end"] <= loop["end"] for loop in steps)


def test_the_counts_come_from_the_step_loop_not_the_spin_loop(compiled):
    record, facts = compiled["barrier"]
    kernel = estimate(record, facts, H200)
    step_loop = max((loop for loop in facts.loops if not loop["spin"]), key=lambda loop: loop["own"])
    assert kernel.scope == "loop" and kernel.ffma == step_loop["ffma"] > 0
    assert [entry["size"] for entry in kernel.spin_loops] == [loop["own"] for loop in facts.loops if loop["spin"]]
    # the step loop makes the launch's FLOPs over one pass's FFMA: about 589 passes per CTA, not the poll's
    passes = record.flops / (record.ctas * facts.num_warps * step_loop["pass_flops"])
    assert kernel.trips_rule == "work"
    assert kernel.warp_instructions >= step_loop["own"] * passes * facts.num_warps * record.ctas


def test_a_load_loop_makes_the_passes_its_loads_need(compiled):
    record, facts = compiled["row_sum"]
    kernel = estimate(record, facts, H200)
    loops = [loop for loop in facts.loops if not loop["spin"]]
    assert facts.ok and len(loops) == len(facts.loops) >= 1 and kernel.spin_loops == []
    hot = max(loops, key=lambda loop: (loop["pass_flops"], loop["pass_bytes"]))
    # a row is 4096 fp32 values; a pass of the 4 warps loads pass_bytes each (the compiler may unroll the
    # BLOCK loop, so a pass can hold several of its iterations)
    passes = 4096 * 4 / (facts.num_warps * hot["pass_bytes"])
    assert passes == int(passes) and hot["pass_bytes"] % (32 * 4) == 0
    straight = facts.kernel_instructions - sum(loop["own"] for loop in facts.loops)
    others = sum(loop["own"] for loop in loops if loop is not hot)
    assert kernel.warp_instructions == (straight + others + hot["own"] * passes) * facts.num_warps * record.ctas


def _sass(*instructions: str) -> str:
    """A cuobjdump-style listing: one instruction every 16 bytes from address 0."""
    lines = (f"        /*{16 * index:04x}*/                   {text} ;" for index, text in enumerate(instructions))
    return "\n".join(lines)


def test_a_branch_back_from_code_after_the_exit_is_not_a_loop():
    """sm_80 puts a warp shuffle's convergence path after the kernel's EXIT and branches back from it: that span
    holds an unpredicated EXIT and is no loop; the time loop around it, and a predicated EXIT inside a loop,
    stay loops."""
    sass = _sass(
        "MOV R0, RZ",                       # 0x00
        "FFMA R1, R2, R3, R1",              # 0x10: the time loop's body
        "@P1 BRA 0x70",                     # 0x20: to the out-of-line path
        "FADD R1, R1, R4",                  # 0x30: where the path returns
        "@P0 EXIT",                         # 0x40: a predicated EXIT inside the loop
        "@P2 BRA 0x10",                     # 0x50: the time loop's back edge
        "EXIT",                             # 0x60: the kernel's end
        "SHFL.BFLY PT, R5, R1, 0x1, 0x1f",  # 0x70: the out-of-line path
        "BRA 0x30")                         # 0x80: back into the loop
    loops, instructions = sass_loops(sass)
    assert instructions == 9
    assert [(loop["start"], loop["end"]) for loop in loops] == [(0x10, 0x50)]
