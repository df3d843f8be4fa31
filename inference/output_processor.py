"""The output processor: sampled token ids to text, stop strings, finish reasons and logprobs.

It turns each step's sampled tokens into what a request may show now (vLLM v1's
``vllm/v1/engine/output_processor.py`` plays this part there): the incremental detokenizer's
text pieces, stop strings found on that text, the ``length`` limits, and the prompt's and the
completion's log-probabilities.  It runs no model and schedules nothing, so it can be tested
with a tokenizer and hand-made logits.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from . import cpu_kernels, sampling
from .outputs import CompletionOutput, RequestOutput, TokenLogprob
from .sequence import Request, SequenceState
from .text import IncrementalDetokenizer


class OutputProcessor:
    """Text and finish state of the engine's sequences.

    ``eos_token_ids`` end a sequence (``"stop"``) unless it ignores them; ``vocab_size`` sizes the
    penalty counts; a sequence reaching ``max_context`` tokens ends with ``"length"``.
    """

    def __init__(
        self, tokenizer, eos_token_ids: Iterable[int], vocab_size: int, max_context: int, device: torch.device
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.device = device

    def new_sequences(self, request: Request) -> list[SequenceState]:
        """Create the request's ``best_of`` candidates (none has a token yet).

        A scoring request (``max_tokens`` 0, as ``echo`` with ``logprobs`` sends it) has nothing to
        generate: its candidates finish at once with ``"length"``.
        """
        request.sequences = [
            SequenceState(request, index, IncrementalDetokenizer(self.tokenizer, request.prompt_ids))
            for index in range(request.params.best_of)
        ]
        if request.params.max_tokens == 0:
            for seq in request.sequences:
                seq.finish_reason = "length"
        return request.sequences

    def add_prompt_logprobs(self, request: Request, logits: torch.Tensor, targets: list[int]) -> None:
        """Append the log-probabilities of ``targets`` (each prompt token after the chunk's positions)
        under the raw distribution (no temperature, bias or penalty, as OpenAI's echo reports them).

        ``logits``: float32 ``[positions, vocab]``, row ``k`` predicting ``targets[k]``; rows past
        ``len(targets)`` (the prompt's last position, which predicts the first generated token) are ignored.
        """
        logits = logits[: len(targets)]
        target = torch.tensor(targets, dtype=torch.long, device=logits.device)
        k = request.params.logprobs or 0
        kernels = cpu_kernels.loaded()
        if kernels is not None and k <= 1 and cpu_kernels.prompt_logprobs_takes(logits):
            # What lm-evaluation-harness asks (logprobs 1): without log_softmax's [positions, vocab] copy.
            chosen_values, best_ids, best_values = kernels.prompt_logprobs(logits, target)
            tops = (best_values[:, None], best_ids[:, None]) if k else None
        else:
            logprobs = torch.log_softmax(logits, dim=-1)
            chosen_values = logprobs.gather(-1, target[:, None])[:, 0]
            tops = sampling.top_logprobs(logprobs, k) if k else None
        chosen = chosen_values.tolist()
        top_ids, top_values = (tops[1].tolist(), tops[0].tolist()) if tops is not None else ([], [])
        collected = request.prompt_logprobs
        assert collected is not None, "called for a request that asked for no prompt logprobs"
        for row, token_id in enumerate(targets):
            top = list(zip(top_ids[row], top_values[row])) if tops is not None else []
            collected.append(TokenLogprob(token_id, chosen[row], top))

    def append(self, seq: SequenceState, token_id: int, logprob: TokenLogprob | None) -> None:
        """Add a sampled token to ``seq``: text, stop strings, limits.

        The end-of-sequence token finishes the sequence (``"stop"``) and is not part of its text;
        a completed stop string finishes it too, remembering where the text is cut (``seq.cut``).
        """
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
        seq.chars += len(piece)
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

    def release(self, seq: SequenceState) -> CompletionOutput | None:
        """The tokens and text of ``seq`` that can be shown now, or None if nothing changed.

        While running, a tail of text that could still become a stop string is held back, and
        tokens are released whole (a token whose bytes end mid-character waits for the token that
        completes the character).  At a stop string, tokens that begin before it are released,
        the last one cut short where the stop string begins.
        """
        if seq.cut is not None:
            end = seq.cut
        elif seq.finished:
            end = seq.chars
        else:
            end = seq.chars - seq.stop_matcher.holdback
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

    def outputs(self, sequences: Iterable[SequenceState]) -> list[tuple[Request, RequestOutput]]:
        """Each request's :class:`RequestOutput` for this step (only requests whose sequences
        released something), in the order of ``sequences``.  A request's prompt logprobs go out
        once, with its first output."""
        by_request: dict[int, tuple[Request, list[CompletionOutput]]] = {}
        for seq in sequences:
            output = self.release(seq)
            if output is not None:
                by_request.setdefault(id(seq.request), (seq.request, []))[1].append(output)
        results = []
        for request, outputs in by_request.values():
            prompt_logprobs, request.prompt_logprobs = request.prompt_logprobs, None
            finished = all(seq.finished for seq in request.sequences)
            results.append((request, RequestOutput(request.request_id, outputs, prompt_logprobs, finished)))
        return results
