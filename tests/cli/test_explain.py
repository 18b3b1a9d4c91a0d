"""`rlx-triton explain` on the ops' request specs: from the fields a user gives, the request the op itself
builds; derived fields refused; the legend of a candidate's tag.

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
    "sdpa_broadcast_heads": (lambda: sdpa_decode.scaled_dot_product_attention.__rlx_request__(*_sdpa_tensors()),
                             ATTENTION, ["layout=broadcast"]),
    "sdpa_decode_paged": (lambda: sdpa_decode.sdpa_decode.__rlx_request__(
        torch.randn(2, 8, 1, 64), torch.randn(8, 2, 16, 64), torch.randn(8, 2, 16, 64), torch.tensor([10, 30]),
        block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)),
        ["batch=2", "num_heads=8", "head_dim=64", "seq_kv=32", "num_kv_heads=2"], ["paged=true"]),
    "sdpa_causal_3_tokens": (
        lambda: sdpa_decode.scaled_dot_product_attention.__rlx_request__(*_sdpa_tensors(3), is_causal=True,
                                                                          enable_gqa=True),
        ATTENTION + ["seq_q=3"], ["causal=top_left"]),
    "fbank_wespeaker": (lambda: fbank.fbank.__rlx_request__(torch.randn(2, 4007), num_mel_bins=80,
                                                            window_type="hamming"),
                        ["batch=2", "samples=4007", "bins=80"], ["window_type=hamming"]),
    "fbank_no_snip": (lambda: fbank.fbank.__rlx_request__(torch.randn(1, 1207), snip_edges=False),
                      ["batch=1", "samples=1207"], ["snip_edges=false"]),
    "fbank_8khz_positional": (lambda: fbank.fbank.__rlx_request__(torch.randn(1, 3000), 0.42, -1, 0.0, 1.0, 25.0,
                                                                  10.0, sample_frequency=8000.0,
                                                                  round_to_power_of_two=False),
                              ["batch=1", "samples=3000", "window_size=200", "window_shift=80",
                               "round_to_power_of_two=false"], []),
    "conv1d_pooled": (lambda: conv.conv1d.__rlx_request__(torch.randn(2, 80, 500), torch.randn(60, 80, 5),
                                                          torch.randn(60), epilogue=conv.ConvEpilogue(pool=3)),
                      ["batch=2", "c_in=80", "c_out=60", "length=500", "taps=5"], ["pool=3"]),
    "conv1d_padded_dilated": (lambda: conv.conv1d.__rlx_request__(torch.randn(80, 500), torch.randn(60, 80, 5),
                                                                  padding=3, dilation=2, stride=2),
                              ["batch=1", "c_in=80", "c_out=60", "length=500", "taps=5", "padding=3",
                               "dilation=2", "stride=2"], []),
    "conv1d_same_odd": (lambda: conv.conv1d.__rlx_request__(torch.randn(1, 8, 50), torch.randn(8, 8, 4),
                                                            padding="same"),
                        ["batch=1", "c_in=8", "c_out=8", "length=50", "taps=4"], ["padding_mode=same_asymmetric"]),
    "conv2d_3x3": (lambda: conv2d.conv2d.__rlx_request__(torch.randn(2, 32, 10, 20), torch.randn(32, 32, 3, 3),
                                                         padding=1, relu=True),
                   ["batch=2", "c_in=32", "c_out=32", "height=10", "width=20"], ["relu=true"]),
    "conv2d_strided_odd": (lambda: conv2d.conv2d.__rlx_request__(torch.randn(2, 16, 11, 21),
                                                                 torch.randn(32, 16, 3, 3), stride=2, padding=1),
                           ["batch=2", "c_in=16", "c_out=32", "height=11", "width=21", "stride=2"], []),
    "linear": (lambda: conv2d.linear.__rlx_request__(torch.randn(6, 256), torch.randn(192, 256)),
               ["batch=6", "c_in=256", "c_out=192", "height=1", "width=1"], ["kernel=1x1", "padding=0"]),
    "stats_pool": (lambda: conv2d.stats_pool.__rlx_request__(torch.randn(2, 64, 50)),
                   ["batch=2", "c_in=64", "length=50"], []),
    "sincnet": (_sincnet_call, ["batch=2", "length=16000"], []),
    "lstm_bidirectional": (_lstm_call, ["batch=4", "seq=50", "input_size=60", "hidden=128", "layers=2",
                                        "directions=2"], ["batch_first=true"]),
    "segdense_pyannote": (lambda: segdense.segdense.__rlx_request__(
        torch.randn(4, 589, 256), [torch.randn(128, 256), torch.randn(128, 128)], [torch.zeros(128), torch.zeros(128)],
        torch.randn(7, 128), torch.zeros(7)), ["rows=2356", "in_features=256", "hidden=128", "classes=7"], []),
}


def _explained(spec, field_args, feature_args, request):
    given, features, _filled = cli_explain.resolve(spec, field_args, feature_args)
    return spec.make(given, features, dtype=request.dtype, device=request.device)


@pytest.mark.parametrize("name", sorted(CASES))
def test_spec_builds_the_request_the_op_builds(name):
    call, field_args, feature_args = CASES[name]
    request = call()
    spec = cli_explain.op_spec(request.family, request.op)
    assert _explained(spec, field_args, feature_args, request) == request   # fields and features in the same order


def test_every_op_builds_its_request_from_the_spec_explain_reads():
    """The ops' request builders and explain read one declaration: the op's module's."""
    assert cli_explain.op_spec("conv", "conv2d") is conv2d.CONV2D_REQUEST
    assert cli_explain.op_spec("sdpa_decode", None) is sdpa_decode.SDPA_DECODE_REQUEST
    assert cli_explain.op_spec("fbank", None) is fbank.FBANK_REQUEST


