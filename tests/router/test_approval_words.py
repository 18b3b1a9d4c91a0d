"""The accuracy line of a route names the test suite in words: a wheel user has no tests/ folder to open."""
import pytest

from rlx_triton.router.approvals import Approval


@pytest.mark.parametrize("where, expected", [
    ("interpreter, tests/triton/test_fbank.py::test_every_candidate_runs_and_holds_its_approval",
     "interpreter, rlx_triton's fbank tests"),
    ("interpreter, tests/triton/test_lstm.py (1-2 layers, vs float64)", "interpreter, rlx_triton's lstm tests (1-2 layers, vs float64)"),
    ("on Apple GPUs by tests/metal/test_mps.py", "on Apple GPUs by rlx_triton's mps tests"),
])
def test_a_test_file_is_named_in_words(where, expected):
    assert Approval(1e-5, where=where).label() == f"max rel err 1.0e-05 vs float64, {expected}"


def test_every_approval_a_route_can_print_cites_no_test_path():
    from rlx_triton.router import registry

    labels = [approval.label() for backend in registry.backends() for family in backend.families
              for approvals in [getattr(registry.family_module(backend.name, family), "APPROVALS", {})]
              for approval in (approvals.values() if isinstance(approvals, dict) else ())
              if isinstance(approval, Approval)]
    assert labels and not [label for label in labels if "tests/" in label]
