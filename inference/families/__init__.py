"""Model families: how each family's checkpoint maps onto the one runner (names, shapes, rotary
embeddings, biases, norms, attention windows), one small module each, registered on import
(:mod:`inference.families.family`): :mod:`~inference.families.llama` (with Mistral),
:mod:`~inference.families.qwen`, :mod:`~inference.families.phi3` and :mod:`~inference.families.gemma`."""

from . import gemma, llama, phi3, qwen  # noqa: F401  (registers the families)
