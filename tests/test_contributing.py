"""CONTRIBUTING.md's walk-through, followed for a toy elementwise family `scale` (y = alpha * x).

The family's pieces are written as a temporary package `rlx_toy_scale`, the way the guide lays them out:
the planner candidate (`candidates.py` for `planner/candidates/scale.py`), the Triton family package
(`scale/` for `backends/triton/scale/`: kernels.py, launch.py, routing.py, __init__.py), the torch_ref
fallback (`torch_ref.py` for `backends/torch_ref/scale.py`) and the op (`op.py` for `ops/scale.py`). The test registers them with the
planner and the router, routes calls under TRITON_INTERPRET=1, and unregisters everything afterwards.
"""
import importlib
import sys
import textwrap

import pytest
import torch

import rlx_triton as rt
from rlx_triton.config import override_settings
from rlx_triton.planner.candidates import FAMILIES, register_family, unregister_family
from rlx_triton.router import BackendSpec, plans, register_backend
from rlx_triton.router.registry import unregister_backend

PACKAGE = "rlx_toy_scale"

FILES = {
    "__init__.py": '"""A toy kernel family, laid out as CONTRIBUTING.md says."""\n',
    # planner/candidates/scale.py: the candidate type, its variants and the family's planning rules
    "candidates.py": '''
        """Candidates of the toy `scale` family: one program scales BLOCK elements."""
        import enum

        from rlx_triton.planner.candidates import base


        class ToyFamily(enum.Enum):
            SCALE = "scale"

            @property
            def debug_name(self):
                return "Scale"


        @base.candidate_dataclass
        class ScaleCandidate(base.Candidate):
            block: int = base.int_field("bl")
            tg_size: int = base.int_field("tg")
            stages: int = base.int_field("ns")
            precision: str = base.choice_field("ieee")


        ScaleVariant = base.define_variants(
            ScaleCandidate,
            (("B64", ScaleCandidate(64, 128, 1, "ieee")), ("B128", ScaleCandidate(128, 128, 1, "ieee"))),
            fp32="B64", default="B64",
        )
        FP32_VARIANT = ScaleVariant.FP32
        DEFAULT_VARIANT = ScaleVariant.DEFAULT

        SPEC = base.FamilySpec.diarization(
            ToyFamily.SCALE, ScaleVariant, base.diarization_launch_fields("numel"),
            base.tiled_rules({"block": (16, 1024)}, lambda c: 0, base.pipelined, base.PIPELINE_NEEDS_SHARED),
            tile_fields=("block",),
        )
    ''',
    "scale/__init__.py": '''
        """The toy family's Triton package: re-exports the names router/protocol.py reads."""
        from rlx_triton.backends.triton import launches

        from .launch import launch_count, scale_plan
        from .routing import APPROVALS, COVERAGE, RECIPES, SPEED_EVIDENCE


        def scale(x, alpha, *, candidate, route=None):
            plan, out = scale_plan(x, alpha, candidate=candidate)
            launches.run(plan)
            return out
    ''',
    "scale/kernels.py": '''
        """@triton.jit code of the toy family only."""
        import triton
        import triton.language as tl


        @triton.jit
        def scale_kernel(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
            offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            in_bounds = offsets < n
            x = tl.load(x_ptr + offsets, mask=in_bounds, other=0.0).to(tl.float32)
            tl.store(out_ptr + offsets, (x * alpha).to(out_ptr.dtype.element_ty), mask=in_bounds)
    ''',
    "scale/launch.py": '''
        """The toy family's launch record, with its byte and FLOP model."""
        import torch

        from rlx_triton.backends.triton.launches import Launch

        from .kernels import scale_kernel


        def scale_plan(x, alpha, *, candidate):
            flat = x.contiguous().view(-1)
            out = torch.empty_like(flat)
            n = flat.numel()
            record = Launch(scale_kernel, (-(-n // candidate.block),), (flat, out, n, float(alpha)),
                            meta={"BLOCK": candidate.block}, num_warps=candidate.tg_size // 32, num_stages=1,
                            bytes_read=n * x.element_size(), bytes_written=n * x.element_size(), flops=n)
            return [record], out.view(x.shape)


        def launch_count(request, candidate):
            return 1
    ''',
    "scale/routing.py": '''
        """Coverage, accuracy approvals and recipes of the toy family, as data."""
        from rlx_triton.router.approvals import Approval
        from rlx_triton.router.coverage import Coverage

        from ..candidates import ScaleVariant

        COVERAGE = Coverage(ops=frozenset({"scale"}), devices=frozenset({"cuda", "cpu"}),
                            dtypes=frozenset({"float32", "float16"}), ranges={"numel": (1, 2**31 - 1)})
        APPROVALS = {variant.tag(): Approval(max_rel_err=1e-6, where="interpreter, tests/test_contributing.py")
                     for variant in ScaleVariant.ALL}
        RECIPES = {"cuda": ScaleVariant.B128.tag()}
        SPEED_EVIDENCE = {}
    ''',
    # backends/torch_ref/scale.py: the library fallback, which takes whatever torch takes
    "torch_ref.py": '''
        """The toy family's library fallback."""
        from rlx_triton.router.coverage import Coverage

        COVERAGE = Coverage.everything()


        def scale(x, alpha, *, candidate=None, route=None):
            return x * alpha
    ''',
    # ops/scale.py: the public op, its request (validated before any launch) and its route
    "op.py": '''
        """The toy family's public op."""
        import torch

        from rlx_triton.router import Request, routed_op
        from rlx_triton.router.route import routed_call


        def _scale_request(x, alpha):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
            if not isinstance(alpha, (int, float)):
                raise TypeError(f"alpha must be a number, got {type(alpha).__name__}")
            return Request.make("scale", op="scale", tensor=x, fields={"numel": max(x.numel(), 1),
                                                                      "tokens": max(x.numel(), 1)})


        @routed_op(_scale_request)
        def scale(x, alpha):
            route = routed_call(None, lambda: _scale_request(x, alpha))
            return route.module.scale(x, alpha, candidate=route.candidate)
    ''',
}


