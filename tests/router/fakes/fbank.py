"""A fake backend family module for router tests: plain data the tests rewrite with monkeypatch."""
from rlx_triton.router import Coverage

COVERAGE = Coverage(ops=frozenset({"fbank"}), devices=frozenset({"cpu"}), dtypes=frozenset({"float32"}),
                    ranges={"bins": (1, 128)}, features={"snip_edges": frozenset({True})},
                    weight_features=frozenset())
APPROVALS = {}
RECIPES = {}
SPEED_EVIDENCE = {}


def fbank(*args, candidate=None, **kwargs):
    return ("fake", candidate)
