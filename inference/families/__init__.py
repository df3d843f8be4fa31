"""Model families: how each family's checkpoint maps onto the runner (names, shapes, rotary
embeddings), one small module each.  :mod:`inference.families.llama` is the first."""
