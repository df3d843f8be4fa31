"""The ModelRunner seam: what the engine asks of a forward pass and its KV caches.

A runner owns the weights, the KV cache of the running batch and of requests being prefilled,
and the forward pass; it knows nothing of sampling, text or scheduling (vLLM's model-runner seam,
``vllm/v1/worker/gpu_model_runner.py``).  The running batch is rows 0..B-1 in the engine's order.

:class:`HFModelRunner` runs any transformers causal LM through its own modeling code, with the
running batch in one left-padded :class:`~inference.kv_cache.BatchKVCache`: joining pads the
shorter side on the left, leaving selects rows and trims columns that are padding in every row.
``inference.llama.LlamaModelRunner`` (our own forward pass for the Llama family) implements the
same protocol; :func:`build_runner` picks one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from . import memory
from .chunks import PrefillChunk
from .kv_cache import BatchKVCache
from .model_loader import DTYPES, GGUFCheckpoint
from .packed import onednn_linear_available, prepack_linear_layers

logger = logging.getLogger(__name__)

RUNNERS = ("auto", "llama", "transformers")


class ModelRunner(Protocol):
    """The forward pass and KV caches behind the engine (see the module docstring)."""

    vocab_size: int  # rows of the output layer
    max_context: int  # max_position_embeddings
    description: str  # e.g. "llama runner, weights int8 (batch<=8) / float32, activations bfloat16"
    weight_formats: str  # the linear layers' formats, e.g. "layers: int4; output layer: float32 (cache)"

    def prefill(self, chunks: Sequence[PrefillChunk]) -> list[torch.Tensor]:
        """One forward pass over chunks of one or several waiting requests (several: short prompts, or
        prompt-logprob requests, batched together). Returns per chunk float32 logits
        [len(token_ids), vocab] if all_logits else [1, vocab]."""

    prefix_epoch: int  # changes whenever the prefix cache stores a prompt (never, where there is none)

    def reuse_prefix(self, key: int, token_ids: list[int]) -> int:
        """Take the longest cached prefix of a new request's prompt as `key`'s first positions (prefix
        caching), leaving its last token to compute; returns their count (0: none). Its first prefill
        chunk then starts there, or, when only the last token is left, `join` takes them and the next
        decode step feeds that token."""

    def free_batch(self) -> None:
        """Give an empty running batch's memory back (the engine calls it when it goes idle)."""

    def join(self, key: int, copies: int) -> None:
        """Append `copies` rows to the running batch, each holding the (fully prefilled) cache of `key`
        (n/best_of candidates share one prefill; 0: none, every candidate ended on its first token); the runner forgets `key`."""

    def decode(self, input_ids: Sequence[int]) -> torch.Tensor:
        """One decode step for every running row (input_ids[b] is row b's next token, at that row's next
        position, which the runner tracks). Returns float32 logits [B, vocab]."""

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only these running rows, in this order (finished/aborted rows leave)."""

    def release(self, key: int) -> None:
        """Forget a waiting request's partial cache (abort, failure). Harmless if unknown."""

    def reset(self) -> None:
        """Drop every cache (after a failed step)."""

    def warm_up(self) -> None:
        """Run representative prefill and decode shapes once, so the first request is as fast as the
        hundredth (kernels, allocator, autotune); called before the engine reports ready."""


