"""The engine: one per process, owning the model, the tokenizer, a worker thread and its queue.

Requests are scheduled with continuous batching (iteration-level scheduling, Yu et al. 2022,
"Orca"): every loop of the worker runs one prefill pass (several short prompts together, or one
chunk of a long one), then one decode step for every running sequence of the model.  New
sequences join the running batch after their prefill; finished and aborted ones leave it before
the next step.  The running batch's ``past_key_values`` are one left-padded cache
(:class:`~inference.kv_cache.BatchKVCache`): joining pads the shorter side on the left, leaving
selects rows and trims columns that are padding in every row.

transformers' own continuous batching (``generation/continuous_batching``) was the first choice;
it takes per-request temperature, top-k and top-p only (no per-request ``logit_bias``,
penalties, seeded generators, top logprobs or stop strings), so the engine schedules itself.

Torch runs only in the worker thread.  The asyncio side calls :meth:`Engine.submit`, which returns
a :class:`RequestStream` (an async iterator of :class:`RequestOutput`) fed from the worker with
``loop.call_soon_threadsafe``.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from . import memory, sampling, structured
from .kv_cache import BatchKVCache
from .model_loader import ModelConfig, load_model, model_fingerprint
from .outputs import (  # noqa: F401  (re-exported: the engine's API)
    CompletionOutput,
    EngineError,
    EngineNotReady,
    EngineOverloaded,
    RequestOutput,
    TokenLogprob,
)
from .sampling import SamplingParams
from .text import IncrementalDetokenizer, StopMatcher

logger = logging.getLogger(__name__)

FIM_TOKENS = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
IDLE_PREFILL_CHUNK = 2048
RATE_WINDOW_SECONDS = 10.0  # the window of stats()'s tokens_per_second


@dataclass(frozen=True)
class EngineConfig:
    """Limits and scheduling knobs; see settings.py for their environment variables."""

    max_batch_size: int = 32
    max_queue: int = 256
    prefill_chunk: int = 256
    num_threads: int = 0


class _Request:
    """A submitted request: its prompt, parameters, candidates, and the bridge to its event loop."""

    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        loop: asyncio.AbstractEventLoop,
        device: torch.device,
    ) -> None:
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.params = params
        self.loop = loop
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.prefilled = 0
        self.cache: BatchKVCache | None = None
        self.prompt_logprobs: list[TokenLogprob] | None = [TokenLogprob(prompt_ids[0], None)] if params.prompt_logprobs else None
        self.sequences: list[_Sequence] = []
        self.device = device
        self.bias_ids = torch.tensor(list(params.logit_bias), dtype=torch.long, device=device)
        self.bias_values = torch.tensor(list(params.logit_bias.values()), dtype=torch.float32, device=device)
        self.wants_logprobs = params.logprobs is not None or params.best_of > params.n

    def push(self, item: RequestOutput | BaseException) -> None:
        """Hand ``item`` to the request's event loop; never blocks the worker."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


class _Sequence:
    """One candidate of a request: its generated tokens, text, and sampling state."""

    def __init__(self, request: _Request, index: int, detokenizer: IncrementalDetokenizer) -> None:
        self.request = request
        self.index = index
        params = request.params
        self.generator: torch.Generator | None = None
        if not params.greedy:
            self.generator = torch.Generator(device=request.device)
            if params.seed is not None:
                self.generator.manual_seed(params.seed + index)
            else:
                self.generator.seed()
        self.detokenizer = detokenizer
        self.length = len(request.prompt_ids)  # tokens in the KV cache once joined
        self.next_token = -1  # sampled, not yet in the KV cache
        self.token_ids: list[int] = []
        self.texts: list[str] = []
        self.logprobs: list[TokenLogprob] = []
        self.text = ""
        self.stop_matcher = StopMatcher(request.params.stop)
        self.cut: int | None = None  # where a stop string begins, once found
        self.released_tokens = 0
        self.released_chars = 0
        self.cumulative_logprob = 0.0
        self.counts: torch.Tensor | None = None
        self.finish_reason: str | None = None
        # structured output: this candidate's own parser state (None: unconstrained)
        self.grammar = params.grammar.matcher() if params.grammar is not None else None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestStream:
    """The async iterator of one submitted request's :class:`RequestOutput` s.

    It ends after the output with ``finished`` set.  :meth:`abort` (or leaving the iteration
    early and calling it) removes the request's sequences from the batch before the next step.
    """

    def __init__(self, engine: Engine, request: _Request) -> None:
        self._engine = engine
        self._request = request
        self.finished = False

    @property
    def request_id(self) -> str:
        return self._request.request_id

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._request.queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    def abort(self) -> None:
        """Stop generating for this request; harmless once it has finished."""
        if not self.finished:
            self.finished = True
            self._engine.abort(self._request.request_id)


