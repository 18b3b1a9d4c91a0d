"""Device profiles: a complete, sourced table, and the DeviceFacts a device of each profile gives the router."""
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from rlx_triton import devices
from rlx_triton.devices import CUDA_FIELDS, PROFILES, UNITS, profile, profile_for_name
from rlx_triton.router import device as device_module
from rlx_triton.ops import conv2d as conv2d_ops
from rlx_triton.router.device import DeviceFacts, profile_facts, routing_as

CUDA = [p for p in PROFILES.values() if p.kind == "cuda"]
APPLE = [p for p in PROFILES.values() if p.kind == "mps"]


def test_the_table_names_the_agreed_gpus():
    assert {"h100-sxm", "h200", "a100-80gb", "l40s", "rtx-4090"} <= set(PROFILES)
    assert len(APPLE) >= 4 and all(p.name.startswith("Apple M") for p in APPLE)


@pytest.mark.parametrize("gpu", CUDA, ids=lambda p: p.key)
def test_every_cuda_profile_is_complete_and_sourced(gpu):
    for name in CUDA_FIELDS:
        assert getattr(gpu, name) is not None, name
        assert gpu.sources.get(name), f"{gpu.key}.{name} has no source"
    # fp8 tensor cores only where the GPU has them (Hopper, the L40S): an A100 has none, the datasheets of the
    # RTX 4090 state no dense fp8 rate with fp32 accumulation
    assert set(gpu.peak) == set(UNITS) - ({"fp8_mma"} if gpu.key in ("a100-80gb", "rtx-4090") else set())
    for unit in gpu.peak:
        assert gpu.peak[unit] > 0 and gpu.sources.get(f"peak.{unit}"), unit
    assert gpu.peak["tf32x3"] == pytest.approx(gpu.peak["tf32"] / 3)
    assert gpu.peak["tf32x4"] == pytest.approx(gpu.peak["tf32"] / 4)
    assert gpu.arch in {"sm_80", "sm_89", "sm_90"} and gpu.arch_number == int(gpu.arch[3:])
    assert gpu.shared_per_cta <= gpu.shared_per_sm and gpu.names


@pytest.mark.parametrize("gpu", APPLE, ids=lambda p: p.key)
def test_every_apple_profile_states_its_sourced_figures(gpu):
    for name in ("sm_count", "memory_bytes", "bandwidth", "launch_us", "threadgroup_memory"):
        assert getattr(gpu, name) and gpu.sources.get(name), name
    assert gpu.peak["fp32_fma"] > 0 and gpu.sources["peak.fp32_fma"] and gpu.arch is None


@pytest.mark.parametrize("gpu", [p for p in PROFILES.values() if p.kind == "cuda"], ids=lambda p: p.key)
def test_every_cuda_profile_states_sourced_achievable_bandwidth_clock_and_latency_ranges(gpu):
    from rlx_triton.devices import LATENCY_KEYS

    assert 0 < gpu.achievable_bw <= gpu.bandwidth and gpu.sources["achievable_bandwidth"]
    lanes = 64 if gpu.capability == (8, 0) else 128   # the FP32 peak is SMs x lanes x 2 FLOPs x clock
    assert gpu.clock_hz == pytest.approx(gpu.peak["fp32_fma"] / (gpu.sm_count * lanes * 2))
    assert gpu.schedulers_per_sm == 4 and not gpu.calibrated
    for key in LATENCY_KEYS:
        low, nominal, high = gpu.latency[key]
        assert 0 < low <= nominal <= high and gpu.sources[f"latency.{key}"], key


def test_the_h200s_achievable_bandwidth_is_the_measured_copy():
    h200 = profile("h200")
    assert h200.achievable_bw == 4.3e12 and "measured" in h200.sources["achievable_bandwidth"]
    assert "assumption" in profile("a100").sources["achievable_bandwidth"]   # others: the H200's ratio, said so


def test_the_h200_figures():
    h200 = profile("H200")
    assert (h200.sm_count, h200.capability, h200.bandwidth, h200.shared_per_sm) == (132, (9, 0), 4.8e12, 233472)
    assert (h200.max_ctas_per_sm, h200.max_warps_per_sm, h200.registers_per_sm) == (32, 64, 65536)


def test_an_unknown_device_names_the_choices():
    with pytest.raises(ValueError, match="h200"):
        profile("h300")


@pytest.mark.parametrize("name, key", [("H200", "h200"), ("h100", "h100-sxm"), ("a100", "a100-80gb"),
                                       ("rtx4090", "rtx-4090"), ("m1", "m1"), ("M2_Max", "m2-max")])