def build_runner(
    model,
    kind: str = "auto",
    max_batch_size: int = 32,
    *,
    weights: str = "auto",
    cache_dir: Path | None = None,
    gguf: Path | None = None,
    drop_model_layers: bool = False,
    kv_cache_dtype: str = "auto",
    prefix_caching: str = "auto",
    prefix_cache_bytes: int = 128 << 20,
) -> ModelRunner:
    """The model runner for ``model`` (a loaded transformers causal LM, eval mode).

    ``kind``: ``transformers`` (:class:`HFModelRunner`), ``llama`` (``inference.llama``'s
    ``LlamaModelRunner``), or ``auto``: the Llama runner when that module is present and
    ``supports(model)``, else transformers.  ``max_batch_size`` sizes the Llama runner's warm-up.
    ``weights`` (``MODEL_WEIGHTS``): the Llama runner's linear formats, chosen by
    :func:`inference.weights.choose_formats` (an autotune cached under ``cache_dir``); ``gguf``: the
    GGUF file the model was converted from, whose Q4_1 blocks make lossless int4 weights (int4 is
    a candidate of ``auto`` only then).  The Llama runner keeps its own copies of the decoder
    layers; ``drop_model_layers`` drops the transformers model's (a server's memory; tests keep
    them to compare with ``model.generate``).  ``kv_cache_dtype`` (``ENGINE_KV_CACHE_DTYPE``): the
    Llama runner's KV cache, ``auto`` (float16 where its fused decode step runs and ``weights`` is
    not ``float32``, else the activations' dtype) or a name in :data:`inference.model_loader.DTYPES`; the transformers runner's
    cache is always in the activations' dtype.  ``prefix_caching`` (``ENGINE_PREFIX_CACHING``): the
    Llama runner's prefix cache of ``prefix_cache_bytes``, ``on``, ``off``, or ``auto`` (on unless
    ``weights`` is ``float32``: the deterministic mode computes every prompt from scratch); the
    transformers runner has none.  The transformers runner gets oneDNN-prepacked
    bf16 linears where the CPU has them (:mod:`inference.packed`).
    Raises ``ValueError`` for an unknown ``kind``, ``kv_cache_dtype`` or ``prefix_caching``, or for ``llama`` when that
    runner is missing or does not support the model.
    """
    if kind not in RUNNERS:
        raise ValueError(f"ENGINE_RUNNER must be one of {', '.join(RUNNERS)}, not {kind!r}")
    if kv_cache_dtype != "auto" and kv_cache_dtype not in DTYPES:
        raise ValueError(f"ENGINE_KV_CACHE_DTYPE must be auto or one of {', '.join(DTYPES)}, not {kv_cache_dtype!r}")
    if prefix_caching not in ("auto", "on", "off"):
        raise ValueError(f"ENGINE_PREFIX_CACHING must be auto, on or off, not {prefix_caching!r}")
    # float32 weights ask for the deterministic mode, which auto keeps exact: a float32 KV cache
    # (float16's rounding turns the last-bit differences of a batch's products into flipped tokens)
    # and every prompt computed from scratch.
    deterministic = weights == "float32"
    if prefix_caching == "off" or (prefix_caching == "auto" and deterministic):
        prefix_cache_bytes = 0
    kv_dtype: str | torch.dtype | None = kv_cache_dtype if kv_cache_dtype == "auto" else DTYPES[kv_cache_dtype]
    if kv_cache_dtype == "auto" and deterministic:
        kv_dtype = None
    if isinstance(model, GGUFCheckpoint):
        from . import cpu_kernels
        from .families.family import for_architecture
        from .families.llama import gguf_weights
        from .llama import LlamaModelRunner

        cpu_kernels.load(Path(cache_dir or ".cache"))  # built into the configured cache, before the layers ask
        started = time.perf_counter()
        checkpoint = gguf_weights(model.file, model.config, torch.float32, weights)
        logger.info(
            "Built the layers of %s in %.1f s: %s",
            model.file.path.name,
            time.perf_counter() - started,
            checkpoint.description,
        )
        architecture = model.file.get("general.architecture")
        family = for_architecture(architecture)
        return _serving(
            LlamaModelRunner(
                checkpoint,
                dtype=torch.float32,
                max_batch_size=max_batch_size,
                kv_cache_dtype=kv_dtype,
                prefix_cache_bytes=prefix_cache_bytes,
            ),
            "llama",
            f"GGUF architecture {architecture}: the {family.name if family else architecture} family, read as stored",
        )
    reason = "ENGINE_RUNNER=transformers"
    if kind != "transformers":
        try:
            # Imported here: the module is optional, and importing it is the test of its presence.
            from .llama import LlamaModelRunner, unsupported_reason
        except ImportError as error:
            if kind == "llama":
                raise ValueError(f"ENGINE_RUNNER=llama, but the Llama runner cannot be imported: {error}") from error
            if getattr(error, "name", None) != f"{__package__}.llama":
                logger.warning("The Llama runner failed to import (%s); using transformers' modeling", error)
            reason = f"our runner cannot be imported: {error}"
        else:
            from .families.family import for_model_type

            unsupported = unsupported_reason(model)
            if unsupported is None:
                dtype = next(model.parameters()).dtype
                factory = _weight_factory(model, dtype, weights, cache_dir, gguf)
                runner = LlamaModelRunner(
                    model,
                    dtype=dtype,
                    linear_factory=factory,
                    max_batch_size=max_batch_size,
                    kv_cache_dtype=kv_dtype,
                    prefix_cache_bytes=prefix_cache_bytes,
                )
                if drop_model_layers:  # the runner holds its own (fused, converted) weights
                    model.model.layers = torch.nn.ModuleList()
                    if runner.embedding_is_own:  # tied: the output layer's parameter goes too
                        model.get_input_embeddings().weight.data = torch.empty(0, dtype=dtype)
                    memory.trim()
                model_type = getattr(model.config, "model_type", None)
                family = for_model_type(model_type)
                name = family.name if family else model_type
                return _serving(runner, "llama", f"model_type {model_type}: the {name} family")
            reason = f"our runner does not run it: {unsupported}"
            if kind == "llama":
                raise ValueError(f"ENGINE_RUNNER=llama, but the Llama runner does not support {type(model).__name__}")
    device = next(model.parameters()).device
    if device.type == "cpu" and next(model.parameters()).dtype == torch.bfloat16 and onednn_linear_available():
        prepack_linear_layers(model)
    return _serving(HFModelRunner(model), "transformers", reason)


