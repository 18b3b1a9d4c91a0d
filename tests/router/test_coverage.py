"""Coverage statements: complete and declarative; anything they do not name is not covered."""
from rlx_triton.router import Coverage
from rlx_triton.router import coverage as refusals

COV = Coverage(ops=frozenset({"decode"}), devices=frozenset({"cuda", "cpu"}),
               dtypes=frozenset({"float16", "float32"}), ranges={"seq_q": (1, 16), "head_dim": (1, 256)},
               features={"causal": frozenset({False, True}), "mask": frozenset({"none", "bool"}),
                         "finite": frozenset({True})},
               weight_features=frozenset({"finite"}))


def check(op="decode", device="cpu", dtype="float16", fields=None, features=None):
    return COV.check(op, device, dtype, fields or {"seq_q": 1, "head_dim": 64}, features or {"causal": False})


def test_request_inside_every_bound_is_covered():
    assert check() is None


def test_range_bounds_are_inclusive():
    assert check(fields={"seq_q": 16, "head_dim": 256}) is None
    assert check(fields={"seq_q": 17, "head_dim": 64}).field == "seq_q"
    assert check(fields={"seq_q": 0, "head_dim": 64}).field == "seq_q"


def test_unknown_op_dtype_and_device_are_refused_by_kind():
    assert check(op="prefill").kind == refusals.SHAPE_UNIMPLEMENTED
    assert check(dtype="bfloat16").kind == refusals.SHAPE_UNIMPLEMENTED
    assert check(device="mps").kind == refusals.DEVICE_UNSUPPORTED


def test_feature_value_or_name_outside_the_statement_is_refused():
    assert check(features={"mask": "float"}).reason.startswith("mask='float' is not covered (covered: ")
    assert "not implemented" in check(features={"dropout": True}).reason


def test_weight_features_refuse_as_weights_out_of_contract():
    assert check(features={"finite": False}).kind == refusals.WEIGHTS_OUT_OF_CONTRACT


def test_everything_covers_any_request():
    assert Coverage.everything().check("anything", "mps", "float64", {"x": 10**9}, {"y": object()}) is None