@pytest.mark.parametrize("family", sorted(cli_explain.family_ops()))
def test_every_spec_declares_its_familys_required_launch_fields_once(family):
    from rlx_triton.planner.policy import KernelFamily

    launch_fields = FAMILIES[KernelFamily(family)].launch_fields
    for spec in cli_explain.family_ops()[family]:
        assert {f.name for f in launch_fields if f.required} <= set(spec.field_names)
        assert set(spec.sent) <= {f.name for f in launch_fields}
        assert len(set(spec.field_names)) == len(spec.field_names)


def test_filled_fields_say_why():
    spec = cli_explain.op_spec("sdpa_decode", None)
    given, features, filled = cli_explain.resolve(spec, ["batch=1", "num_heads=32", "num_kv_heads=8",
                                                         "head_dim=128", "seq_kv=4096"], [])
    fields = spec.make(given, features, dtype="float16", device="cpu").field_map
    assert fields["m"] == 4 and fields["tokens"] == 1 and fields["seq_q"] == 1
    assert [name for name, _, _ in filled] == ["seq_q", "head_dim_v", "m", "tokens"]
    assert all(why for _, _, why in filled)


def test_defaults_may_be_given_and_are_then_not_filled_in():
    spec = cli_explain.op_spec("fbank", None)
    given, features, filled = cli_explain.resolve(spec, ["batch=1", "samples=16000", "bins=80", "window_size=400",
                                                         "window_shift=160", "round_to_power_of_two=true"], [])
    assert given["bins"] == 80 and [name for name, _, _ in filled] == ["window", "frames", "tokens"]


@pytest.mark.parametrize("field, message", [
    ("m=7", "m is derived: seq_q x num_heads / num_kv_heads; give --field seq_q, num_heads, num_kv_heads instead"),
    ("tokens=99", "tokens is derived: = seq_q; give --field seq_q instead"),
])
def test_a_derived_field_given_is_refused_naming_what_it_is_computed_from(field, message):
    with pytest.raises(cli_explain.UsageError) as caught:
        cli_explain.resolve(cli_explain.op_spec("sdpa_decode", None),
                            ["batch=1", "num_heads=32", "num_kv_heads=8", "head_dim=128", "seq_kv=64", field], [])
    assert str(caught.value) == message


def test_a_field_derived_from_features_names_them_too():
    with pytest.raises(cli_explain.UsageError, match=r"give --field length, taps, stride, padding, dilation and "
                                                     r"--feature pool, padding_mode instead"):
        cli_explain.resolve(cli_explain.op_spec("conv", "conv1d"),
                            ["batch=1", "c_in=1", "c_out=1", "length=10", "taps=3", "tokens=8"], [])


