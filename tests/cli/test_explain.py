"""`rlx-triton explain`'s op specs: from the fields a user gives, the request the op itself builds.

Each case is a real call of a public op on small CPU tensors and the --field/--feature arguments a user
would write for it; the spec must fill in the rest exactly as the op's own request builder does.
"""
import pytest
import torch

from rlx_triton import cli_explain
from rlx_triton.ops import conv, conv2d, fbank, lstm, sdpa_decode, segdense
from rlx_triton.planner.candidates import FAMILIES


def _sdpa_tensors(seq_q=1):
    return torch.randn(2, 8, seq_q, 64), torch.randn(2, 2, 100, 64), torch.randn(2, 2, 100, 64)


def _lstm_call():
    module = torch.nn.LSTM(60, 128, num_layers=2, bidirectional=True, batch_first=True)
    with torch.no_grad():
        return lstm.lstm.__rlx_request__(torch.randn(4, 50, 60), None, list(module._flat_weights), num_layers=2,
                                         bidirectional=True, batch_first=True)


def _sincnet_call():
    norm = [torch.ones(80), torch.ones(60), torch.ones(60)]
    return conv.sincnet.__rlx_request__(
        torch.randn(2, 1, 16000), torch.randn(80, 1, 251), torch.ones(1), torch.zeros(1),
        [torch.randn(60, 80, 5), torch.randn(60, 60, 5)], [torch.zeros(60), torch.zeros(60)], norm,
        [torch.zeros_like(n) for n in norm])


ATTENTION = ["batch=2", "num_heads=8", "head_dim=64", "seq_kv=100", "num_kv_heads=2"]

