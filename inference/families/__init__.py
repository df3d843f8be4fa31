"""Model families: how each family's checkpoint maps onto the one runner (names, shapes, rotary
embeddings, biases, norms, attention windows), one small module each, registered on import
(:mod:`inference.families.family`): :mod:`~inference.families.llama` (with Mistral) and
:mod:`~inference.families.qwen`."""

from . import llama, qwen  # noqa: F401  (registers the families)