@pytest.fixture
def toy_family(tmp_path, monkeypatch):
    """Writes the toy package, registers its planner family, its Triton backend and its torch_ref module,
    and removes all of it afterwards."""
    for name, text in FILES.items():
        path = tmp_path / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    monkeypatch.syspath_prepend(str(tmp_path))
    candidates = importlib.import_module(f"{PACKAGE}.candidates")
    library = importlib.import_module(f"{PACKAGE}.torch_ref")
    # the library backend finds family modules at rlx_triton.backends.torch_ref.<family>
    monkeypatch.setitem(sys.modules, "rlx_triton.backends.torch_ref.scale", library)
    register_family(candidates.SPEC)
    spec = BackendSpec(name="toy_triton", precedence=-1, package=PACKAGE, families=("scale",),
                       module_attributes=("launch_count",),
                       probe=lambda facts: None if facts.kind == "cpu" else "the toy runs on CPU tensors only")
    register_backend(spec)
    plans.reset()
    try:
        with override_settings(backend="auto", strict=False, tune_cache_load=False, tune_cache_persist=False):
            yield importlib.import_module(f"{PACKAGE}.op")
    finally:
        unregister_backend("toy_triton")
        unregister_family("scale")
        plans.reset()
        for module in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[module]


@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-6), (torch.float16, 1e-3)])
@pytest.mark.parametrize("numel", [1, 77, 300])
def test_a_call_routes_to_the_new_family_kernel_and_matches_float64(toy_family, dtype, numel, rtol):
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel)).to(dtype)
    with rt.use_backend("auto", strict=True):
        got = toy_family.scale(x, 1.5)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), x.double() * 1.5, rtol=rtol, atol=rtol)


def test_explain_names_the_new_family_its_backend_and_candidate(toy_family):
    route = rt.explain(toy_family.scale, torch.ones(10), 2.0)
    assert (route.backend, route.family, route.op) == ("toy_triton", "scale", "scale")
    assert route.candidate_tag == sys.modules[f"{PACKAGE}.candidates"].DEFAULT_VARIANT.tag()
    assert route.kernel_name.startswith("scale_numel10_")


def test_the_library_op_takes_what_the_kernel_does_not_cover(toy_family):
    x = torch.arange(6, dtype=torch.float64)
    route = rt.explain(toy_family.scale, x, 3.0)
    assert route.backend == "torch" and "toy_triton" in dict(route.skipped)
    torch.testing.assert_close(toy_family.scale(x, 3.0), x * 3.0)


def test_bad_input_is_refused_naming_the_argument(toy_family):
    with pytest.raises(TypeError, match="alpha"):
        toy_family.scale(torch.ones(3), "2")


def test_after_the_toy_family_the_planner_and_router_know_only_the_built_in_families():
    # runs after the tests above (file order): their fixture's teardown left nothing registered
    from rlx_triton.router import registry

    assert all(family.value != "scale" for family in FAMILIES)
    assert "toy_triton" not in {spec.name for spec in registry.backends()}