def _serving(runner, name: str, reason: str):
    """``runner`` with ``serving`` set: which runner it is (``llama``: ours, ``transformers``: their
    modeling) and why, for the start-up log and ``GET /v1/models``; returns it."""
    runner.serving = {"name": name, "reason": reason}
    logger.info("Runner: %s (%s)", name, reason)
    return runner


def _weight_factory(model, dtype: torch.dtype, weights: str, cache_dir: Path | None, gguf: Path | None):
    """The Llama runner's linear factory in the formats :func:`inference.weights.choose_formats` picks.

    ``auto`` chooses among the formats that cost no quality against the weights as loaded: float32
    and bfloat16 (where the CPU runs it) for every layer; for the decoder layers, when ``gguf`` has
    their Q4_1 blocks, ``q4_1`` (those blocks as they are, float32 activations, our kernels) or,
    where our kernels cannot run, ``int4`` (the blocks with scales rounded to bfloat16, bfloat16
    activations: bench/weight_formats.py measured its greedy text within bfloat16's noise); for the
    output layer ``q8_0`` when Q8_0 holds its weight exactly (the embedded GGUF's embedding is Q8_0).
    Where q4_1 layers can run long prefill chunks in bfloat16 from their blocks, no bfloat16 copy of
    the layers is a candidate.
    """
    from . import cpu_kernels
    from . import weights as formats

    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    hidden, inter = config.hidden_size, config.intermediate_size
    qkv_rows = (config.num_attention_heads + 2 * config.num_key_value_heads) * head_dim
    shapes = ((qkv_rows, hidden), (hidden, config.num_attention_heads * head_dim), (2 * inter, hidden), (hidden, inter))
    output = model.get_output_embeddings().weight
    cache = Path(cache_dir or ".cache")
    kernels = cpu_kernels.load(cache) if weights in ("auto", "q4_1", "q8_0") else None
    q4_1 = None
    if gguf is not None and (weights in ("auto", "int4", "q4_1")):
        q4_1 = formats.load_q4_1_blocks(gguf, config.num_attention_heads, config.num_key_value_heads, cache)
        names = [
            f"model.layers.{i}.{part}.weight"
            for i in range(config.num_hidden_layers)
            for part in formats.LAYER_PROJECTIONS
        ]
        if not all(name in q4_1 for name in names):
            q4_1 = None  # not every projection is Q4_1 in this GGUF: no lossless 4-bit format
    candidates = [*formats.AUTO_FORMATS, *([("q4_1" if kernels else "int4")] if q4_1 is not None else [])]
    if "q4_1" in candidates and formats.bfloat16_prefill_available():
        # q4_1 layers run long prefill chunks in bfloat16 from a copy made per call where that is
        # faster (Choice.make_layer): a stored bfloat16 copy would then serve only mid-sized decode
        # batches, not worth its memory (docs/performance.md#long-prefill-chunks-in-bfloat16).
        candidates.remove("bfloat16")
    output_candidates = [*formats.AUTO_FORMATS]
    if kernels is not None and weights == "auto" and formats.is_lossless_q8_0(output.detach()):
        output_candidates.append("q8_0")
    choice = formats.choose_formats(
        weights,
        cache_dir=cache / "weight_formats",
        layer_shapes=shapes,
        layers=config.num_hidden_layers,
        output_shape=tuple(output.shape),
        act_dtype=dtype,
        candidates=candidates,
        output_candidates=output_candidates,
    )
    if "q8_0" in output_candidates:
        choice = formats.output_beside_kernels(choice)
    return formats.llama_linear_factory(choice, q4_1)


