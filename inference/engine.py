"""The engine: one per process, owning the model, the tokenizer, a worker thread and its queue.

Requests are scheduled with continuous batching (iteration-level scheduling, Yu et al. 2022,
"Orca"): every loop of the worker runs one prefill call (the prompt chunks the scheduler picks,
API requests taking turns), then one decode step for every running sequence of the model.  New
sequences join the running batch after their prefill; finished and aborted ones leave it before
the next step.  The engine wires vLLM's seams together: :mod:`inference.scheduler` decides who
runs this step, :mod:`inference.model_runner` owns the forward pass and the KV caches,
:mod:`inference.output_processor` turns sampled tokens into text, stop strings and logprobs,
and :mod:`inference.sequence` holds the request and sequence state they share.

transformers' own continuous batching (``generation/continuous_batching``) was the first choice;
it takes per-request temperature, top-k and top-p only (no per-request ``logit_bias``,
penalties, seeded generators, top logprobs or stop strings), so the engine schedules itself.

Torch runs only in the worker thread.  The asyncio side calls :meth:`Engine.submit`, which returns
a :class:`RequestStream` (an async iterator of :class:`RequestOutput`) fed from the worker with
``loop.call_soon_threadsafe``.

The worker updates the Prometheus metrics of :mod:`inference.metrics` (vLLM's names), labelled
with its model's id (``model_name``), once per step and once per request, never per token.  A
process serving several models (:mod:`inference.registry`) has one engine per model, each with its
own worker thread, queue, KV cache and metrics.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from . import chat_template, cpu_kernels, memory, sampling, structured
from . import metrics as m
from .formats.gguf import ModelFileError
from .model_loader import GGUFCheckpoint, ModelConfig, embedded_gguf_path, load_model, model_fingerprint
from .model_runner import ModelRunner, PrefillChunk, build_runner
from .output_processor import OutputProcessor
from .outputs import (  # noqa: F401  (re-exported: the engine's API)
    ChatTemplateError,
    CompletionOutput,
    EngineError,
    EngineNotReady,
    EngineOverloaded,
    EngineShuttingDown,
    RequestOutput,
    TokenLogprob,
)
from .sampling import SamplingParams
from .scheduler import Scheduler
from .sequence import Request, SequenceState, push_all
from .thread_budget import ThreadBudget

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

FIM_TOKENS = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
RATE_WINDOW_SECONDS = 10.0  # the window of stats()'s tokens_per_second
# The worker takes the GIL back from the event loop after every kernel call, at worst after one
# switch interval: a short one keeps decode steps short (docs/performance.md#threads-and-busy-neighbours).
GIL_SWITCH_INTERVAL = 0.001
PYTHON_SWITCH_INTERVAL = 0.005  # CPython's default
# After this long with nothing to do the engine gives the batch's KV cache back (not at once: under
# many one-token requests the batch empties and fills again at every step).
IDLE_FREE_SECONDS = 0.5


@dataclass(frozen=True)
class EngineConfig:
    """Limits and scheduling knobs; see settings.py for their environment variables."""

    max_batch_size: int = 32
    max_queue: int = 256
    prefill_chunk: int = 256
    num_threads: int = (
        0  # 0: torch's count (one per core), one fewer while other work keeps one busy (thread_budget.py)
    )
    runner: str = "auto"  # auto | llama | transformers (inference.model_runner.build_runner)
    kv_cache_dtype: str = "auto"  # auto | float32 | float16 | bfloat16 (the Llama runner's KV cache)
    prefix_caching: str = "auto"  # auto | on | off (inference.prefix_cache; auto: off with MODEL_WEIGHTS=float32)
    prefix_cache_mb: int = 128  # the prefix cache's budget, shared with the running rows' positions
    activation_bits: int = 16  # what one-row Q4_1 products on the AVX2 code round x to: 32, 16 or 8 (cpu_kernels.set_activation_bits; the rest round to 16 under 8)
    k_quant_int8: bool = True  # K-quant products round x to 8 bits (cpu_kernels.set_k_quant_int8)
    max_context: int = 0  # 0: the model's context; else at most this many positions (prompt and completion)
    freeze_gc: bool = False  # once loaded, gc.freeze() what is alive (a serving process's choice; see Engine._run)
    exit_on_load_failure: bool = False  # a model that cannot load ends the process with status 1 (a server's choice)

    def configure_kernels(self) -> None:
        """Set the process's CPU kernels to this configuration's activation widths
        (:func:`inference.cpu_kernels.configure`): before a model loads, so that the load's timings
        run the products the engine will run."""
        cpu_kernels.configure(self.activation_bits, self.k_quant_int8)


class RequestStream:
    """The async iterator of one submitted request's :class:`RequestOutput` s.

    It ends after the output with ``finished`` set.  :meth:`abort` (or leaving the iteration
    early and calling it) removes the request's sequences from the batch before the next step.
    """

    def __init__(self, engine: Engine, request: Request) -> None:
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
        self.metrics = m.EngineMetrics(self.model_id)
        self.ready = False
        self.load_error: BaseException | None = None
        self.created = int(time.time())
        self.model: PreTrainedModel | GGUFCheckpoint | None = None
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self.device = torch.device("cpu")
        self.max_context = 0
        self.vocab_size = 0
        self.eos_token_ids: frozenset[int] = frozenset()
        self.system_fingerprint = ""
        self._lock = threading.Lock()
        self._wakeup = threading.Event()
        self._inbox: collections.deque[Request] = collections.deque()
        self._aborted: set[str] = set()
        self.scheduler = Scheduler(self.config.max_batch_size, self.config.prefill_chunk)
        self._running: list[SequenceState] = []
        self._first_in_decode: list[
            Request
        ] = []  # started by _join_reused: their first token comes from the next decode step
        self.runner: ModelRunner | None = None
        self._recent_tokens: collections.deque[tuple[float, int]] = collections.deque()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._trimmed = False  # whether the batch's memory went back since the engine last worked
        self._thread_budget: ThreadBudget | None = None  # set in the worker thread, when ENGINE_NUM_THREADS is auto

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's tokenizer; raises :class:`EngineNotReady` before the model has loaded."""
        if self._tokenizer is None:
            raise EngineNotReady("The model is loading; try again shortly.")
        return self._tokenizer

    @property
    def _loaded_runner(self) -> ModelRunner:
        """The model runner, for the worker's steps, which run only once :meth:`_install` built it."""
        assert self.runner is not None, "the worker steps before the model is installed"
        return self.runner

    # --- the asyncio side ----------------------------------------------------------------------

    def start(self, model=None, tokenizer=None) -> None:
        """Start the worker thread, which loads the model (or takes the given one) and serves.

        Also shortens the process's GIL switch interval to :data:`GIL_SWITCH_INTERVAL` where it is
        still CPython's default (see there)."""
        if self._thread is not None:
            return
        if sys.getswitchinterval() == PYTHON_SWITCH_INTERVAL:
            sys.setswitchinterval(GIL_SWITCH_INTERVAL)
        self._thread = threading.Thread(
            target=self._run, args=(model, tokenizer), name=f"engine {self.model_id}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 30) -> None:
        """Ask the worker to finish and wait up to ``timeout`` s; running and waiting requests get
        :class:`EngineShuttingDown` (a 503, or an in-band error in a stream), later submits too."""
        self._stopping = True
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

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
            waiting = len(self.scheduler) + len(self._inbox)
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
        if not isinstance(token_id, int) or self.tokenizer.convert_ids_to_tokens(token_id) != token:
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
        return bool(getattr(self._tokenizer, "chat_template", None))

    def chat_prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt of a chat: ``messages`` (``{"role", "content"}`` with roles system, user,
        assistant) through the tokenizer's chat template, with the assistant's generation prompt
        added; the contents are text, never special tokens (:mod:`inference.chat_template`).
        Raises ``ValueError`` when the tokenizer has no template, :class:`ChatTemplateError` when
        the template refuses the messages."""
        from jinja2 import TemplateError

        if not self.has_chat_template:
            raise ValueError(f"{self.model_id} has no chat template")
        try:
            return chat_template.chat_prompt_ids(self.tokenizer, messages)
        except TemplateError as error:
            raise ChatTemplateError(str(error)) from error

    def document_start_ids(self) -> list[int]:
        """The prompt for an empty prompt: the start of a new document, as OpenAI's default prompt
        ``<|endoftext|>`` is for GPT models."""
        tokenizer = self.tokenizer
        for token in ("<|endoftext|>", tokenizer.bos_token, tokenizer.eos_token):
            if token is not None and (token_id := self._special_token_id(token)) is not None:
                return [token_id]
        return [0]

    def submit(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, group: str | None = None
    ) -> RequestStream:
        """Queue ``params.best_of`` candidates for ``prompt_ids``; iterate the result for each step's outputs.

        ``group`` names the API request the prompt belongs to (default: ``request_id``): prefill
        turns are shared between groups, so one request of many prompts cannot hold up the first
        token of the requests behind it (:class:`~inference.scheduler.Scheduler`).

        Raises :class:`EngineNotReady`, :class:`EngineOverloaded` or :class:`EngineShuttingDown` at once, so the caller can still
        answer with an HTTP error; iterating raises :class:`EngineError` if a step fails.  Must be
        called on the event loop that will iterate the stream.
        """
        return self.submit_many([(request_id, prompt_ids)], params, group)[0]

    def submit_many(
        self, prompts: Sequence[tuple[str, list[int]]], params: SamplingParams, group: str | None = None
    ) -> list[RequestStream]:
        """:meth:`submit` for several ``(request_id, prompt_ids)`` at once (one API request's
        prompts): all or none are queued, and the worker sees them together, so on an idle engine
        they are prefilled in one pass and decode in one batch from their first step, whatever the
        timing (the same request then meets the same batches, which the deterministic mode needs).
        Raises as :meth:`submit` does, for all of them."""
        if not self.ready:
            raise EngineNotReady("The model is loading; try again shortly.")
        if any(not prompt_ids for _, prompt_ids in prompts):
            raise ValueError("prompt_ids must not be empty")
        loop = asyncio.get_running_loop()
        requests = [Request(request_id, list(ids), params, loop, self.device, group) for request_id, ids in prompts]
        with self._lock:
            if self._stopping:  # checked under the lock that _fail_all empties the inbox under
                raise EngineShuttingDown("The server is shutting down; retry the request.")
            if len(self.scheduler) + len(self._inbox) + len(requests) > self.config.max_queue:
                raise EngineOverloaded(
                    f"The server is overloaded: {self.config.max_queue} requests are already waiting."
                )
            self._inbox.extend(requests)
        self._wakeup.set()
        return [RequestStream(self, request) for request in requests]

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
            self.config.configure_kernels()
            loaded = model is None  # loaded here: nobody else uses the transformers model's layers
            if loaded:
                model, tokenizer, self.device = load_model(self.model_config, self.config.runner)
            else:
                self.device = next(model.parameters()).device
            self._install(model, tokenizer, loaded)
            # Before ready: the first request after /healthz says 200 finds kernels chosen and
            # buffers grown, and is as fast as later ones.
            started = time.perf_counter()
            with torch.inference_mode():
                self._loaded_runner.warm_up()
            logger.info(
                "Model runner of %s: %s; warmed up in %.1f s",
                self.model_id,
                self._loaded_runner.description,
                time.perf_counter() - started,
            )
        except BaseException as error:  # reported through /healthz and the log
            if isinstance(error, ModelFileError):  # its message names the file and the problem: no traceback
                logger.error("The model %s failed to load: %s", self.model_id, error)
            else:
                logger.exception("The model %s failed to load", self.model_id)
            self.load_error = error
            if self.config.exit_on_load_failure:
                # As vLLM and llama-server do: make run shows it, a process manager sees it; a 503 for ever helps no one.
                logger.critical("Exiting: the model %s cannot load: %s", self.model_id, error)
                logging.shutdown()
                os._exit(1)
            return
        # Not in the deterministic mode (float32 weights): a product's last bits may depend on its thread count.
        if not self.config.num_threads and self.model_config.weights != "float32" and self.device.type == "cpu":
            self._thread_budget = ThreadBudget(torch.get_num_threads())
        if self.config.freeze_gc:
            # What is alive now lives as long as the process: frozen, full collections no longer walk
            # it while holding the GIL (docs/performance.md#the-engines-worker-thread).
            gc.collect()
            gc.freeze()
        self.ready = True
        logger.info("Ready: %s answers requests", self.model_id)  # /healthz: 200 once every model is
        try:
            with torch.inference_mode():
                while not self._stopping:
                    self._loop_once()
        except BaseException as error:  # a dead worker must not leave /healthz at 200
            logger.exception("The engine's worker thread failed; the engine serves no more requests")
            self.ready, self.load_error, self._stopping = False, error, True
            self._fail_all(EngineError(f"The engine failed: {type(error).__name__}"))
            return
        self._fail_all(EngineShuttingDown("The server is shutting down."))

    def _install(self, model, tokenizer, loaded: bool = False) -> None:
        self.model = model
        self._tokenizer = tokenizer
        gguf = None if self.model_config.path else embedded_gguf_path()  # its Q4_1 blocks make int4 weights
        self.runner = build_runner(
            model,
            self.config.runner,
            self.config.max_batch_size,
            weights=self.model_config.weights,
            cache_dir=Path(self.model_config.cache_dir),
            gguf=gguf,
            drop_model_layers=loaded,
            kv_cache_dtype=self.config.kv_cache_dtype,
            prefix_caching=self.config.prefix_caching,
            prefix_cache_bytes=self.config.prefix_cache_mb << 20,
        )
        model_context = self.runner.max_context or int(tokenizer.model_max_length)
        self.max_context = min(model_context, self.config.max_context) if self.config.max_context else model_context
        self.vocab_size = self.runner.vocab_size
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
        # Names the build and the weight formats it runs in: a new conversion or another format changes it.
        self.system_fingerprint = model_fingerprint(model, self.runner.weight_formats)
        if not self.has_chat_template:
            logger.warning("%s has no chat template: /v1/chat/completions will refuse it", self.model_id)
        self.output_processor = OutputProcessor(
            tokenizer, self.eos_token_ids, self.vocab_size, self.max_context, self.device
        )

    def _loop_once(self) -> None:
        self._take_inbox()
        if self._thread_budget is not None and (threads := self._thread_budget.update()) is not None:
            logger.debug(
                "Engine threads: %d (other work used %.2f of a core, the process's other Python threads %.2f)",
                threads,
                self._thread_budget.share,
                self._thread_budget.threads_share,
            )
            torch.set_num_threads(threads)
        if not self._running and not len(self.scheduler):
            self._set_gauges()  # an abort may have emptied it: the gauges must not keep its last values
            woken = self._wakeup.wait(timeout=1.0 if self._trimmed else IDLE_FREE_SECONDS)
            self._wakeup.clear()
            if not woken and not self._trimmed:  # idle a while: the batch's memory goes back to the system
                self._loaded_runner.free_batch()
                memory.trim()
                self._trimmed = True
            return
        self._trimmed = False
        try:
            if len(self.scheduler):
                self._prefill()
            if self._running:
                self._decode_step()
        except Exception as error:  # one bad step must not kill the engine
            logger.exception("An engine step failed; failing the requests in it")
            self._fail_all(EngineError(f"The engine failed while generating: {type(error).__name__}"))
        self._set_gauges()

    def _set_gauges(self) -> None:
        """The metrics' gauges, once per loop: requests running and waiting, KV cache columns in use."""
        running = self._running
        self.metrics.requests_running.set(len({id(seq.request) for seq in running}))
        self.metrics.requests_waiting.set(len(self.scheduler) + len(self._inbox))
        self.metrics.kv_cache_columns.set(sum(seq.length for seq in running))

    def _take_inbox(self) -> None:
        with self._lock:
            arrived = list(self._inbox)
            self._inbox.clear()
            aborted, self._aborted = self._aborted, set()
        waiting = []
        for request in arrived:
            if request.prompt_logprobs is None:  # those need every position's logits
                self.metrics.prefix_cache_queries.inc(len(request.prompt_ids))
                self._reuse_prefix(request)
                if self._join_reused(request):
                    continue
            waiting.append(request)
        self.scheduler.add(waiting)
        if not aborted:
            return
        removed = self.scheduler.remove(aborted)
        for request in removed:
            self._loaded_runner.release(request.key)  # its partial prefill, if any
        keep = [row for row, seq in enumerate(self._running) if seq.request.request_id not in aborted]
        stopped = {seq.request.request_id for seq in self._running if seq.request.request_id in aborted}
        self.metrics.finished("abort", len(removed) + len(stopped))
        if len(keep) != len(self._running):
            self._select_rows(keep)
        self._first_in_decode = [r for r in self._first_in_decode if r.request_id not in aborted]

    def _reuse_prefix(self, request: Request) -> None:
        """Take the runner's longest cached prefix of a not yet prefilled request's prompt (prefix
        caching), noting which stored prompts it has seen (``runner.prefix_epoch``)."""
        request.prefix_epoch = self._loaded_runner.prefix_epoch
        request.prefilled = request.cached_tokens = self._loaded_runner.reuse_prefix(request.key, request.prompt_ids)
        self.metrics.prefix_cache_hits.inc(request.cached_tokens)

    def _look_again(self) -> None:
        """Waiting requests not yet started look in the prefix cache again when it stored prompts
        since they last looked (many requests sharing a prefix that arrive together: the first one's
        prompt is stored once it is prefilled, and the others then reuse it)."""
        epoch = self._loaded_runner.prefix_epoch
        for request in self.scheduler:
            if request.prefilled == 0 and request.prompt_logprobs is None and request.prefix_epoch != epoch:
                self._reuse_prefix(request)

    def _join_reused(self, request: Request) -> bool:
        """Start a request whose prompt is cached but for its last token straight in the running
        batch, if its candidates fit: the next decode step feeds them that token and samples their
        first tokens from its logits, as a prefill pass would, without one (a prefill pass costs
        one Python-level operation per layer and chunk; the decode step is one kernel call).
        Returns whether it did."""
        params = request.params
        if not request.cached_tokens or request.cached_tokens != len(request.prompt_ids) - 1 or not params.max_tokens:
            return False
        if self._running and len(self._running) + request.rows > self.config.max_batch_size:
            return False
        self.metrics.request_queue_time.observe(time.monotonic() - request.arrival)
        self.metrics.prompt_tokens.inc(1)
        sequences = self.output_processor.new_sequences(request)
        for seq in sequences:
            seq.length = request.cached_tokens
            seq.next_token = request.prompt_ids[-1]
        self._loaded_runner.join(request.key, len(sequences))
        request.prefilled = len(request.prompt_ids)
        self._running.extend(sequences)
        self._first_in_decode.append(request)
        return True

    def _prefill(self) -> None:
        """Run the scheduler's prefill chunks in one runner call; requests whose prompt is then
        complete start their candidates and join the batch."""
        self._look_again()
        scheduled = self.scheduler.schedule(len(self._running))
        if not scheduled:
            return
        started = time.monotonic()
        chunks = [
            PrefillChunk(
                item.request.key,
                item.request.prompt_ids[item.start : item.end],
                item.start,
                item.request.prompt_logprobs is not None,
            )
            for item in scheduled
        ]
        for item in scheduled:
            if item.start == item.request.cached_tokens:
                self.metrics.request_queue_time.observe(started - item.request.arrival)
        self.metrics.prompt_tokens.inc(sum(item.end - item.start for item in scheduled))
        prompts_done: list[tuple[Request, int]] = []
        for item, logits in zip(scheduled, self._loaded_runner.prefill(chunks)):
            request = item.request
            request.prefilled = item.end
            if request.prompt_logprobs is not None:
                self.output_processor.add_prompt_logprobs(
                    request, logits, request.prompt_ids[item.start + 1 : item.end + 1]
                )
            if not item.final:
                continue
            alive = self._start_sequences(request, logits[-1:])
            self._running.extend(alive)
            prompts_done.append((request, len(alive)))
        self.scheduler.finish_prefills()
        self.metrics.prefill_step_duration.observe(time.monotonic() - started)
        # Published only now: a client that has its first token finds its request counted as
        # running, not waiting, by the queue limit and /healthz, and the step in the metrics.
        for request, _ in prompts_done:
            self._publish(request.sequences)
        # Then the prompts' caches join the running batch, in the order of _running, before the
        # next decode step on this thread: a join that grows the batch's cache (zero-filled buffers
        # for several rows) delays the second token, not the first.
        for request, copies in prompts_done:
            self._loaded_runner.join(request.key, copies)

    def _start_sequences(self, request: Request, logits: torch.Tensor) -> list[SequenceState]:
        """Create the request's candidates and sample their first tokens from ``logits`` ``[1, vocab]``.

        Returns the candidates still running (the others finished on their first token).
        """
        sequences = self.output_processor.new_sequences(request)
        if request.params.max_tokens:
            self._sample(sequences, logits.expand(len(sequences), -1).clone())
            _observe_first_token(self.metrics, request, time.monotonic())
        return [seq for seq in request.sequences if not seq.finished]

    def _decode_step(self) -> None:
        """One forward pass for every running sequence, then sampling, then release and cleanup."""
        started = time.monotonic()
        sequences = self._running
        logits = self._loaded_runner.decode([seq.next_token for seq in sequences])
        for seq in sequences:
            seq.length += 1
        self._sample(sequences, logits)
        now = time.monotonic()
        for request in self._first_in_decode:
            _observe_first_token(self.metrics, request, now)
        self._first_in_decode.clear()
        # Observed before publishing, so that a client who has its tokens finds the step counted.
        self.metrics.decode_step_duration.observe(time.monotonic() - started)
        self._publish(sequences)
        keep = [row for row, seq in enumerate(sequences) if not seq.finished]
        if len(keep) != len(sequences):
            self._select_rows(keep)

    def _select_rows(self, keep: list[int]) -> None:
        """Keep only batch rows ``keep`` (finished and aborted sequences leave)."""
        self._running = [self._running[row] for row in keep]
        self._loaded_runner.keep(keep)

    # --- sampling and text ---------------------------------------------------------------------

    def _sample(self, sequences: list[SequenceState], logits: torch.Tensor) -> None:
        """Pick each sequence's next token from its row of ``logits`` ``[batch, vocab]`` (float32)."""
        for seq, (token_id, logprob) in zip(sequences, sampling.sample(sequences, logits)):
            self.output_processor.append(seq, token_id, logprob)
        self.metrics.generation_tokens.inc(len(sequences))

    def _publish(self, sequences: list[SequenceState]) -> None:
        """Send each request its sequences' released outputs for this step."""
        results = self.output_processor.outputs(sequences)
        now = time.monotonic()
        with self._lock:
            self._recent_tokens.append((now, len(sequences)))  # one token sampled per sequence
            while self._recent_tokens and now - self._recent_tokens[0][0] > RATE_WINDOW_SECONDS:
                self._recent_tokens.popleft()
        for request, output in results:
            if output.finished:  # counted before the client can see the end and read /metrics
                _observe_finished(self.metrics, request, now)
        push_all(results)

    def _fail_all(self, error: EngineError) -> None:
        """Fail every running and waiting request with ``error`` and reset the batch."""
        requests = {id(seq.request): seq.request for seq in self._running}
        requests.update({id(r): r for r in self.scheduler.clear()})
        with self._lock:
            requests.update({id(r): r for r in self._inbox})
            self._inbox.clear()
        self.metrics.finished("error", len(requests))  # counted before the clients can see the failure
        for request in requests.values():
            request.push(error)
        self._running = []
        self._first_in_decode.clear()
        if self.runner is not None:
            self.runner.reset()


def _observe_first_token(metrics: m.EngineMetrics, request: Request, now: float) -> None:
    """Note that ``request`` sampled its first token at ``now`` (time to first token)."""
    request.first_token_at = now
    metrics.time_to_first_token.observe(now - request.arrival)


def _observe_finished(metrics: m.EngineMetrics, request: Request, now: float) -> None:
    """A finished request's metrics: end-to-end latency, time per output token, its finish reason."""
    metrics.e2e_request_latency.observe(now - request.arrival)
    tokens = max((len(seq.token_ids) for seq in request.sequences), default=0)
    if request.first_token_at is not None and tokens > 1:
        metrics.time_per_output_token.observe((now - request.first_token_at) / (tokens - 1))
    # Once per request, as vLLM counts: the first candidate's reason stands for the request's.
    metrics.finished(request.sequences[0].finish_reason if request.sequences else None)
