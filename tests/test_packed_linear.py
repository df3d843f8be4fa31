"""oneDNN-prepacked linear layers (inference.model_loader.PackedLinear) compute what nn.Linear does."""
from __future__ import annotations

import pytest
import torch

from inference.model_loader import PackedLinear, onednn_linear_available, prepack_linear_layers
from tests.tiny_model import tiny_model

pytestmark = pytest.mark.skipif(not onednn_linear_available(), reason="this torch/CPU has no oneDNN bf16 linear")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 64), (3, 1, 64), (2, 5, 64), (40, 64)])
def test_packed_linear_equals_nn_linear(shape, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=bias).to(torch.bfloat16)
    hidden_states = torch.randn(*shape, dtype=torch.bfloat16)
    packed = PackedLinear(linear)
    with torch.inference_mode():
        expected, got = linear(hidden_states), packed(hidden_states)
    assert got.shape == (*shape[:-1], 48) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-2)


def test_prepacked_model_gives_the_same_logits_and_greedy_tokens():
    model = tiny_model(vocab_size=70).to(torch.bfloat16)
    input_ids = torch.randint(0, 70, (3, 12))
    with torch.inference_mode():
        expected = model(input_ids=input_ids).logits.float()
        replaced = prepack_linear_layers(model)
        got = model(input_ids=input_ids).logits.float()
    assert replaced == 2 * 7 + 1  # seven projections per layer, and the output layer
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert model.get_output_embeddings().out_features == 70
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
