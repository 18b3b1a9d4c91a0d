"""Degenerate inputs through the Metal launchers, on both CPU stand-ins of the GPU: the NumPy models of
the shaders (tests/metal/shader_models.py) and the shader sources compiled for the CPU
(tests/metal/shader_exec.py). Zeros, constants, one key / frame / step, and NaN or Inf in inputs,
states, masks and weights must give the float64 references' values, with NaN and Inf exactly where
torch puts them (the references state where; tests/reference/*.py check that against torch)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlx_triton.backends.metal import fbank as metal_fbank
from rlx_triton.backends.metal import lstm as metal_lstm
from rlx_triton.backends.metal import sdpa_decode as metal_sdpa
from rlx_triton.backends.metal import segdense as metal_segdense
from rlx_triton.backends.metal.candidates import FP32_MAX_REL_ERR
from rlx_triton.backends.torch_ref.fbank import FbankOptions
from tests.reference.fbank import DEGENERATE_OPTIONS, DEGENERATE_WAVES, check_degenerate_fbank
from tests.reference.lstm import LSTM_DEGENERATE_CASES, check_lstm_degenerate_case
from tests.reference.sdpa_decode import DEGENERATE_CASES, check_degenerate_case
from tests.reference.segdense import SEGDENSE_DEGENERATE_CASES, check_segdense_degenerate_case

ON_BOTH = pytest.mark.parametrize("dispatch", ["emulated_metal", "executed_metal"], ids=["models", "shaders"])
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

ONE_PASS = SimpleNamespace(split_k=1, tg_size=64, partial_reduce=False)
SPLIT_KV = SimpleNamespace(split_k=4, tg_size=64, partial_reduce=True, tile_n=32, tile_k=8, pad_kv=1)


@ON_BOTH
@pytest.mark.parametrize("candidate", [ONE_PASS, SPLIT_KV], ids=["one-pass", "split-kv"])
@pytest.mark.parametrize("case", list(DEGENERATE_CASES))
def test_decode(request, dispatch, case, candidate):
    request.getfixturevalue(dispatch)
    check_degenerate_case(lambda q, k, v, **kw: metal_sdpa.sdpa_decode(q, k, v, candidate=candidate, **kw), case,
                          rtol=FP32_MAX_REL_ERR)


@ON_BOTH
@pytest.mark.parametrize("wave_name", DEGENERATE_WAVES)
@pytest.mark.parametrize("options", sorted(DEGENERATE_OPTIONS))
def test_fbank(request, dispatch, options, wave_name):
    request.getfixturevalue(dispatch)
    check_degenerate_fbank(lambda wave, kwargs: metal_fbank.fbank(wave, FbankOptions(**kwargs)), options, wave_name,
                           tol=1e-4)


@ON_BOTH
@pytest.mark.parametrize("mode", ["persistent", "stepwise"])
@pytest.mark.parametrize("case", list(LSTM_DEGENERATE_CASES))
def test_lstm(request, dispatch, case, mode):
    request.getfixturevalue(dispatch)
    kwargs = dict(has_biases=True, num_layers=2, dropout=0.0, training=False, bidirectional=True, batch_first=True)
    check_lstm_degenerate_case(
        lambda module, x, hx: metal_lstm.lstm(x, hx, list(module._flat_weights),
                                              candidate=SimpleNamespace(mode=mode, tg_size=32), **kwargs),
        case, rtol=FP32_MAX_REL_ERR)


@ON_BOTH
@pytest.mark.parametrize("activation", ["log_softmax", "sigmoid", "none"])
@pytest.mark.parametrize("case", list(SEGDENSE_DEGENERATE_CASES))
def test_segdense(request, dispatch, case, activation):
    request.getfixturevalue(dispatch)
    check_segdense_degenerate_case(
        lambda x, w, b, wc, bc, act: metal_segdense.segdense(x, w, b, wc, bc, activation=act,
                                                             candidate=SimpleNamespace(tg_size=32)),
        case, activation, rtol=FP32_MAX_REL_ERR)
