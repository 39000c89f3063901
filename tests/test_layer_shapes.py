"""The FP8 layers' shape rules (cupygemm.layer_shapes): no torch needed."""
from __future__ import annotations

import pytest

from cupygemm import layer_shapes as ls


@pytest.mark.parametrize("tokens", [0, 1, 15, 16, 17, 4096, 4097])
def test_padded_tokens_is_the_next_multiple_of_16(tokens):
    p = ls.padded_tokens(tokens)
    assert p % 16 == 0 and tokens <= p < tokens + 16


def test_linear_dims_flattens_leading_axes():
    assert ls.linear_dims((2, 3, 7168), (2112, 7168)) == (6, 7168, 2112)
    assert ls.linear_dims((7168,), (2112, 7168)) == (1, 7168, 2112)
    assert ls.linear_dims((0, 256), (128, 256)) == (0, 256, 128)


@pytest.mark.parametrize("x,w,match", [
    ((4, 256), (128, 255), r"x: expected \[\.\.\., in_features = 255\]"),
    ((4, 248), (128, 248), r"weight: in_features \(K\) must be a multiple of 16 .*got K = 248"),
    ((4, 256), (120, 256), r"out_features \(N\) must be a multiple of 16"),
    ((4, 256), (2, 128, 256), r"weight: expected a 2-D"),
    ((), (128, 256), r"x: expected"),
])
def test_linear_dims_names_the_bad_argument(x, w, match):
    with pytest.raises(ValueError, match=match):
        ls.linear_dims(x, w)


def test_grouped_linear_dims():
    assert ls.grouped_linear_dims((640, 7168), (4, 4096, 7168), 4) == (640, 4, 7168, 4096)
    with pytest.raises(ValueError, match=r"out_features \(N\) must be a multiple of 128.*one expert"):
        ls.grouped_linear_dims((640, 256), (4, 64, 256), 4)
    with pytest.raises(ValueError, match=r"group_sizes: expected 4 sizes"):
        ls.grouped_linear_dims((640, 256), (4, 128, 256), 3)
    with pytest.raises(ValueError, match=r"x: expected a 2-D \[tokens, in_features = 256\]"):
        ls.grouped_linear_dims((2, 320, 256), (4, 128, 256), 4)


def test_check_group_sizes():
    assert ls.check_group_sizes([128, 0, 256], 400) == [128, 0, 256]
    with pytest.raises(ValueError, match=r"group_sizes\[1\] = 100: expected a non-negative multiple of 128"):
        ls.check_group_sizes([128, 100], 400)
    with pytest.raises(ValueError, match=r"group_sizes\[0\] = -128"):
        ls.check_group_sizes([-128], 400)
    with pytest.raises(ValueError, match=r"the groups hold 512 rows, but x has 400"):
        ls.check_group_sizes([256, 256], 400)
