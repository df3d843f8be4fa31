"""Linear layers in oneDNN's prepacked layout, with projections that read the same input fused.

``nn.Linear`` hands oneDNN a plain ``[out_features, in_features]`` weight on every call, which it
reads in a layout made for large batches.  Reordering each weight once, at load, into oneDNN's
blocked layout (what ``torch.compile``'s CPU "freezing" pass does, without compiling) makes a
bfloat16 decode step faster (docs/performance.md#packed-bfloat16-layers).  Projections that always
read the same input (attention's ``q_proj``, ``k_proj``, ``v_proj``; the MLP's ``gate_proj``,
``up_proj``) are also packed as one weight, so one matrix product serves all of them: fewer, larger
products read the weights faster, and a step makes fewer calls from Python.

Used for bfloat16 on the CPU only (:func:`onednn_linear_available`); CUDA and float32 keep
``nn.Linear``.
"""

from __future__ import annotations

import torch

# The batch size oneDNN lays the packed weights out for; any batch runs, and this one was the fastest
# for 1 to 32 rows (docs/performance.md#packed-bfloat16-layers).
PACKED_BATCH_HINT = 8
# oneDNN's linear on a packed weight, looked up once (``torch.ops`` resolves names per access);
# None in a torch built without oneDNN, where onednn_linear_available() is False.
try:
    _LINEAR_POINTWISE = torch.ops.mkldnn._linear_pointwise.default
except (AttributeError, RuntimeError):
    _LINEAR_POINTWISE = None  # type: ignore[assignment]  # never called: no PackedLinear is built without oneDNN

# Sibling projections packed as one weight when a module has all of them (HF's names).
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class PackedLinear(torch.nn.Module):
    """``y = x W^T + b`` with ``W`` (``[out_features, in_features]``) reordered once by oneDNN.

    Input ``[..., in_features]``, output ``[..., out_features]``, in the weight's dtype; the
    results are those of ``nn.Linear`` with the same weight.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACKED_BATCH_HINT)
        self.bias = None if bias is None else bias.detach()

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> PackedLinear:
        return cls(linear.weight, linear.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.dim() == 2:  # no reshapes: each aten call counts at batch 1
            return _LINEAR_POINTWISE(hidden_states, self.packed_weight, self.bias, "none", [], "")
        flat = hidden_states.reshape(-1, self.in_features)
        output = _LINEAR_POINTWISE(flat, self.packed_weight, self.bias, "none", [], "")
        return output.reshape(*hidden_states.shape[:-1], self.out_features)


class FusedProjections:
    """Several linears of one input computed by one :class:`PackedLinear` of their stacked weights.

    Each original layer is replaced by a :class:`ProjectionSlice`.  The first slice called with an
    input computes every projection of it; the others, called with the same tensor, take their
    columns of that result, which is then dropped once every slice has taken its part.  A slice
    called with another input computes anew, so any calling order stays correct.  (The input is
    matched by identity: a model that changed it in place between two slices' calls would get
    the earlier result, and inference tensors keep no version counter to tell.  The attention
    and MLP blocks of transformers' models pass one unchanged tensor to all of them.)
    """

    def __init__(self, linears: list[torch.nn.Linear]) -> None:
        biases = [linear.bias for linear in linears]
        bias = (
            None
            if all(b is None for b in biases)
            else torch.cat(
                [
                    b if b is not None else linear.weight.new_zeros(linear.out_features)
                    for b, linear in zip(biases, linears)
                ]
            )
        )
        self.linear = PackedLinear(torch.cat([linear.weight for linear in linears]), bias)
        self.sizes = [linear.out_features for linear in linears]
        self._input: torch.Tensor | None = None
        self._outputs: tuple[torch.Tensor, ...] = ()
        self._pending: set[int] = set()

    def output(self, hidden_states: torch.Tensor, index: int) -> torch.Tensor:
        """Projection ``index`` of ``hidden_states`` (``[..., in_features]`` → ``[..., sizes[index]]``)."""
        if hidden_states is not self._input or index not in self._pending:
            self._outputs = self.linear(hidden_states).split(self.sizes, dim=-1)
            self._input, self._pending = hidden_states, set(range(len(self.sizes)))
        self._pending.discard(index)
        output = self._outputs[index]
        if not self._pending:
            self._input, self._outputs = None, ()
        return output


class ProjectionSlice(torch.nn.Module):
    """Stands in for one linear of a :class:`FusedProjections` (same ``in_features``/``out_features``)."""

    def __init__(self, fused: FusedProjections, index: int) -> None:
        super().__init__()
        self.fused, self.index = fused, index
        self.in_features, self.out_features = fused.linear.in_features, fused.sizes[index]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fused.output(hidden_states, self.index)


def onednn_linear_available() -> bool:
    """Whether this torch build has oneDNN's prepacked linear ops with bf16 support on this CPU."""
    mkldnn = torch.ops.mkldnn
    try:
        return (
            torch.backends.mkldnn.is_available()
            and hasattr(mkldnn, "_reorder_linear_weight")
            and hasattr(mkldnn, "_linear_pointwise")
            and bool(mkldnn._is_mkldnn_bf16_supported())
        )
    except (AttributeError, RuntimeError):
        return False


def prepack_linear_layers(model: torch.nn.Module) -> int:
    """Replace every ``nn.Linear`` of ``model`` (on the CPU) with packed layers, in place.

    Sibling projections named in :data:`FUSED_GROUPS` with the same input size become slices of one
    :class:`FusedProjections`; every other linear becomes a :class:`PackedLinear` (a tied output
    layer gets its own packed copy; the input embeddings keep the original).  Returns the number
    of ``nn.Linear`` layers replaced.
    """
    replaced = 0
    for parent in list(model.modules()):
        for names in FUSED_GROUPS:
            found = [getattr(parent, name, None) for name in names]
            linears = [linear for linear in found if type(linear) is torch.nn.Linear]
            if len(linears) == len(names) and len({linear.in_features for linear in linears}) == 1:
                fused = FusedProjections(linears)
                for index, name in enumerate(names):
                    setattr(parent, name, ProjectionSlice(fused, index))
                replaced += len(names)
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, PackedLinear.from_linear(child))
                replaced += 1
    return replaced