@dataclass
class _Prefilled:
    """A waiting request's KV cache: row ``row`` of ``cache``, whose last ``length`` columns hold its
    prompt's first ``length`` tokens (columns before them are left padding of a shared pass)."""

    cache: BatchKVCache
    row: int
    length: int

    @property
    def alone(self) -> bool:
        """Whether the cache holds this request only, without padding (so a chunk may extend it)."""
        return self.cache.width == self.length and self.cache.rows == 1


class HFModelRunner:
    """A :class:`ModelRunner` over transformers' modeling code, for any causal LM whose layers all
    use full attention (``BatchKVCache`` raises ``NotImplementedError`` otherwise).

    ``model``: a loaded ``PreTrainedModel`` in eval mode.  :meth:`prefill` runs the chunks that
    begin a prompt together in one left-padded pass (two when some want every position's logits
    and others the last only, so the big logits tensor covers the former only), and each chunk
    that continues a prompt in a pass of its own, on that request's unpadded cache.  Joins are
    applied at the next :meth:`decode` or :meth:`keep`, all in one copy of the batch's cache.
    Not thread-safe: one worker thread calls it, under ``torch.inference_mode``.
    """

    # The running batch, set by _clear_batch.
    _cache: BatchKVCache | None
    _mask: torch.Tensor  # [rows, width] 1: real column
    _positions: torch.Tensor  # [rows] next position
    _pending: list[tuple[_Prefilled, int]]  # joins not yet applied: (prefilled prompt, copies)
    _rows: int

    def __init__(self, model) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        config = model.config.get_text_config(decoder=True)
        self.max_context = int(getattr(config, "max_position_embeddings", 0) or 0)
        self.vocab_size = int(model.get_output_embeddings().out_features)
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        packed = any(type(module).__name__ == "PackedLinear" for module in model.modules())
        self.weight_formats = f"{dtype}, oneDNN-packed" if packed else dtype
        self.description = f"transformers {type(model).__name__}, {self.weight_formats}"
        self._prompts: dict[int, _Prefilled] = {}
        self.reset()

    # --- prefill ---------------------------------------------------------------------------------

    def prefill(self, chunks: Sequence[PrefillChunk]) -> list[torch.Tensor]:
        """See :class:`ModelRunner`.  Raises ``ValueError`` when a chunk does not start where its
        request's cache ends."""
        results: dict[int, torch.Tensor] = {}
        fresh = [i for i, chunk in enumerate(chunks) if chunk.start == 0]
        if len(fresh) == 1:
            results[fresh[0]] = self._prefill_alone(chunks[fresh[0]])
        elif fresh:
            for all_logits in (True, False):
                group = [i for i in fresh if chunks[i].all_logits == all_logits]
                if group:
                    for i, logits in zip(group, self._prefill_together([chunks[i] for i in group])):
                        results[i] = logits
        for i, chunk in enumerate(chunks):
            if chunk.start:
                results[i] = self._prefill_alone(chunk)
        return [results[i] for i in range(len(chunks))]

    def _prefill_alone(self, chunk: PrefillChunk) -> torch.Tensor:
        """One request's chunk, on its own cache: no padding, no attention mask."""
        if chunk.start == 0:
            self._prompts.pop(chunk.key, None)
            cache = BatchKVCache(self.model.config)
        else:
            cache = self._own_cache(chunk)
        end = chunk.start + len(chunk.token_ids)
        output = self.model(
            input_ids=torch.tensor([chunk.token_ids], device=self.device),
            position_ids=torch.arange(chunk.start, end, device=self.device)[None],
            cache=cache,
            use_cache=True,
            logits_to_keep=0 if chunk.all_logits else 1,
        )
        self._prompts[chunk.key] = _Prefilled(cache, 0, end)
        return output.logits[0].float()

    def _own_cache(self, chunk: PrefillChunk) -> BatchKVCache:
        """The unpadded single-row cache of ``chunk``'s request, cut out of a shared pass's if needed."""
        prefilled = self._prompts.get(chunk.key)
        if prefilled is None or prefilled.length != chunk.start:
            have = 0 if prefilled is None else prefilled.length
            raise ValueError(f"a chunk starting at {chunk.start} follows {have} cached tokens")
        if prefilled.alone:
            return prefilled.cache
        cache = BatchKVCache(self.model.config)
        cache.join(
            [
                (
                    prefilled.cache,
                    torch.tensor([prefilled.row], device=self.device),
                    prefilled.cache.width - prefilled.length,
                )
            ]
        )
        return cache

    def _prefill_together(self, chunks: Sequence[PrefillChunk]) -> list[torch.Tensor]:
        """Chunks that begin their prompts, in one left-padded pass; per chunk its logits (float32)."""
        width = max(len(chunk.token_ids) for chunk in chunks)
        input_ids = torch.zeros(len(chunks), width, dtype=torch.long)
        mask = torch.zeros(len(chunks), width, dtype=torch.long)
        for row, chunk in enumerate(chunks):
            size = len(chunk.token_ids)
            input_ids[row, width - size :] = torch.tensor(chunk.token_ids)
            mask[row, width - size :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        all_logits = chunks[0].all_logits  # prefill() passes chunks that agree on it
        kept = max(len(chunk.token_ids) for chunk in chunks) if all_logits else 1
        cache = BatchKVCache(self.model.config)
        output = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            cache=cache,
            use_cache=True,
            logits_to_keep=kept,
        )
        results = []
        for row, chunk in enumerate(chunks):
            size = len(chunk.token_ids)
            self._prompts[chunk.key] = _Prefilled(cache, row, size)
            # The kept positions are the last `kept` columns; this row's real tokens are its last `size`.
            results.append(output.logits[row, kept - size :].float() if all_logits else output.logits[row, -1:].float())
        return results

    # --- the running batch -----------------------------------------------------------------------

    prefix_epoch = 0  # no prefix cache: never changes

    def reuse_prefix(self, key: int, token_ids: list[int]) -> int:
        """No prefix cache here (the Llama runner has one): always 0."""
        return 0

    def free_batch(self) -> None:
        """Nothing to do: an emptied batch's cache is dropped as it empties."""

    def join(self, key: int, copies: int) -> None:
        """See :class:`ModelRunner`; raises ``KeyError`` for a request never prefilled."""
        prefilled = self._prompts.pop(key)
        if copies:
            self._pending.append((prefilled, copies))
            self._rows += copies

    def _apply_joins(self) -> None:
        """Append the pending joins' rows to the batch's cache, mask and positions, in one copy."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        if self._cache is None:
            self._cache = BatchKVCache(self.model.config)
        parts, masks, positions = [], [], [self._positions]
        width = max([self._mask.shape[1]] + [prefilled.length for prefilled, _ in pending])
        for prefilled, copies in pending:
            rows = torch.full((copies,), prefilled.row, dtype=torch.long, device=self.device)
            parts.append((prefilled.cache, rows, prefilled.cache.width - prefilled.length))
            mask = torch.zeros(copies, width, dtype=torch.long, device=self.device)
            mask[:, width - prefilled.length :] = 1
            masks.append(mask)
            positions.append(torch.full((copies,), prefilled.length, dtype=torch.long, device=self.device))
        self._cache.join(parts)
        old = torch.nn.functional.pad(self._mask, (width - self._mask.shape[1], 0))
        self._mask = torch.cat([old, *masks])
        self._positions = torch.cat(positions)

    def decode(self, input_ids: Sequence[int]) -> torch.Tensor:
        """See :class:`ModelRunner`; raises ``ValueError`` when ``input_ids`` does not have one
        token per running row."""
        self._apply_joins()
        if len(input_ids) != self._rows or not self._rows:
            raise ValueError(f"decode got {len(input_ids)} tokens for {self._rows} running rows")
        mask = torch.cat([self._mask, torch.ones(self._rows, 1, dtype=torch.long, device=self.device)], 1)
        output = self.model(
            input_ids=torch.tensor(list(input_ids), device=self.device)[:, None],
            attention_mask=mask,
            position_ids=self._positions[:, None],
            cache=self._cache,
            use_cache=True,
        )
        self._mask = mask
        self._positions = self._positions + 1
        return output.logits[:, -1, :].float()

    def keep(self, rows: Sequence[int]) -> None:
        """See :class:`ModelRunner`."""
        self._apply_joins()
        if list(rows) == list(range(self._rows)):
            return
        if not rows:
            self._clear_batch()
            return
        index = torch.tensor(list(rows), device=self.device)
        mask = self._mask.index_select(0, index)
        first = int((mask.sum(0) > 0).nonzero()[0])  # first column that some row still uses
        self._mask = mask[:, first:]
        self._positions = self._positions.index_select(0, index)
        assert self._cache is not None, "rows are running, so they have a cache"
        self._cache.select(index, first)
        self._rows = len(rows)

    def release(self, key: int) -> None:
        self._prompts.pop(key, None)

    def reset(self) -> None:
        self._prompts.clear()
        self._clear_batch()

    def _clear_batch(self) -> None:
        self._cache = None
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self._positions = torch.zeros(0, dtype=torch.long, device=self.device)
        self._pending = []
        self._rows = 0

    # --- warm-up ---------------------------------------------------------------------------------

    def warm_up(self, lengths: Sequence[int] = (16, 100, 256), batch_sizes: Sequence[int] = (1, 8, 32)) -> None:
        """Prefill prompts of ``lengths`` tokens (together, alone, continued, with every position's
        logits), then decode two steps at each of ``batch_sizes``, on throwaway caches; see
        :class:`ModelRunner`.  The first real request then finds the kernels chosen and the
        allocator's pools grown."""
        limit = max(2, self.max_context - 4) if self.max_context else 512
        lengths = sorted({max(1, min(length, limit // 2)) for length in lengths})
        tokens = lambda n, offset=0: [(offset + i) % self.vocab_size for i in range(n)]  # noqa: E731
        chunks = [PrefillChunk(-1 - i, tokens(n, i), 0, False) for i, n in enumerate(lengths)]
        self.prefill(chunks)
        self.prefill([PrefillChunk(-1, tokens(lengths[0]), lengths[0], True)])
        self.prefill([PrefillChunk(-100, tokens(lengths[-1]), 0, True)])
        for size in batch_sizes:
            self.prefill([PrefillChunk(-2, tokens(lengths[0]), 0, False)])
            self.join(-2, size)
            for step in range(2):
                self.decode(tokens(size, step))
            self.keep([])
        self.reset()
