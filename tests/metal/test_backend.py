"""The Metal backend as the router and the installed package see it: registration under the name
"metal", the family modules' routing data and launcher signatures (the same as the torch_ref /
triton modules of each family), the smoke-test gate, and the .metal files shipped in the wheel."""
from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import zipfile

import pytest
import torch

from rlx_triton.backends import metal as metal_backend
from rlx_triton.backends.metal import library
from rlx_triton.router import MissingKernel, Request, clear_route_cache, registry, route, use_backend
from rlx_triton.router.coverage import BACKEND_UNAVAILABLE, Coverage
from rlx_triton.router.device import clear_device_cache

FAMILIES = ("sdpa_decode", "conv", "fbank", "lstm", "segdense")
# families Metal has no shader for: its coverage refuses them by name, so the router sends them elsewhere
REFUSED_FAMILIES = ("varlen_attention",)
# each family's launcher functions, and the module whose signatures they match
LAUNCHERS = {"sdpa_decode": ("torch_ref", ["sdpa_decode", "scaled_dot_product_attention"]), "fbank": ("torch_ref", ["fbank"]),
             "lstm": ("torch_ref", ["lstm"]), "segdense": ("torch_ref", ["segdense"]),
             "conv": ("triton", ["conv1d", "sincnet"])}
needs_no_apple_gpu = pytest.mark.skipif(torch.backends.mps.is_available(),
                                        reason="checks the refusal on machines without an Apple GPU")


def test_backend_registers_as_metal_with_every_family():
    spec = registry.backend("metal")
    assert spec.package == "rlx_triton.backends.metal"
    assert sorted(spec.families) == sorted(FAMILIES + REFUSED_FAMILIES) == sorted(metal_backend.FAMILIES)
    assert sorted(metal_backend.SHADER_FAMILIES) == sorted(FAMILIES)
    assert not spec.is_library


@pytest.mark.parametrize("family", FAMILIES)
def test_family_module_declares_routing_data_for_mps_only(family):
    module = importlib.import_module(f"rlx_triton.backends.metal.{family}")
    assert isinstance(module.COVERAGE, Coverage) and module.COVERAGE.devices == frozenset({"mps"})
    assert module.COVERAGE.dtypes == frozenset({"float32", "float16", "bfloat16"})
    assert isinstance(module.RECIPES, dict) and isinstance(module.SPEED_EVIDENCE, dict)
    assert module.APPROVALS, "every plan candidate computes in fp32 and is approved at the fp32 bound"
    candidate_module = importlib.import_module(f"rlx_triton.planner.candidates.{family}")
    candidate_types = [value for value in vars(candidate_module).values()
                       if isinstance(value, type) and value.__module__ == candidate_module.__name__
                       and hasattr(value, "from_tag")]
    for tag in module.APPROVALS:
        assert any(kind.from_tag(tag) is not None for kind in candidate_types), tag


@pytest.mark.parametrize("family", FAMILIES)
def test_launchers_have_the_signatures_of_the_family(family):
    backend, names = LAUNCHERS[family]
    if backend == "triton":
        pytest.importorskip("triton")
    metal_module = importlib.import_module(f"rlx_triton.backends.metal.{family}")
    other = importlib.import_module(f"rlx_triton.backends.{backend}.{family}")
    for name in names:
        ours = inspect.signature(getattr(metal_module, name)).parameters
        theirs = inspect.signature(getattr(other, name)).parameters
        assert [(p.name, p.kind) for p in ours.values()] == [(p.name, p.kind) for p in theirs.values()], name


@needs_no_apple_gpu
def test_smoke_test_gate_names_why_metal_cannot_run_here():
    assert "is_available" in library.smoke_test()
    assert metal_backend.probe(type("Facts", (), {"kind": "cpu"})()) == "Metal shaders run on MPS devices, not cpu"


@needs_no_apple_gpu
def test_route_on_an_mps_request_skips_metal_with_the_smoke_test_reason():
    clear_route_cache()
    clear_device_cache()
    request = Request.make("segdense", "segdense", device=torch.device("mps"), dtype=torch.float32,
                           fields={"rows": 10, "in_features": 60, "hidden": 128, "classes": 7, "tokens": 10},
                           features={"activation": "log_softmax", "linear_layers": 2, "requires_grad": False})
    chosen = route(request)
    assert chosen.backend == "torch"
    refusal = chosen.skipped_reasons["metal"]
    assert refusal.kind == BACKEND_UNAVAILABLE and "is_available" in refusal.reason
    with use_backend("metal", strict=True), pytest.raises(MissingKernel):
        route(request)


