"""A tiny random Llama generates the same tokens with attn_implementation "rlx_triton" as with "sdpa"."""
from __future__ import annotations

import contextlib
import inspect
import json
import subprocess
import sys

import pytest
import torch

import rlx_triton as rt
from rlx_triton.integrations import transformers as rt_transformers
from tests.conftest import REPO

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


def test_assisted_generation_verifies_the_drafts_on_the_kernel_and_matches_sdpa():
    """Speculative decoding: a perturbed copy of the model (on sdpa) drafts up to 20 tokens a step, some accepted,
    some not, and the model verifies them in one call of up to 21 query tokens against its cache, under the
    causal mask transformers passes. Strict mode: every attention call of the model runs the kernel; the
    tokens are those of the model on sdpa."""
    from rlx_triton.backends.triton import launches
    from rlx_triton.backends.triton import sdpa_decode as tk

    rt_transformers.register("rlx_triton")
    model, assistant = tiny_llama(), tiny_llama()
    with torch.no_grad():
        for weight in assistant.parameters():
            weight.add_(0.005 * torch.randn_like(weight))
    assistant.generation_config.num_assistant_tokens = 20
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0   # draft all 20, however unsure
    assistant.set_attn_implementation("sdpa")
    input_ids = torch.randint(1, 96, (1, 6))

    def assisted(implementation):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            return model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                  assistant_model=assistant, max_new_tokens=40, do_sample=False, pad_token_id=0)

    expected = assisted("sdpa")
    with rt.use_backend("triton", strict=True), launches.recording() as log:
        got = assisted("rlx_triton")
    assert torch.equal(got, expected)
    verified = [record.args[0].shape[2] for record in log.records if record.meta["MASK_KIND"] == tk.MASK_BOOL]
    assert max(verified) > 16 and len(set(verified)) > 1   # verifications past 16 tokens, of several lengths


def test_attention_output_layout_is_batch_tokens_heads_dim():
    model = tiny_llama()
    module = model.model.layers[0].self_attn
    q, k, v = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    out, weights = rt_transformers.attention_forward(module, q, k, v, None, scaling=0.25)
    assert out.shape == (1, 3, 4, 16) and weights is None


# --- transformers' flash path: continuous batching and padded generate through rt's FA2 API ---------------
def tiny_model(kind: str):
    """Tiny random models with GQA: Llama; Mistral with a sliding window shorter than the prompts; Gemma-2 with
    logit softcapping and its alternating sliding / full attention layers."""
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)
    if kind == "llama":
        config = transformers.LlamaConfig(**common)
        model_class = transformers.LlamaForCausalLM
    elif kind == "mistral":
        config = transformers.MistralConfig(**common, sliding_window=4)
        model_class = transformers.MistralForCausalLM
    else:
        config = transformers.Gemma2Config(**common, head_dim=16, sliding_window=4, attn_logit_softcapping=5.0,
                                           final_logit_softcapping=None)
        model_class = transformers.Gemma2ForCausalLM
    torch.manual_seed(0)
    return model_class(config).eval()


PROMPT_LENGTHS = (5, 9, 3)


def generate_batch(model, implementation):
    model.set_attn_implementation(implementation)
    torch.manual_seed(1)
    prompts = [torch.randint(1, 96, (n,)).tolist() for n in PROMPT_LENGTHS]
    config = transformers.GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)
    # a small paged cache (16 pages of 16) and at most 64 tokens a step, so prefills and decodes share steps
    batching = transformers.ContinuousBatchingConfig(num_blocks=16, block_size=16, max_batch_tokens=64)
    outputs = model.generate_batch(prompts, generation_config=config, continuous_batching_config=batching,
                                   progress_bar=False, warmup=False)
    return {request: output.generated_tokens for request, output in outputs.items()}