CASES = {
    "sdpa_decode": (lambda: sdpa_decode.sdpa_decode.__rlx_request__(*_sdpa_tensors(), torch.tensor([10, 100])),
                    ATTENTION, []),
    "sdpa_gqa": (lambda: sdpa_decode.scaled_dot_product_attention.__rlx_request__(*_sdpa_tensors(), enable_gqa=True),
                 ATTENTION, []),
    "sdpa_causal_3_tokens": (
        lambda: sdpa_decode.scaled_dot_product_attention.__rlx_request__(*_sdpa_tensors(3), is_causal=True,
                                                                          enable_gqa=True),
        ATTENTION + ["seq_q=3"], ["causal=top_left"]),
    "fbank_wespeaker": (lambda: fbank.fbank.__rlx_request__(torch.randn(2, 4007), num_mel_bins=80,
                                                            window_type="hamming"),
                        ["batch=2", "samples=4007", "bins=80"], ["window_type=hamming"]),
    "fbank_no_snip": (lambda: fbank.fbank.__rlx_request__(torch.randn(1, 1207), snip_edges=False),
                      ["batch=1", "samples=1207"], ["snip_edges=false"]),
    "conv1d_pooled": (lambda: conv.conv1d.__rlx_request__(torch.randn(2, 80, 500), torch.randn(60, 80, 5),
                                                          torch.randn(60), epilogue=conv.ConvEpilogue(pool=3)),
                      ["batch=2", "c_in=80", "c_out=60", "length=500", "taps=5"], ["pool=3"]),
    "conv2d_3x3": (lambda: conv2d.conv2d.__rlx_request__(torch.randn(2, 32, 10, 20), torch.randn(32, 32, 3, 3),
                                                         padding=1, relu=True),
                   ["batch=2", "c_in=32", "c_out=32", "length=200"], ["relu=true"]),
    "conv2d_strided": (lambda: conv2d.conv2d.__rlx_request__(torch.randn(2, 16, 10, 20), torch.randn(32, 16, 3, 3),
                                                             stride=2, padding=1),
                       ["batch=2", "c_in=16", "c_out=32", "length=200", "stride=2"], []),
    "stats_pool": (lambda: conv2d.stats_pool.__rlx_request__(torch.randn(2, 64, 50)),
                   ["batch=2", "c_in=64", "length=50"], []),
    "sincnet": (_sincnet_call, ["batch=2", "length=16000"], []),
    "lstm_bidirectional": (_lstm_call, ["batch=4", "seq=50", "input_size=60", "hidden=128", "layers=2",
                                        "directions=2"], ["batch_first=true"]),
    "segdense_pyannote": (lambda: segdense.segdense.__rlx_request__(
        torch.randn(4, 589, 256), [torch.randn(128, 256), torch.randn(128, 128)], [torch.zeros(128), torch.zeros(128)],
        torch.randn(7, 128), torch.zeros(7)), ["rows=2356", "in_features=256", "hidden=128", "classes=7"], []),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_spec_fills_in_the_request_the_op_builds(name):
    call, field_args, feature_args = CASES[name]
    request = call()
    spec = cli_explain.op_spec(request.family, request.op)
    fields, features, _filled = cli_explain.resolve(spec, field_args, feature_args)
    assert fields == request.field_map
    assert features == request.feature_map


@pytest.mark.parametrize("family", sorted(cli_explain.FAMILY_OPS))
def test_every_spec_names_exactly_its_familys_launch_fields(family):
    from rlx_triton.planner.policy import KernelFamily

    launch_fields = {f.name for f in FAMILIES[KernelFamily(family)].launch_fields}
    for spec in cli_explain.FAMILY_OPS[family]:
        assert set(spec.field_names) <= launch_fields
        assert {f.name for f in FAMILIES[KernelFamily(family)].launch_fields if f.required} <= set(spec.field_names)
        assert len(set(spec.field_names)) == len(spec.field_names)


def test_filled_fields_say_why():
    spec = cli_explain.op_spec("sdpa_decode", None)
    fields, _, filled = cli_explain.resolve(spec, ["batch=1", "num_heads=32", "num_kv_heads=8", "head_dim=128",
                                                   "seq_kv=4096"], [])
    assert fields["m"] == 4 and fields["tokens"] == 1 and fields["seq_q"] == 1
    assert [name for name, _, _ in filled] == ["seq_q", "head_dim_v", "m", "tokens"]
    assert all(why for _, _, why in filled)


def test_given_fields_are_not_filled_in():
    spec = cli_explain.op_spec("fbank", None)
    fields, _, filled = cli_explain.resolve(spec, ["batch=1", "samples=16000", "frames=98", "window=512", "bins=80",
                                                   "tokens=98"], [])
    assert fields["frames"] == 98 and filled == []


@pytest.mark.parametrize("args, message", [
    ((["batch=1", "samples=16000", "nope=3"], []), "has no field nope; its fields are batch, samples"),
    ((["batch=1"], []), "needs --field samples=N"),
    ((["batch=1", "samples=x"], []), "--field samples must be an integer"),
    ((["batch=0", "samples=16000"], []), "--field batch=0 is outside [1, "),
    ((["batch=1", "samples=16000"], ["colour=red"]), "has no feature colour; its features are window_type"),
    ((["batch=1", "samples=16000"], ["window_type=square"]), "window_type must be one of hamming"),
    ((["batch=1", "samples=16000"], ["snip_edges=maybe"]), "snip_edges must be true or false"),
    ((["batch=1", "samples=16000"], ["snip_edges"]), "--feature expects name=value"),
])
def test_bad_fields_and_features_are_usage_errors_that_list_what_is_valid(args, message):
    with pytest.raises(cli_explain.UsageError) as caught:
        cli_explain.resolve(cli_explain.op_spec("fbank", None), *args)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_grouped_heads_must_divide():
    with pytest.raises(cli_explain.UsageError, match="multiple of num_kv_heads"):
        cli_explain.resolve(cli_explain.op_spec("sdpa_decode", None),
                            ["batch=1", "num_heads=32", "num_kv_heads=6", "head_dim=128", "seq_kv=64"], [])


def test_kernel_feature_reads_height_x_width():
    fields, features, _ = cli_explain.resolve(cli_explain.op_spec("conv", "conv2d"),
                                              ["batch=1", "c_in=1", "c_out=32", "length=4000"], ["kernel=7x7"])
    assert features["kernel"] == (7, 7) and fields["taps"] == 49


def test_unknown_family_and_op_list_the_valid_ones():
    with pytest.raises(cli_explain.UsageError, match="choose from sdpa_decode, conv, fbank, lstm, segdense"):
        cli_explain.op_spec("foo", None)
    with pytest.raises(cli_explain.UsageError, match="choose from conv1d, conv2d, sincnet, stats_pool"):
        cli_explain.op_spec("conv", "conv3d")
    assert cli_explain.op_spec("conv", None).op == "conv1d"


@pytest.mark.parametrize("family", sorted(f.value for f in FAMILIES))
def test_every_candidate_tag_part_has_a_meaning(family):
    from rlx_triton.planner.policy import KernelFamily

    for variant in FAMILIES[KernelFamily(family)].variants.ALL:
        candidate = variant.candidate()
        legend = cli_explain.tag_legend(family, candidate)
        assert "_".join(part for part, _ in legend) == candidate.tag()
        for part, text in legend:
            name_value, _, meaning = text.partition("  ")
            assert "=" in name_value and meaning.strip(), (family, part)
