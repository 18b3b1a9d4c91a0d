"""A tiny random Llama generates the same tokens with attn_implementation "rlx_triton" as with "sdpa"."""
from __future__ import annotations

import contextlib

import pytest
import torch

import rlx_triton as rt
from rlx_triton.integrations import transformers as rt_transformers

transformers = pytest.importorskip("transformers")


def tiny_llama():
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def generate(model, implementation, input_ids, attention_mask, run_mode=torch.no_grad):
    model.set_attn_implementation(implementation)
    with run_mode():
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=4,
                              do_sample=False, pad_token_id=0)


def test_register_makes_the_name_an_attention_implementation():
    assert rt_transformers.register("rlx_triton") == "rlx_triton"
    assert "rlx_triton" in transformers.AttentionInterface()
    from transformers.masking_utils import AttentionMaskInterface

    assert "rlx_triton" in AttentionMaskInterface()


@pytest.mark.parametrize("run_mode", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference_mode"])
@pytest.mark.parametrize("built", ["outside", "inside"], ids=["built_outside", "built_in_inference_mode"])
def test_greedy_generation_with_padding_and_gqa_matches_sdpa(built, run_mode):
    """Under torch.no_grad and torch.inference_mode, with weights created outside or inside inference mode
    (inference tensors), every attention call (prefill and decode) runs the kernel and the tokens match."""
    rt_transformers.register("rlx_triton")
    with torch.inference_mode() if built == "inside" else contextlib.nullcontext():
        model = tiny_llama()
    input_ids = torch.randint(1, 96, (2, 6))
    attention_mask = torch.ones(2, 6, dtype=torch.long)
    attention_mask[1, :2] = 0  # left padding in the second prompt
    input_ids[1, :2] = 0
    expected = generate(model, "sdpa", input_ids, attention_mask, run_mode)
    with rt.use_backend("triton", strict=True):
        got = generate(model, "rlx_triton", input_ids, attention_mask, run_mode)
    assert torch.equal(got, expected)


def test_attention_output_layout_is_batch_tokens_heads_dim():
    model = tiny_llama()
    module = model.model.layers[0].self_attn
    q, k, v = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    out, weights = rt_transformers.attention_forward(module, q, k, v, None, scaling=0.25)
    assert out.shape == (1, 3, 4, 16) and weights is None
