"""rt.nn's public names resolve to the modules that define them, lazily."""
import rlx_triton as rt


def test_every_exported_module_resolves():
    for name in rt.nn.__all__:
        module = getattr(rt.nn, name)
        assert module.__name__ == name


def test_unknown_name_is_an_attribute_error():
    import pytest

    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        rt.nn.Nope