def test_dispatch_checks_argument_kinds_before_any_launch():
    signature = ("x:T", "out:float32", "n:long", "scale:float")
    x, out = torch.zeros(4), torch.zeros(4)
    assert library.ordered_arguments(signature, torch.float32, dict(scale=0.5, n=4, out=out, x=x)) == [x, out, 4, 0.5]
    with pytest.raises(TypeError, match="n is a long scalar"):
        library.ordered_arguments(signature, torch.float32, dict(x=x, out=out, n=4.0, scale=0.5))
    with pytest.raises(TypeError, match="scale is a float scalar"):
        library.ordered_arguments(signature, torch.float32, dict(x=x, out=out, n=4, scale=1))
    with pytest.raises(TypeError, match="x must be torch.float16"):
        library.ordered_arguments(signature, torch.float16, dict(x=x, out=out, n=4, scale=0.5))
    with pytest.raises(ValueError, match="contiguous"):
        library.ordered_arguments(signature, torch.float32,
                                  dict(x=torch.zeros(4, 2).t(), out=out, n=4, scale=0.5))
    with pytest.raises(TypeError, match="missing"):
        library.ordered_arguments(signature, torch.float32, dict(x=x, out=out, n=4))


def test_group_sizes_are_simd_multiples_within_the_limit():
    assert library.group_size_for(100) == 96
    assert library.group_size_for(1) == 32
    assert library.group_size_for(4096) == 1024
    assert library.group_size_for(256, largest=128) == 128
    assert library.groups_for(1000, 128) == 8


@pytest.mark.parametrize("family", FAMILIES)
def test_shader_sources_are_found_through_importlib_resources(family):
    assert library.shader_path(family).is_file()
    assert "kernel void" in library.shader_source(family)


def test_wheel_ships_the_shaders_and_an_installed_package_finds_them(built_wheel, tmp_path):
    """The wheel (built once per run), unpacked into a plain folder (what installing a pure wheel does):
    the shaders are read from there through importlib.resources."""
    wheel = built_wheel
    names = zipfile.ZipFile(wheel).namelist()
    for family in FAMILIES:
        assert f"rlx_triton/metal/{family}.metal" in names
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    probe = ("import rlx_triton.backends.metal.library as l; "
             "print(l.shader_path('sdpa_decode')); assert 'kernel void' in l.shader_source('sdpa_decode')")
    result = subprocess.run([sys.executable, "-c", probe], env={"PYTHONPATH": str(target), "PATH": "/usr/bin"},
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(str(target))


def _public_requests():
    """Requests the public ops build for typical pyannote / decode calls (on CPU tensors)."""
    from rlx_triton.ops import conv as conv_op
    from rlx_triton.ops import fbank as fbank_op
    from rlx_triton.ops import lstm as lstm_op
    from rlx_triton.ops import sdpa_decode as sdpa_op
    from rlx_triton.ops import segdense as segdense_op

    q, k, v = torch.randn(2, 8, 1, 64), torch.randn(2, 2, 100, 64), torch.randn(2, 2, 100, 64)
    module = torch.nn.LSTM(60, 128, num_layers=2, bidirectional=True, batch_first=True)
    norm = [torch.ones(80), torch.ones(60), torch.ones(60)]
    yield sdpa_op.scaled_dot_product_attention.__rlx_request__(q, k, v, enable_gqa=True)
    yield sdpa_op.sdpa_decode.__rlx_request__(q, k, v, torch.tensor([10, 100]))
    yield fbank_op.fbank.__rlx_request__(torch.randn(16000), num_mel_bins=80, window_type="hamming")
    yield conv_op.conv1d.__rlx_request__(torch.randn(2, 80, 500), torch.randn(60, 80, 5), torch.randn(60),
                                         epilogue=conv_op.ConvEpilogue(pool=3))
    yield conv_op.sincnet.__rlx_request__(torch.randn(2, 1, 16000), torch.randn(80, 1, 251), torch.ones(1),
                                          torch.zeros(1), [torch.randn(60, 80, 5), torch.randn(60, 60, 5)],
                                          [torch.zeros(60), torch.zeros(60)], norm, [torch.zeros_like(n) for n in norm])
    with torch.no_grad():
        yield lstm_op.lstm.__rlx_request__(torch.randn(4, 50, 60), None, list(module._flat_weights), num_layers=2,
                                           bidirectional=True, batch_first=True)
    yield segdense_op.segdense.__rlx_request__(torch.randn(4, 589, 256), [torch.randn(128, 256), torch.randn(128, 128)],
                                               [torch.zeros(128), torch.zeros(128)], torch.randn(7, 128),
                                               torch.zeros(7))


def test_metal_coverage_takes_the_requests_the_public_ops_build_on_mps():
    """Complete, declarative coverage: every feature the ops send is named, so MPS calls reach Metal."""
    for request in _public_requests():
        module = importlib.import_module(f"rlx_triton.backends.metal.{request.family}")
        refusal = module.COVERAGE.check(request.op, "mps", request.dtype, request.field_map, request.feature_map)
        assert refusal is None, f"{request.op}: {refusal}"


def test_metal_coverage_refuses_ragged_attention_with_a_typed_refusal():
    from rlx_triton.backends.metal import varlen_attention as metal
    from rlx_triton.ops import varlen_attention as varlen_op

    q, k = torch.randn(5, 4, 16), torch.randn(9, 2, 16)
    offsets = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 4, 9], dtype=torch.int32)
    for request in (varlen_op.flash_attn_varlen_func.__rlx_request__(q, k, k, *offsets, 3, 5, causal=True),
                    varlen_op.flash_attn_func.__rlx_request__(q[None], k[None], k[None])):
        refusal = metal.COVERAGE.check(request.op, "mps", request.dtype, request.field_map, request.feature_map)
        assert refusal is not None and refusal.kind == "shape-unimplemented" and request.op in refusal.reason


