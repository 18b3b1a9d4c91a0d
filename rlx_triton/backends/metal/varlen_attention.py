"""Metal and the ragged attention family: no shader implements it, and the coverage says so.

COVERAGE names no op, so the router refuses every ragged attention request for Metal with a typed
refusal (shape-unimplemented, "op ... is not implemented") that `explain` shows, and sends the call to
the next backend (the torch path on an Apple GPU); strict mode raises MissingKernel naming it.
"""
from __future__ import annotations

from rlx_triton.router.coverage import Coverage

COVERAGE = Coverage(ops=frozenset(), devices=frozenset({"mps"}),
                    dtypes=frozenset({"float32", "float16", "bfloat16"}))
APPROVALS: dict = {}
RECIPES: dict = {}
SPEED_EVIDENCE: dict = {}