def test_a_key_or_a_unique_prefix_names_a_profile(name, key):
    assert profile(name).key == key


def test_an_ambiguous_prefix_names_the_profiles_it_fits():
    with pytest.raises(ValueError, match="ambiguous: h100-sxm, h200"):
        profile("h")


def test_device_names_match_the_longest_profile_name():
    assert profile_for_name("NVIDIA H200").key == "h200"
    assert profile_for_name("NVIDIA H100 80GB HBM3").key == "h100-sxm"
    assert profile_for_name("Apple M1 Pro").key == "m1-pro" and profile_for_name("Apple M1").key == "m1"
    assert profile_for_name("cpu") is None


def test_the_table_imports_without_torch():
    code = "import sys, rlx_triton.devices as d; assert d.PROFILES and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def _real_cuda_facts(gpu, monkeypatch) -> DeviceFacts:
    """What device_facts reads from a CUDA device with this profile's properties."""
    props = SimpleNamespace(name=gpu.name, major=gpu.capability[0], minor=gpu.capability[1],
                            multi_processor_count=gpu.sm_count, total_memory=gpu.memory_bytes)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    return device_module._with_verdicts(device_module._hardware("cuda", 0))


@pytest.mark.parametrize("gpu", CUDA, ids=lambda p: p.key)
def test_profile_facts_are_what_such_a_device_reports(gpu, monkeypatch):
    facts = profile_facts(gpu)
    real = _real_cuda_facts(gpu, monkeypatch)
    assert (facts.kind, facts.capability, facts.sm_count, facts.memory_bytes, facts.device_class) == \
        (real.kind, real.capability, real.sm_count, real.memory_bytes, real.device_class)
    assert facts.device_class == {(9, 0): "sm90", (8, 0): "sm80"}.get(gpu.capability, "cuda")
    prefix, digest = facts.fingerprint.split("-")
    assert prefix == real.fingerprint.split("-")[0] == "cuda" and len(digest) == 12
    assert facts.backend_reasons == real.backend_reasons
    assert facts.triton_ok and not facts.metal_ok


def _decode_inputs(device):
    q = torch.empty(4, 32, 1, 128, device=device, dtype=torch.float16)
    k = torch.empty(4, 8, 4096, 128, device=device, dtype=torch.float16)
    return q, k, k


def _conv_inputs(device):
    x = torch.empty(2, 32, 20, 30, device=device)
    return x, torch.empty(64, 32, 3, 3, device=device)


@pytest.mark.parametrize("gpu", CUDA, ids=lambda p: p.key)
def test_routing_as_a_profile_routes_like_a_real_device_of_its_class(gpu, monkeypatch):
    import rlx_triton as rt

    real = _real_cuda_facts(gpu, monkeypatch)
    routes = {}
    for name, facts in (("profile", profile_facts(gpu)), ("real", real)):
        with routing_as(facts):
            q, k, v = _decode_inputs("meta")
            decode = rt.explain(rt.scaled_dot_product_attention, q, k, v, enable_gqa=True)
            x, w = _conv_inputs("meta")
            conv = rt.explain(conv2d_ops.conv2d, x, w, None, stride=1, padding=1)
        routes[name] = [(r.backend, r.candidate_tag, r.evidence, r.evidence_detail) for r in (decode, conv)]
    assert routes["profile"] == routes["real"]
    assert routes["profile"][0][0] == "triton"


def test_routing_as_an_apple_profile_reaches_the_metal_backend():
    import rlx_triton as rt

    with routing_as(profile("m2-max")) as facts:
        q, k, v = _decode_inputs("meta")
        route = rt.explain(rt.scaled_dot_product_attention, q, k, v, enable_gqa=True)
    assert facts.kind == "mps" and facts.device_class == "mps" and facts.metal_ok and not facts.triton_ok
    assert route.backend == "metal"


def test_routing_as_ends_with_the_block():
    import rlx_triton as rt

    q, k, v = _decode_inputs("meta")
    with routing_as(profile("h200")):
        assert rt.explain(rt.scaled_dot_product_attention, q, k, v, enable_gqa=True).backend == "triton"
    # outside the block a meta tensor is on no device a kernel runs on
    assert rt.explain(rt.scaled_dot_product_attention, q, k, v, enable_gqa=True).backend == "torch"
    assert devices.profile("h200").matches("NVIDIA H200 NVL") is True
