"""oneDNN-prepacked linear layers (inference.packed) compute what nn.Linear does."""

from __future__ import annotations

import pytest
import torch

from inference.packed import (
    FusedProjections,
    PackedLinear,
    ProjectionSlice,
    onednn_linear_available,
    prepack_linear_layers,
)
from testing.tiny_model import tiny_model

pytestmark = pytest.mark.skipif(not onednn_linear_available(), reason="this torch/CPU has no oneDNN bf16 linear")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 64), (3, 1, 64), (2, 5, 64), (40, 64)])
def test_packed_linear_equals_nn_linear(shape, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=bias).to(torch.bfloat16)
    hidden_states = torch.randn(*shape, dtype=torch.bfloat16)
    packed = PackedLinear.from_linear(linear)
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
    attention, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert attention.q_proj.fused is attention.v_proj.fused and mlp.gate_proj.fused is mlp.up_proj.fused
    assert type(attention.o_proj) is PackedLinear and type(mlp.down_proj) is PackedLinear
    assert model.get_output_embeddings().out_features == 70
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize("bias", [False, True])
def test_fused_projections_equal_their_linears_in_any_order(bias):
    torch.manual_seed(0)
    linears = [torch.nn.Linear(64, size, bias=bias).to(torch.bfloat16) for size in (48, 16, 16)]
    fused = FusedProjections(linears)
    slices = [ProjectionSlice(fused, index) for index in range(3)]
    first, second = torch.randn(2, 3, 64, dtype=torch.bfloat16), torch.randn(2, 3, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        expected = {(id(x), i): linears[i](x) for x in (first, second) for i in range(3)}
        # In order; out of order; interleaved inputs; one slice twice on the same input.
        for x, i in [
            (first, 0),
            (first, 1),
            (first, 2),
            (second, 2),
            (second, 0),
            (first, 1),
            (second, 1),
            (first, 0),
            (first, 0),
            (first, 2),
        ]:
            got = slices[i](x)
            assert got.shape == (2, 3, linears[i].out_features)
            torch.testing.assert_close(got, expected[(id(x), i)], rtol=1e-2, atol=1e-2)
    assert (slices[1].in_features, slices[1].out_features) == (64, 16)


def test_a_fused_group_lets_go_of_its_input_once_every_slice_took_its_part():
    linears = [torch.nn.Linear(8, 4, bias=False).to(torch.bfloat16) for _ in range(2)]
    fused = FusedProjections(linears)
    x = torch.randn(1, 8, dtype=torch.bfloat16)
    with torch.inference_mode():
        ProjectionSlice(fused, 0)(x)
        assert fused._input is x
        ProjectionSlice(fused, 1)(x)
    assert fused._input is None and fused._outputs == ()