def test_a_constant_field_says_the_op_always_sends_it():
    with pytest.raises(cli_explain.UsageError, match="taps is derived: 1 for stats_pool; leave it out"):
        cli_explain.resolve(cli_explain.op_spec("conv", "stats_pool"), ["batch=1", "c_in=4", "length=9", "taps=3"],
                            [])


def test_fields_that_contradict_nothing_still_work():
    spec = cli_explain.op_spec("sdpa_decode", None)
    given, features, _ = cli_explain.resolve(spec, ["batch=1", "num_heads=32", "num_kv_heads=32", "head_dim=128",
                                                    "head_dim_v=128", "seq_q=1", "seq_kv=64"], [])
    assert spec.make(given, features, dtype="float32", device="cpu").field_map["m"] == 1


def test_a_broadcast_sdpa_layout_does_not_group_heads():
    spec = cli_explain.op_spec("sdpa_decode", "scaled_dot_product_attention")
    given, features, _ = cli_explain.resolve(spec, ["batch=1", "num_heads=6", "num_kv_heads=4", "head_dim=8",
                                                    "seq_q=3", "seq_kv=16"], ["layout=broadcast"])
    assert spec.make(given, features, dtype="float32", device="cpu").field_map["m"] == 3
    with pytest.raises(cli_explain.UsageError, match="multiple of num_kv_heads"):
        cli_explain.resolve(spec, ["batch=1", "num_heads=6", "num_kv_heads=4", "head_dim=8", "seq_kv=16"], [])


