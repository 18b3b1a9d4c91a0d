"""The examples in the public docstrings run and print what they show (standard doctest).

Each example runs under rt.use_backend("torch"): the examples document shapes and routing rules, which
hold on every backend, and the torch path keeps them fast on CPU (examples that force a backend
themselves nest inside it).
"""
import doctest
import importlib

import pytest

import rlx_triton as rt

# module -> the public names whose docstrings carry examples
DOCUMENTED = {
    "rlx_triton.ops.fbank": ["fbank"],
    "rlx_triton.ops.flash_attn": ["flash_attn_with_kvcache"],
    "rlx_triton.ops.sdpa": ["scaled_dot_product_attention", "patch_sdpa"],
    "rlx_triton.ops.sdpa_decode": ["sdpa_decode"],
    "rlx_triton.router.route": ["explain", "MissingKernel"],
    "rlx_triton.router.settings": ["use_backend"],
    "rlx_triton.explaining": ["explain"],
    "rlx_triton.integrations.pyannote": ["optimize", "explain"],
    "rlx_triton.integrations.transformers": ["register"],
    "rlx_triton.nn.lstm": ["LSTM"],
    "rlx_triton.nn.fbank": ["Fbank"],
    "rlx_triton.nn.conv": ["Conv1d", "SincNet"],
    "rlx_triton.nn.conv2d": ["Conv2d", "StatsPool", "Projection", "BasicBlock", "Bottleneck"],
    "rlx_triton.nn.segdense": ["SegDense"],
}


def _examples(module_name: str, name: str) -> doctest.DocTest:
    module = importlib.import_module(module_name)
    found = doctest.DocTestFinder(recurse=False).find(getattr(module, name), f"{module_name}.{name}",
                                                      module=module, globs={})
    return found[0] if found else None


@pytest.mark.parametrize("module_name,name", [(m, n) for m, names in DOCUMENTED.items() for n in names])
def test_docstring_example_runs_as_shown(module_name, name):
    test = _examples(module_name, name)
    assert test is not None and test.examples, f"{module_name}.{name} has no docstring example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    with rt.use_backend("torch"):
        runner.run(test)
    assert runner.failures == 0, f"{module_name}.{name}: {runner.failures} example(s) print something else"


# the public functions a new user reads first, in the one format: Args / Returns / Raises / Example, in that order
FORMATTED = ["explain", "fbank", "scaled_dot_product_attention", "sdpa_decode", "flash_attn_with_kvcache",
             "patch_sdpa", "use_backend"]
SECTIONS = ("Args:", "Returns:", "Raises:", "Example:")


@pytest.mark.parametrize("name", FORMATTED)
def test_public_docstring_has_args_returns_raises_and_example_in_order(name):
    import inspect

    lines = [line.strip() for line in inspect.getdoc(getattr(rt, name)).splitlines()]
    found = [line for line in lines if line in SECTIONS]
    assert found == [s for s in SECTIONS if s in found] and {"Returns:", "Example:"} <= set(found), (name, found)
    if name not in ("patch_sdpa",):
        assert "Args:" in found, name
    summary = lines[0]
    assert summary and len(summary) <= 110 and lines[1] == "", f"{name}: one summary line, then a blank one"


@pytest.mark.parametrize("name", FORMATTED)
def test_help_renders_the_sections_as_written(name):
    import inspect
    import pydoc

    text = pydoc.render_doc(getattr(rt, name), renderer=pydoc.plaintext)
    for section in SECTIONS:
        if section in inspect.getdoc(getattr(rt, name)):
            assert f"\n    {section}\n" in text, (name, section)
