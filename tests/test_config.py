"""rlx_triton.config: settings parsed from an environment mapping."""
from __future__ import annotations

import pytest

from rlx_triton.config import settings_from


@pytest.mark.parametrize("raw,policy", [(None, "auto"), ("auto", "auto"), ("AUTO", "auto"), ("1", "1"),
                                        ("true", "1"), ("0", "0"), ("off", "0")])
def test_check_values_reads_1_0_or_auto(raw, policy):
    env = {} if raw is None else {"RLX_TRITON_CHECK_VALUES": raw}
    assert settings_from(env).check_values == policy


def test_check_values_names_the_variable_for_a_bad_value():
    with pytest.raises(ValueError, match="RLX_TRITON_CHECK_VALUES must be one of 1, 0, auto, got 'sometimes'"):
        settings_from({"RLX_TRITON_CHECK_VALUES": "sometimes"})