@pytest.mark.parametrize("args, message", [
    ((["batch=1", "samples=16000", "nope=3"], []), "has no field nope; its fields are batch, samples"),
    ((["batch=1"], []), "needs --field samples=N"),
    ((["batch=1", "samples=x"], []), "--field samples must be an integer"),
    ((["batch=0", "samples=16000"], []), "--field batch=0 is outside [1, "),
    ((["batch=1", "samples=16000"], ["colour=red"]), "has no feature colour; its features are window_type"),
    ((["batch=1", "samples=16000"], ["window_type=square"]), "window_type must be one of hamming"),
    ((["batch=1", "samples=16000"], ["snip_edges=maybe"]), "snip_edges must be true or false"),
    ((["batch=1", "samples=16000"], ["snip_edges"]), "--feature expects name=value"),
    ((["batch=1", "samples=300"], []), "samples=300 is shorter than one frame (window_size=400 samples)"),
    ((["batch=1", "samples=16000", "round_to_power_of_two=2"], []), "round_to_power_of_two must be true or false"),
    ((["batch=1", "samples=16000", "window_size=1"], []), "--field window_size=1 is outside [2, "),
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
    spec = cli_explain.op_spec("conv", "conv2d")
    given, features, _ = cli_explain.resolve(spec, ["batch=1", "c_in=1", "c_out=32", "height=40", "width=100"],
                                             ["kernel=7x7", "padding=3"])
    fields = spec.make(given, features, dtype="float32", device="cpu").field_map
    assert features["kernel"] == (7, 7) and fields["taps"] == 49 and fields["length"] == fields["tokens"] == 4000


def test_a_conv_output_shorter_than_its_pool_is_a_usage_error():
    with pytest.raises(cli_explain.UsageError, match="pool=8 is larger than the conv output length 6"):
        cli_explain.resolve(cli_explain.op_spec("conv", "conv1d"),
                            ["batch=1", "c_in=1", "c_out=1", "length=10", "taps=5"], ["pool=8"])


def test_the_dtype_must_be_one_the_op_takes():
    spec = cli_explain.op_spec("lstm", None)
    assert cli_explain.check_dtype(spec, "bfloat16") == "bfloat16"
    with pytest.raises(cli_explain.UsageError, match="--dtype must be one of float16, bfloat16, float32, float64"):
        cli_explain.check_dtype(spec, "int8")


def test_unknown_family_and_op_list_the_valid_ones():
    with pytest.raises(cli_explain.UsageError, match="choose from sdpa_decode, conv, fbank, lstm, segdense"):
        cli_explain.op_spec("foo", None)
    with pytest.raises(cli_explain.UsageError, match="choose from conv1d, conv2d, sincnet, stats_pool"):
        cli_explain.op_spec("conv", "conv3d")
    assert cli_explain.op_spec("conv", None).op == "conv1d"


@pytest.mark.parametrize("family", sorted(f.value for f in FAMILIES))
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_every_candidate_tag_part_has_a_meaning(family, dtype):
    from rlx_triton.planner.policy import KernelFamily

    for variant in FAMILIES[KernelFamily(family)].variants.ALL:
        candidate = variant.candidate()
        legend = cli_explain.tag_legend(family, candidate, dtype)
        assert "_".join(part for part, _ in legend) == candidate.tag()
        for part, text in legend:
            name_value, _, meaning = text.partition("  ")
            assert "=" in name_value and meaning.strip(), (family, part)


@pytest.mark.parametrize("family", sorted(f.value for f in FAMILIES))
def test_every_tag_word_of_every_field_has_a_meaning(family):
    """Words no variant uses too: a tuned winner or a plan's candidate may carry any of them."""
    from rlx_triton.planner.candidates import base
    from rlx_triton.planner.policy import KernelFamily

    for field in FAMILIES[KernelFamily(family)].candidate_type.TAG.fields:
        if isinstance(field, base.IntField):
            assert field.sets, (family, field.name)
        else:
            values = (True, False) if isinstance(field, base.FlagField) else field.choices
            for value in values:
                assert field.meaning(value, "float16") and field.meaning(value, "float32"), (family, value)


def _decode_candidate(tag="skp4_tg256_tm16_tn64_tk128_pq1_pk1_f16kv_partial"):
    from rlx_triton.planner import SdpaDecodeCandidate

    return SdpaDecodeCandidate.from_tag(tag)


def test_the_legend_of_an_fp32_decode_request_makes_no_fp16_claim():
    legend = dict(cli_explain.tag_legend("sdpa_decode", _decode_candidate(), "float32"))
    assert legend["f16kv"] == "use_f16_kv=True  no effect on an fp32 request: the kernel keeps fp32 operands"
    assert not any("fp16" in text for text in legend.values())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_legend_of_a_16_bit_decode_request_says_fp16_operands(dtype):
    legend = dict(cli_explain.tag_legend("sdpa_decode", _decode_candidate(), dtype))
    assert legend["f16kv"] == "use_f16_kv=True  QK^T and PV dots on fp16/bf16 operands (tensor cores)"


def test_the_varlen_f16dot_word_also_says_it_does_nothing_on_fp32():
    from rlx_triton.planner import VarlenAttentionCandidate

    candidate = VarlenAttentionCandidate.from_tag("bm16_bn32_tg128_ns2_f16dot")
    assert "no effect on an fp32 request" in dict(cli_explain.tag_legend("varlen_attention", candidate,
                                                                           "float32"))["f16dot"]
    assert "fp16/bf16 operands" in dict(cli_explain.tag_legend("varlen_attention", candidate, "float16"))["f16dot"]


def test_a_legend_refuses_a_candidate_of_another_family():
    with pytest.raises(ValueError, match="not a candidate of the conv family"):
        cli_explain.tag_legend("conv", _decode_candidate("skp1_tg128_tm1_tn64_tk64_pq1_pk1_f32kv_full"))


def test_explain_help_lists_every_op_and_what_its_fields_count():
    text = cli_explain.help_text()
    for specs in cli_explain.family_ops().values():
        for spec in specs:
            assert f"    {spec.op}: --field {', '.join(spec.required)}" in text
    assert "    height                 input height" in text
    assert "    m                      query rows per KV head" in text


@pytest.mark.parametrize("dtype, bound", [("float32", "1.0e-05"), ("float16", "1.0e-03")])
def test_the_accuracy_line_is_the_bound_measured_for_the_request_dtype(capsys, dtype, bound):
    """An f16-KV decode candidate keeps fp32 operands on an fp32 request: explain states the fp32 bound there,
    and the fp16 measurement only where fp16 operands run."""
    from rlx_triton import cli

    code = cli.main(["explain", "sdpa_decode", "--device", "h200", "--dtype", dtype, "--field", "batch=1",
                     "--field", "num_heads=8", "--field", "head_dim=64", "--field", "seq_kv=4096"])
    out = capsys.readouterr().out
    assert code == 0 and "_f16kv_" in out
    assert f"accuracy   max rel err {bound} vs float64" in out