class Engine:
    """Owns the model and serves generation requests from one worker thread.

    Create it once per process and call :meth:`start`; :meth:`generate` and :meth:`abort` are
    called from the asyncio side.  ``ready`` turns true once the model is loaded.
    """

    def __init__(self, model_config: ModelConfig, config: EngineConfig | None = None) -> None:
        self.model_config = model_config
        self.config = config or EngineConfig()
        self.model_id = model_config.model_id
        self.ready = False
        self.load_error: BaseException | None = None
        self.created = int(time.time())
        self.model = None
        self.tokenizer = None
        self.device = torch.device("cpu")
        self.max_context = 0
        self.vocab_size = 0
        self.eos_token_ids: frozenset[int] = frozenset()
        self.system_fingerprint = ""
        self._lock = threading.Lock()
        self._wakeup = threading.Event()
        self._inbox: collections.deque[_Request] = collections.deque()
        self._aborted: set[str] = set()
        self._waiting: collections.deque[_Request] = collections.deque()
        self._running: list[_Sequence] = []
        self._cache: BatchKVCache | None = None
        self._mask: torch.Tensor | None = None  # [batch, width] 1 for real columns, 0 for padding
        self._recent_tokens: collections.deque[tuple[float, int]] = collections.deque()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._trimmed = False  # whether memory.trim() ran since the batch last emptied

    # --- the asyncio side ----------------------------------------------------------------------

    def start(self, model=None, tokenizer=None) -> None:
        """Start the worker thread, which loads the model (or takes the given one) and serves."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, args=(model, tokenizer), name="engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the worker to finish; running requests get an error."""
        self._stopping = True
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the model is loaded (or failed); returns ``ready``. For scripts and tests."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.ready and self.load_error is None:
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0.05)
        return self.ready

    def stats(self) -> dict:
        """Live figures: ``running`` and ``waiting`` requests, ``tokens_per_second`` over 10 s."""
        now = time.monotonic()
        with self._lock:
            tokens = sum(n for t, n in self._recent_tokens if now - t <= RATE_WINDOW_SECONDS)
            running = len({id(s.request) for s in self._running})
            waiting = len(self._waiting) + len(self._inbox)
        return {
            "running": running,
            "waiting": waiting,
            "tokens_per_second": round(tokens / RATE_WINDOW_SECONDS, 1),
        }

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as the model reads a prompt (the tokenizer's special tokens added)."""
        return self.tokenizer.encode(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``, special tokens skipped."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def fim_prompt_ids(self, prefix: str, suffix: str) -> list[int] | None:
        """Fill-in-the-middle prompt ids, ``<fim_prefix>prefix<fim_suffix>suffix<fim_middle>``
        (StarCoder's and CodeLlama's PSM order, Bavarian et al. 2022), or None when the tokenizer
        has no FIM tokens."""
        ids = [self._special_token_id(token) for token in FIM_TOKENS]
        if None in ids:
            return None
        fim_prefix, fim_suffix, fim_middle = ids
        encode = lambda text: self.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
        return [fim_prefix, *encode(prefix), fim_suffix, *encode(suffix), fim_middle]

    def _special_token_id(self, token: str) -> int | None:
        """The id of ``token`` if the vocabulary really has it (not mapped to the unknown token).

        The round trip tells: a missing token maps to the unknown token's id, which maps back to
        another token.  (``token`` may itself be the unknown token: SmolLM2's is ``<|endoftext|>``.)
        """
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        if token_id is None or self.tokenizer.convert_ids_to_tokens(token_id) != token:
            return None
        return token_id

    def compile_grammar(self, schema: dict | None) -> structured.CompiledGrammar:
        """The grammar of JSON valid against ``schema`` (None: any JSON object) for
        ``SamplingParams.grammar``; cached per schema.  Raises :class:`structured.GrammarError`
        for a schema the library cannot compile.  Blocking (milliseconds): call it in a thread."""
        return structured.compile_json_grammar(self.tokenizer, self.vocab_size, schema)

    @property
    def has_chat_template(self) -> bool:
        """Whether the tokenizer has a chat template (``/v1/chat/completions`` needs one)."""
        return bool(getattr(self.tokenizer, "chat_template", None))

    def chat_prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt of a chat: ``messages`` (``{"role", "content"}`` with roles system, user,
        assistant) through the tokenizer's chat template, with the assistant's generation prompt
        added.  Raises ``ValueError`` when the tokenizer has no template."""
        if not self.has_chat_template:
            raise ValueError(f"{self.model_id} has no chat template")
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        # The template writes its special tokens itself; adding the tokenizer's would double a BOS.
        return self.tokenizer.encode(text, add_special_tokens=False)

    def document_start_ids(self) -> list[int]:
        """The prompt for an empty prompt: the start of a new document, as OpenAI's default prompt
        ``<|endoftext|>`` is for GPT models."""
        tokenizer = self.tokenizer
        for token in ("<|endoftext|>", tokenizer.bos_token, tokenizer.eos_token):
            if token is not None and (token_id := self._special_token_id(token)) is not None:
                return [token_id]
        return [0]

    def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> RequestStream:
        """Queue ``params.best_of`` candidates for ``prompt_ids``; iterate the result for each step's outputs.

        Raises :class:`EngineNotReady` or :class:`EngineOverloaded` at once, so the caller can still
        answer with an HTTP error; iterating raises :class:`EngineError` if a step fails.  Must be
        called on the event loop that will iterate the stream.
        """
        if not self.ready:
            raise EngineNotReady("The model is loading; try again shortly.")
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        request = _Request(request_id, list(prompt_ids), params, asyncio.get_running_loop(), self.device)
        with self._lock:
            if len(self._waiting) + len(self._inbox) >= self.config.max_queue:
                raise EngineOverloaded(
                    f"The server is overloaded: {self.config.max_queue} requests are already waiting."
                )
            self._inbox.append(request)
        self._wakeup.set()
        return RequestStream(self, request)

    def abort(self, request_id: str) -> None:
        """Remove the request's sequences before the next step; harmless if it already finished."""
        with self._lock:
            self._aborted.add(request_id)
        self._wakeup.set()

    # --- the worker thread ---------------------------------------------------------------------

    def _run(self, model, tokenizer) -> None:
        try:
            if self.config.num_threads:
                torch.set_num_threads(self.config.num_threads)
            if model is None:
                model, tokenizer, self.device = load_model(self.model_config)
            else:
                self.device = next(model.parameters()).device
            self._install(model, tokenizer)
        except BaseException as error:  # noqa: BLE001 - reported through /healthz and the log
            logger.exception("The model failed to load")
            self.load_error = error
            return
        self.ready = True
        with torch.inference_mode():
            while not self._stopping:
                self._loop_once()
        self._fail_all(EngineError("The server is shutting down."))

    def _install(self, model, tokenizer) -> None:
        self.model = model
        self.tokenizer = tokenizer
        config = model.config.get_text_config(decoder=True)
        self.max_context = int(getattr(config, "max_position_embeddings", 0) or tokenizer.model_max_length)
        self.vocab_size = int(model.get_output_embeddings().out_features)
        eos = set()
        for source in (model.generation_config.eos_token_id, tokenizer.eos_token_id):
            if isinstance(source, int):
                eos.add(source)
            elif source:
                eos.update(source)
        document_end = self._special_token_id("<|endoftext|>")
        if document_end is not None:
            eos.add(document_end)  # the GPT-style document separator ends a text, as on OpenAI
        self.eos_token_ids = frozenset(eos)
        self.system_fingerprint = model_fingerprint(model)
        if not self.has_chat_template:
            logger.warning("%s has no chat template: /v1/chat/completions will refuse it", self.model_id)

    def _loop_once(self) -> None:
        self._take_inbox()
        if not self._running and not self._waiting:
            if not self._trimmed:  # the batch just emptied: its freed memory goes back to the system
                memory.trim()
                self._trimmed = True
            self._wakeup.wait(timeout=1.0)
            self._wakeup.clear()
            return
        self._trimmed = False
        try:
            if self._waiting and self._has_room_for(self._waiting[0]):
                self._prefill()
            if self._running:
                self._decode_step()
        except Exception as error:  # noqa: BLE001 - one bad step must not kill the engine
            logger.exception("An engine step failed; failing the requests in it")
            self._fail_all(EngineError(f"The engine failed while generating: {type(error).__name__}"))

    def _take_inbox(self) -> None:
        with self._lock:
            self._waiting.extend(self._inbox)
            self._inbox.clear()
            aborted, self._aborted = self._aborted, set()
        if not aborted:
            return
        self._waiting = collections.deque(r for r in self._waiting if r.request_id not in aborted)
        keep = [row for row, seq in enumerate(self._running) if seq.request.request_id not in aborted]
        if len(keep) != len(self._running):
            self._select_rows(keep)

    def _has_room_for(self, request: _Request) -> bool:
        # A request larger than the whole batch still runs, alone.
        return not self._running or len(self._running) + request.params.best_of <= self.config.max_batch_size

    def _prefill(self) -> None:
        """One prefill forward pass: a chunk of one long prompt, or several short prompts together.

        Short prompts (no ``prompt_logprobs``, at most ``prefill_chunk`` tokens together) waiting
        at the head of the queue share one left-padded forward pass, so a burst of new requests
        costs about one step instead of one step each.
        """
        head = self._waiting[0]
        if head.prefilled or head.prompt_logprobs is not None or len(head.prompt_ids) > self.config.prefill_chunk:
            self._prefill_chunk(head)
            return
        group: list[_Request] = []
        tokens = 0
        rows = len(self._running)
        for request in self._waiting:
            size = len(request.prompt_ids)
            if request.prompt_logprobs is not None or tokens + size > self.config.prefill_chunk:
                break
            if group and rows + request.params.best_of > self.config.max_batch_size:
                break
            group.append(request)
            tokens += size
            rows += request.params.best_of
        self._prefill_group(group)

    def _prefill_group(self, group: list[_Request]) -> None:
        """Prefill every prompt of ``group`` in one left-padded forward pass, then join the batch."""
        width = max(len(request.prompt_ids) for request in group)
        input_ids = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros(len(group), width, dtype=torch.long)
        for row, request in enumerate(group):
            size = len(request.prompt_ids)
            input_ids[row, width - size :] = torch.tensor(request.prompt_ids)
            mask[row, width - size :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        cache = BatchKVCache(self.model.config)
        output = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = output.logits[:, -1].float()  # [group, vocab]
        sources: list[int] = []
        sequences: list[_Sequence] = []
        for row, request in enumerate(group):
            alive = self._start_sequences(request, logits[row : row + 1])
            sources.extend([row] * len(alive))
            sequences.extend(alive)
        if sequences:
            self._join(cache, mask, sources, sequences)
        # Only now, so that a failure above still reaches these requests through _fail_all.
        for _ in group:
            self._waiting.popleft()

    def _prefill_chunk(self, request: _Request) -> None:
        """Run the next chunk of one request's prompt; after the last one, join the batch."""
        ids = request.prompt_ids
        start = request.prefilled
        # Chunks bound how long running streams wait for a prefill; with none running, one pass
        # (up to IDLE_PREFILL_CHUNK tokens) gives the shortest time to first token.
        # (Not with prompt_logprobs, whose logits for every position would make it a big pass.)
        busy = self._running or request.prompt_logprobs is not None
        chunk = self.config.prefill_chunk if busy else max(self.config.prefill_chunk, IDLE_PREFILL_CHUNK)
        end = min(len(ids), start + chunk)
        if request.cache is None:
            request.cache = BatchKVCache(self.model.config)
        output = self.model(
            input_ids=torch.tensor([ids[start:end]], device=self.device),
            position_ids=torch.arange(start, end, device=self.device)[None],
            cache=request.cache,
            use_cache=True,
            logits_to_keep=0 if request.prompt_logprobs is not None else 1,
        )
        request.prefilled = end
        logits = output.logits[0].float()  # [chunk or 1, vocab]
        if request.prompt_logprobs is not None:
            self._add_prompt_logprobs(request, logits, ids[start + 1 : end + 1])
        if end < len(ids):
            return
        alive = self._start_sequences(request, logits[-1:])
        cache, request.cache = request.cache, None
        if alive:
            mask = torch.ones(1, len(ids), dtype=torch.long, device=self.device)
            self._join(cache, mask, [0] * len(alive), alive)
        self._waiting.popleft()

    def _add_prompt_logprobs(self, request: _Request, logits: torch.Tensor, targets: list[int]) -> None:
        """Log-probabilities of each next prompt token under the raw distribution (no temperature)."""
        logprobs = torch.log_softmax(logits[: len(targets)], dim=-1)
        target = torch.tensor(targets, dtype=torch.long, device=logprobs.device)
        chosen = logprobs.gather(-1, target[:, None])[:, 0].tolist()
        k = request.params.logprobs or 0
        tops = sampling.top_logprobs(logprobs, k) if k else None
        for row, token_id in enumerate(targets):
            top = list(zip(tops[1][row].tolist(), tops[0][row].tolist())) if tops is not None else []
            request.prompt_logprobs.append(TokenLogprob(token_id, chosen[row], top))

    def _start_sequences(self, request: _Request, logits: torch.Tensor) -> list[_Sequence]:
        """Create the request's candidates and sample their first tokens from ``logits`` ``[1, vocab]``.

        Returns the candidates still running (the others finished on their first token).
        """
        params = request.params
        request.sequences = [
            _Sequence(request, index, IncrementalDetokenizer(self.tokenizer, request.prompt_ids))
            for index in range(params.best_of)
        ]
        if params.max_tokens == 0:  # a scoring request (echo with max_tokens 0): nothing to generate
            for seq in request.sequences:
                seq.finish_reason = "length"
        else:
            self._sample(request.sequences, logits.expand(len(request.sequences), -1).clone())
        self._publish(request.sequences)
        return [seq for seq in request.sequences if not seq.finished]

    def _join(self, cache: BatchKVCache, mask: torch.Tensor, sources: list[int], sequences: list[_Sequence]) -> None:
        """Append ``sequences`` to the running batch; sequence ``k`` takes row ``sources[k]`` of
        ``cache`` and of its ``mask`` ``[rows, width]``."""
        if self._cache is None:
            self._cache = BatchKVCache(self.model.config)
            self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        index = torch.tensor(sources, device=self.device)
        old_width, width = self._mask.shape[1], mask.shape[1]
        total = max(old_width, width)
        self._cache.join(cache, index)
        self._mask = torch.cat(
            [
                torch.nn.functional.pad(self._mask, (total - old_width, 0)),
                torch.nn.functional.pad(mask.index_select(0, index), (total - width, 0)),
            ]
        )
        self._running.extend(sequences)

    def _decode_step(self) -> None:
        """One forward pass for every running sequence, then sampling, then release and cleanup."""
        sequences = self._running
        input_ids = torch.tensor([[seq.next_token] for seq in sequences], device=self.device)
        position_ids = torch.tensor([[seq.length] for seq in sequences], device=self.device)
        mask = torch.cat([self._mask, torch.ones(len(sequences), 1, dtype=torch.long, device=self.device)], 1)
        output = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            cache=self._cache,
            use_cache=True,
        )
        self._mask = mask
        for seq in sequences:
            seq.length += 1
        self._sample(sequences, output.logits[:, -1, :].float())
        self._publish(sequences)
        keep = [row for row, seq in enumerate(sequences) if not seq.finished]
        if len(keep) != len(sequences):
            self._select_rows(keep)

    def _select_rows(self, keep: list[int]) -> None:
        """Keep only batch rows ``keep``; trim columns that are now padding in every row."""
        self._running = [self._running[row] for row in keep]
        if not keep:
            self._cache, self._mask = None, None
            return
        index = torch.tensor(keep, device=self.device)
        mask = self._mask.index_select(0, index)
        first = int((mask.sum(0) > 0).nonzero()[0])  # first column that some row still uses
        self._mask = mask[:, first:]
        self._cache.select(index, first)

    # --- sampling and text ---------------------------------------------------------------------

    def _sample(self, sequences: list[_Sequence], logits: torch.Tensor) -> None:
        """Pick each sequence's next token from its row of ``logits`` ``[batch, vocab]`` (float32)."""
        for row, seq in enumerate(sequences):
            request = seq.request
            params = request.params
            if params.logit_bias:
                sampling.apply_logit_bias(logits[row], request.bias_ids, request.bias_values)
            if seq.counts is not None:
                sampling.apply_penalties(logits[row], seq.counts, params.presence_penalty, params.frequency_penalty)
            if seq.grammar is not None:  # structured output: after bias and penalties, before sampling and logprobs
                seq.grammar.mask_logits(logits[row])
        temperature = torch.tensor(
            [0.0 if seq.request.params.greedy else seq.request.params.temperature for seq in sequences],
            device=logits.device,
        )
        sampling.apply_temperature(logits, temperature)
        wants = [row for row, seq in enumerate(sequences) if seq.request.wants_logprobs]
        logprobs = torch.log_softmax(logits[wants], dim=-1) if wants else None
        chosen = logits.argmax(dim=-1).tolist()
        sampled = [row for row, seq in enumerate(sequences) if not seq.request.params.greedy]
        if sampled:
            probs = torch.softmax(logits[sampled], dim=-1)
            top_p = torch.tensor([sequences[row].request.params.top_p for row in sampled], device=logits.device)
            if bool((top_p < 1.0).any()):
                probs = sampling.top_p_mask(probs, top_p)
            for position, row in enumerate(sampled):
                chosen[row] = sampling.sample_row(probs[position], sequences[row].generator)
        wants_row = {row: position for position, row in enumerate(wants)}
        for row, seq in enumerate(sequences):
            entry = None
            if row in wants_row:
                row_logprobs = logprobs[wants_row[row]]
                k = seq.request.params.logprobs or 0
                top: list[tuple[int, float]] = []
                if k:
                    values, ids = sampling.top_logprobs(row_logprobs, k)
                    top = list(zip(ids.tolist(), values.tolist()))
                entry = TokenLogprob(chosen[row], float(row_logprobs[chosen[row]]), top)
            self._append(seq, chosen[row], entry)

    def _append(self, seq: _Sequence, token_id: int, logprob: TokenLogprob | None) -> None:
        """Add a sampled token to ``seq``: text, stop strings, limits."""
        params = seq.request.params
        seq.next_token = token_id
        if logprob is not None and logprob.logprob is not None:
            seq.cumulative_logprob += logprob.logprob
        if token_id in self.eos_token_ids and not params.ignore_eos:
            seq.finish_reason = "stop"
            return
        grammar_complete = seq.grammar is not None and seq.grammar.accept(token_id)
        seq.token_ids.append(token_id)
        if params.needs_penalties:
            if seq.counts is None:
                seq.counts = torch.zeros(self.vocab_size, dtype=torch.float32, device=self.device)
            seq.counts[token_id] += 1
        piece = seq.detokenizer.add(token_id)
        seq.texts.append(piece)
        if logprob is not None:
            seq.logprobs.append(logprob)
        seq.text += piece
        if params.stop and piece:
            index = seq.stop_matcher.feed(piece)
            if index != -1:
                seq.cut = index
                seq.finish_reason = "stop"
                return
        if grammar_complete:  # the structured value is whole: only the end-of-sequence token could follow
            seq.finish_reason = "stop"
            return
        if len(seq.token_ids) >= params.max_tokens or seq.length + 1 >= self.max_context:
            seq.finish_reason = "length"

    def _release(self, seq: _Sequence) -> CompletionOutput | None:
        """The tokens and text of ``seq`` that can be shown now, or None if nothing changed.

        While running, a tail of text that could still become a stop string is held back, and
        tokens are released whole (a token whose bytes end mid-character waits for the token that
        completes the character).  At a stop string, tokens that begin before it are released,
        the last one cut short where the stop string begins.
        """
        if seq.cut is not None:
            end = seq.cut
        elif seq.finished:
            end = len(seq.text)
        else:
            end = len(seq.text) - seq.stop_matcher.holdback
        position = seq.released_chars
        first = seq.released_tokens
        texts: list[str] = []
        for piece in seq.texts[first:]:
            if seq.cut is not None:
                if position >= end:
                    break
                piece = piece[: end - position]
            elif position + len(piece) > end:
                break
            texts.append(piece)
            position += len(piece)
        if not seq.finished:
            while texts and not texts[-1]:
                texts.pop()
        if not texts and not seq.finished:
            return None
        last = first + len(texts)
        seq.released_tokens, seq.released_chars = last, position
        return CompletionOutput(
            index=seq.index,
            text="".join(texts),
            token_ids=seq.token_ids[first:last],
            texts=texts,
            logprobs=seq.logprobs[first:last] if seq.request.params.logprobs is not None else None,
            finish_reason=seq.finish_reason,
            num_tokens=last,
            cumulative_logprob=seq.cumulative_logprob,
        )

    def _publish(self, sequences: list[_Sequence]) -> None:
        """Send each request its sequences' released outputs for this step."""
        by_request: dict[int, tuple[_Request, list[CompletionOutput]]] = {}
        for seq in sequences:
            output = self._release(seq)
            if output is not None:
                by_request.setdefault(id(seq.request), (seq.request, []))[1].append(output)
        now = time.monotonic()
        with self._lock:
            self._recent_tokens.append((now, len(sequences)))  # one token sampled per sequence
            while self._recent_tokens and now - self._recent_tokens[0][0] > RATE_WINDOW_SECONDS:
                self._recent_tokens.popleft()
        for request, outputs in by_request.values():
            prompt_logprobs, request.prompt_logprobs = request.prompt_logprobs, None
            finished = all(seq.finished for seq in request.sequences)
            request.push(RequestOutput(request.request_id, outputs, prompt_logprobs, finished))

    def _fail_all(self, error: EngineError) -> None:
        """Fail every running and waiting request with ``error`` and reset the batch."""
        requests = {id(seq.request): seq.request for seq in self._running}
        requests.update({id(r): r for r in self._waiting})
        with self._lock:
            requests.update({id(r): r for r in self._inbox})
            self._inbox.clear()
        for request in requests.values():
            request.push(error)
        self._running, self._cache, self._mask = [], None, None
        self._waiting.clear()

