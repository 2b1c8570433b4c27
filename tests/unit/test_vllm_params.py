"""The vLLM routes' request checks and /pooling's base64 encoding, without a server."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from rmscore.core.errors import ScoreError
from rmscore.frontends.vllm_api import ClassifyIn, PoolingIn, ScoreIn, VllmRoutes


@pytest.mark.parametrize("body, field", [
    (PoolingIn(input="x", dimensions=4), "dimensions"),
    (PoolingIn(input="x", normalize=False), "normalize"),
    (PoolingIn(input="x", task="token_classify"), "task"),
    (PoolingIn(input="x", step_tag_id=3), "step_tag_id"),
    (ClassifyIn(input="x", priority=1), "priority"),
    (ScoreIn(text_1="a", text_2="b", priority=2), "priority"),
])
def test_refused_like_vllm(body, field):
    with pytest.raises(ScoreError) as e:
        VllmRoutes.check_params(body)
    assert e.value.message.startswith(field)


def test_accepted_fields_and_the_deprecated_activation_spellings():
    for body in (PoolingIn(input="x", task="classify"), ClassifyIn(input="x", dimensions=4), ScoreIn(text_1="a", text_2="b")):
        VllmRoutes.check_params(body)  # /classify ignores dimensions, as vLLM's ClassifyRequest does
    b = ClassifyIn(input="x", activation=False)
    VllmRoutes.check_params(b)
    assert b.use_activation is False
    b = ClassifyIn(input="x", use_activation=True, softmax=False)
    VllmRoutes.check_params(b)
    assert b.use_activation is True  # the current name wins


@pytest.mark.parametrize("dtype, order, np_dtype", [("float32", "little", "<f4"), ("float16", "big", ">f2")])
def test_base64_is_the_values_bytes(dtype, order, np_dtype):
    values = [0.25, -3.5]
    out = VllmRoutes.encode(PoolingIn(input="x", encoding_format="base64", embed_dtype=dtype, endianness=order), values)
    assert np.frombuffer(base64.b64decode(out), dtype=np_dtype).tolist() == values


def test_bfloat16_is_the_upper_half_of_float32_rounded():
    values = [1.0, -2.5, 3.140625]  # exact in bfloat16
    out = VllmRoutes.encode(PoolingIn(input="x", encoding_format="base64", embed_dtype="bfloat16",
                                      endianness="little"), values)
    halves = np.frombuffer(base64.b64decode(out), dtype="<u2").astype(np.uint32) << 16
    assert halves.view(np.float32).tolist() == values
    assert VllmRoutes.encode(PoolingIn(input="x"), values) == values
