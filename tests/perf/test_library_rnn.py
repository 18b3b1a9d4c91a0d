"""cuDNN LSTM model (rlx_triton.perf.library.rnn) and the lstm family's torch path (backends/torch_ref/lstm.py):
the algorithm torch asks for, the projection GEMMs, the recurrence as a chain of dependent steps."""
import pytest
import torch

from rlx_triton.backends.torch_ref import lstm
from rlx_triton.devices import profile
from rlx_triton.perf.library import Unmodelled, kernels_of
from rlx_triton.perf.library.rnn import STEP_CHAIN, lstm_algorithm, lstm_kernels
from rlx_triton.perf.roofline import constants, library_estimate
from rlx_triton.router import Request

H200 = profile("h200")
A100 = profile("a100")


def _us(kernels) -> float:
    return library_estimate(kernels, H200)["est_us"]


def test_torch_asks_for_the_persistent_small_h_kernel_up_to_hidden_192():
    assert lstm_algorithm(32, 128, 60, 4, 2, "fp32", H200) == "persist_small_h"
    assert lstm_algorithm(32, 192, 60, 4, 2, "fp32", H200) == "persist_small_h"
    assert lstm_algorithm(32, 256, 60, 4, 2, "fp32", H200) == "standard"
    assert lstm_algorithm(32, 128, 60, 4, 2, "fp32", H200, proj_size=64) == "standard"
    assert lstm_algorithm(32, 128, 60, 4, 2, "fp32", H200, packed=True) == "standard"
    # fp16, one layer, one direction, multiples of 128, batch % 8 == 0 on a large sm_8x/9x part
    assert lstm_algorithm(64, 512, 512, 1, 1, "fp16", A100) == "persist_static"
    assert lstm_algorithm(64, 512, 512, 1, 1, "fp32", A100) == "standard"


def test_pyannotes_lstm_is_four_projection_gemms_and_four_persistent_launches():
    kernels = lstm_kernels(32, 589, 60, 128, 4, 2, "fp32", H200)
    projections = [k for k in kernels if "input projection" in k.name]
    recurrences = [k for k in kernels if "persistent recurrence" in k.name]
    assert len(projections) == len(recurrences) == 4
    assert projections[0].flops >= 2 * 32 * 589 * 60 * 1024 and projections[1].flops >= 2 * 32 * 589 * 256 * 1024
    first = recurrences[0]
    assert first.repeat == 1 and first.flops == 589 * 2 * 32 * 2 * 512 * 128
    assert dict(first.chain) == {kind: n * 589 for kind, n in STEP_CHAIN.items()}
    # 16 CTAs of 8 units per direction, both directions in the one launch
    assert first.ctas == 2 * 16
    assert library_estimate(kernels, H200)["launches"] == 8


def test_the_recurrence_grows_with_the_sequence_as_a_chain_of_steps():
    def recurrence(seq):
        kernels = [k for k in lstm_kernels(32, seq, 60, 128, 1, 2, "fp32", H200) if "recurrence" in k.name]
        return library_estimate(kernels, H200)["kernels"][0]

    short, long = recurrence(100), recurrence(400)
    assert long["chain_us"] == pytest.approx(4 * short["chain_us"])
    per_step = sum(n * constants(H200)[kind] for kind, n in STEP_CHAIN.items()) / 1000
    assert short["chain_us"] == pytest.approx(100 * per_step)
    # each step's latency is at least its exchange: a microsecond-class step, not a launch per step
    assert 100 * per_step < short["est_us"] < 100 * (per_step + H200.launch_us)


def test_the_standard_algorithm_launches_a_gemm_and_a_pointwise_kernel_every_step():
    kernels = lstm_kernels(32, 50, 60, 256, 1, 2, "fp32", H200)
    steps = [k for k in kernels if k.repeat == 50]
    assert {("recurrent GEMM" in k.name) or ("pointwise" in k.name) for k in steps} == {True}
    assert library_estimate(kernels, H200)["launches"] >= 1 + 2 * 50


def test_bidirectional_directions_run_concurrently():
    one = [k for k in lstm_kernels(32, 200, 60, 128, 1, 1, "fp32", H200) if "recurrence" in k.name]
    two = [k for k in lstm_kernels(32, 200, 60, 128, 1, 2, "fp32", H200) if "recurrence" in k.name]
    assert _us(two) == pytest.approx(_us(one), rel=0.05)


def test_the_torch_path_fills_the_zero_state_and_copies_a_batch_first_input():
    request = Request.make("lstm", "lstm", device="cpu", dtype=torch.float32,
                           fields=dict(batch=32, seq=589, input_size=60, hidden=128, layers=4, directions=2, tokens=589),
                           features={"batch_first": True})
    kernels = lstm.library_kernels(request, H200)
    assert [k.name for k in kernels[:3]] == ["h0 zeros", "c0 zeros", "batch_first input to (seq, batch) (contiguous copy)"]
    assert kernels[2].bytes_read == 32 * 589 * 60 * 4
    assert kernels[3:] == lstm_kernels(32, 589, 60, 128, 4, 2, "fp32", H200)


def test_lstm_rows_the_model_does_not_cover_say_why():
    shape = dict(batch=8, seq=10, input=32, hidden=32, layers=1, bidirectional=0)
    with pytest.raises(Unmodelled, match="bf16"):
        kernels_of("lstm", "cudnn", shape, "bf16", H200)
    assert _us(kernels_of("lstm", "torch", shape, "fp32", H200)) > 0