def _decode_option_requests():
    """(feature, request) of decode calls with each option the Metal shaders do not implement."""
    from rlx_triton.ops import flash_attn as flash_op
    from rlx_triton.ops import sdpa_decode as sdpa_op

    q, k = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 20, 16)
    yield "paged", sdpa_op.sdpa_decode.__rlx_request__(q, torch.randn(5, 2, 4, 16), torch.randn(5, 2, 4, 16),
                                                       block_table=torch.zeros(2, 5, dtype=torch.int32))
    yield "window", sdpa_op.sdpa_decode.__rlx_request__(q, k, k, window_size=(4, 0))
    yield "softcap", sdpa_op.sdpa_decode.__rlx_request__(q, k, k, softcap=5.0)
    yield "alibi", sdpa_op.sdpa_decode.__rlx_request__(q, k, k, alibi_slopes=torch.ones(4))
    fq, fk = torch.randn(2, 1, 4, 16), torch.randn(3, 20, 2, 16)
    lengths = torch.tensor([3, 7], dtype=torch.int32)
    yield "cache_batch_idx", flash_op.flash_attn_with_kvcache.__rlx_request__(
        fq, fk, fk, cache_seqlens=lengths, cache_batch_idx=torch.tensor([2, 0], dtype=torch.int32))
    yield "cache_leftpad", flash_op.flash_attn_with_kvcache.__rlx_request__(
        fq, fk[:2], fk[:2], cache_seqlens=lengths, cache_leftpad=torch.tensor([1, 0], dtype=torch.int32))


@pytest.mark.parametrize("feature, request_", list(_decode_option_requests()), ids=lambda x: x if isinstance(x, str) else "")
def test_metal_coverage_refuses_the_decode_options_its_shaders_lack_by_name(feature, request_):
    from rlx_triton.backends.metal import sdpa_decode as metal

    assert feature in metal.UNSUPPORTED_FEATURES and request_.feature_map.get(feature) not in (None, False)
    without = {name: value for name, value in request_.feature_map.items() if name != feature}
    if request_.op == "sdpa_decode":   # the same call without the option is Metal's
        assert metal.COVERAGE.check(request_.op, "mps", request_.dtype, request_.field_map, without) is None
    refusal = metal.COVERAGE.check("sdpa_decode", "mps", request_.dtype, request_.field_map, request_.feature_map)
    assert refusal is not None and refusal.kind == "shape-unimplemented" and feature in refusal.reason


@pytest.mark.parametrize("option", [{"softcap": 5.0}, {"window": (4, 0)}, {"alibi_slopes": torch.ones(4)},
                                    {"tree_mask": torch.ones(1, 1, dtype=torch.bool)}],
                         ids=["softcap", "window", "alibi", "tree"])
def test_the_metal_launcher_refuses_an_option_it_is_handed_before_any_dispatch(option):
    from rlx_triton.backends.metal import sdpa_decode as metal

    q, k = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 20, 16)
    with pytest.raises(metal.UnsupportedFeature, match=next(iter(option)).split("_")[0]) as raised:
        metal.sdpa_decode(q, k, k, causal="bottom_right", **option)
    assert raised.value.kind == "shape-unimplemented"