def test_register_flash_makes_a_flash_implementation_that_resolves_to_rt():
    from transformers import modeling_flash_attention_utils as fa_utils

    name = rt_transformers.register_flash()
    assert name == rt_transformers.CONTINUOUS_BATCHING_ATTENTION and "flash" in name
    assert name in transformers.AttentionInterface()
    (flash_fn, varlen_fn, kvcache_fn, _, _), _ = fa_utils.lazy_import_flash_attention(name)
    # transformers wraps the kv-cache function in torch.compiler.disable
    assert (flash_fn, varlen_fn, inspect.unwrap(kvcache_fn)) == (rt.flash_attn_func, rt.flash_attn_varlen_func,
                                                                 rt.flash_attn_with_kvcache)
    with pytest.raises(ValueError, match="flash"):
        rt_transformers.register_flash("rlx_triton_paged")


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2"])
def test_continuous_batching_on_the_kernel_gives_sdpas_tokens(kind):
    model = tiny_model(kind)
    # Gemma-2 has no SDPA path in transformers (softcapping): its reference is continuous batching's eager one
    expected = generate_batch(model, "paged|eager" if kind == "gemma2" else "sdpa")
    name = rt_transformers.register_flash()
    with rt.use_backend("triton", strict=True):   # every attention call of every step runs the ragged kernel
        got = generate_batch(model, name)
    assert got == expected and len(got) == len(PROMPT_LENGTHS)


def test_continuous_batching_on_the_torch_path_gives_sdpas_tokens():
    model = tiny_model("mistral")
    expected = generate_batch(model, "sdpa")
    with rt.use_backend("torch"):
        got = generate_batch(model, rt_transformers.register_flash())
    assert got == expected


def test_padded_generate_through_the_flash_path_matches_sdpa():
    model = tiny_model("llama")
    input_ids = torch.randint(1, 96, (2, 6))
    attention_mask = torch.ones(2, 6, dtype=torch.long)
    attention_mask[1, :2] = 0  # left padding: transformers unpads to a varlen call
    input_ids[1, :2] = 0
    expected = generate(model, "sdpa", input_ids, attention_mask)
    with rt.use_backend("triton", strict=True):
        got = generate(model, rt_transformers.register_flash(), input_ids, attention_mask)
    assert torch.equal(got, expected)


def test_explain_of_a_model_with_registered_attention_returns_each_layers_attention_route():
    rt_transformers.register("rlx_triton")
    model = tiny_llama()
    model.set_attn_implementation("rlx_triton")
    routes = rt.explain(model, input_ids=torch.randint(1, 96, (1, 5)))
    assert sorted(routes) == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert all(route.family == "sdpa_decode" and route.backend for route in routes.values())


def test_explain_of_a_model_whose_attention_rt_does_not_run_warns_and_returns_no_route():
    model = tiny_llama()
    model.set_attn_implementation("eager")
    with pytest.warns(UserWarning, match="runs no rlx_triton module"):
        assert rt.explain(model, input_ids=torch.randint(1, 96, (1, 5))) == {}


# run in a fresh interpreter, where nothing but register() has registered a name with transformers
_REGISTER_ALONE = """
import json, torch, transformers
import rlx_triton as rt
from rlx_triton.integrations import transformers as rt_transformers
from tests.integrations.test_transformers import generate, generate_batch, tiny_model

assert rt_transformers.register() == "rlx_triton"
reference = tiny_model("llama")
input_ids = torch.randint(1, 96, (2, 6), generator=torch.Generator().manual_seed(2))
attention_mask = torch.ones(2, 6, dtype=torch.long)
attention_mask[1, :2] = 0
input_ids[1, :2] = 0
expected = generate(reference, "sdpa", input_ids, attention_mask).tolist()
expected_batch = generate_batch(reference, "sdpa")
equal = {}
with rt.use_backend("torch"):
    for name in rt_transformers.ATTENTION_NAMES:
        built = transformers.AutoModelForCausalLM.from_config(reference.config, attn_implementation=name).eval()
        built.load_state_dict(reference.state_dict())
        equal[name + " from_config"] = built.config._attn_implementation == name and generate(
            built, name, input_ids, attention_mask).tolist() == expected
        switched = generate(reference, name, input_ids, attention_mask).tolist()
        equal[name + " set_attn_implementation"] = switched == expected
    name = rt_transformers.CONTINUOUS_BATCHING_ATTENTION
    equal[name + " generate_batch"] = generate_batch(reference, name) == expected_batch
print(json.dumps(equal))
"""


def test_register_alone_makes_every_documented_name_usable():
    """register() and nothing else: each name of ATTENTION_NAMES builds a model (from_config) and switches one
    (set_attn_implementation), and greedy generation gives sdpa's tokens; continuous batching runs on the flash
    name and gives sdpa's tokens."""
    done = subprocess.run([sys.executable, "-c", _REGISTER_ALONE], capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    equal = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(equal) == 5 and all(equal.values()), equal
