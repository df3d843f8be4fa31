"""Model families: how each family's checkpoint maps onto the one runner (names, shapes, rotary
embeddings, biases, norms, attention windows), one small module each, registered on import
(:mod:`inference.families.family`): :mod:`~inference.families.llama` (with Mistral),
:mod:`~inference.families.qwen` and :mod:`~inference.families.gemma`."""

from . import gemma, llama, qwen  # noqa: F401  (registers the families)
