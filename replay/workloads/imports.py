"""``replayllm workload import``: public traces and this project's files as workload requests.

Formats (docs/workloads.md, "Importing"): ``azure`` (Azure LLM inference 2023 and 2024 CSV),
``burstgpt`` (v1 and v1.2 CSV), ``mooncake`` (JSONL with ``hash_ids``), ``sharegpt`` (JSON
conversations, tokenized with the Qwen vocabulary) and ``replayllm`` (this project's JSONL or
Parquet). ``ImportOptions`` selects a time window and a number of requests, scales time and
clips or drops long prompts; ``ImportCounts`` counts every request read and every one dropped
or changed, by reason, so nothing is lost silently.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from engine.errors import InvalidRequestError
from replay.workloads.fields import MAX_TOKENS_LIMIT, WorkloadFormatError, check_request
from replay.workloads.formats import FORMATS
from replay.workloads.import_options import (
    SALT_STRIDE,
    ImportCounts,
    ImportOptions,
    make_request,
)
from replay.workloads.recipe import PromptRecipe
from replay.workloads.request import Request

# A source yields, for a row it read but will not send, the reason (a str) in place of a
# request; ``select`` counts it as read and dropped for that reason (``Dropped``).
Dropped = str
BURSTGPT_FAILED = "failed request (Response tokens 0)"


def _lengths_rows(rows: Iterator[tuple[str, float, int, int]], options: ImportOptions,
                  failed: str | None = None) -> Iterator[tuple[str, float, Request | Dropped]]:
    """CSV rows as (where, trace seconds, request) with prompts unique to each row; with
    ``failed``, a row that generated nothing is that reason instead (BurstGPT marks a failed
    request by 0 response tokens; its ``without_fails`` files and vLLM's reader drop them)."""
    for number, (where, seconds, prompt_len, output_len) in enumerate(rows, 2):
        if failed is not None and output_len == 0:
            yield where, seconds, failed
            continue
        recipe = PromptRecipe((), 1, prompt_len, options.seed * SALT_STRIDE + number)
        yield where, seconds, make_request(recipe, output_len, options)


def trace_arrivals(rows: Iterator[tuple[str, float, Request | Dropped]]
                   ) -> Iterator[tuple[float, Request | Dropped]]:
    """A trace's (where, seconds, request) rows as (seconds after its first row, request).

    The one rule of every trace format's times: arrivals count from the first row (a trace of
    epoch times, or one whose first row is at 5 s, starts at once), and rows come in time order
    (equal times allowed): a row before the one above it is an error naming both."""
    first = previous = 0.0
    previous_where = ""
    for where, seconds, request in rows:
        if not previous_where:
            first = previous = seconds
        elif seconds < previous:
            raise WorkloadFormatError(
                f"{where}: arrives {previous - seconds:.6g} s before the row above it "
                f"({previous_where}): a trace's rows must be in time order (sort it first)")
        previous, previous_where = seconds, where
        yield seconds - first, request


def source(path: str | Path, fmt: str, options: ImportOptions
           ) -> Iterator[tuple[float | None, Request | Dropped]]:
    """(trace seconds or None for a later turn, request or why the row is dropped) of a file,
    in file order; a request's ``max_tokens`` may be 0 here (the trace generated nothing) and
    is fixed by ``select``."""
    if fmt == "azure":
        from replay.workloads.csv_sources import azure_rows

        return trace_arrivals(_lengths_rows(azure_rows(path), options))
    if fmt == "burstgpt":
        from replay.workloads.csv_sources import burstgpt_rows

        return trace_arrivals(_lengths_rows(burstgpt_rows(path), options, BURSTGPT_FAILED))
    if fmt == "mooncake":
        from replay.workloads.json_sources import mooncake_requests

        return trace_arrivals(mooncake_requests(path, options))
    if fmt == "sharegpt":
        from replay.workloads.json_sources import sharegpt_requests

        return sharegpt_requests(path, options)
    if fmt == "replayllm":
        from replay.workloads.store import read_workload

        return ((None if r.follows_previous_turn else r.arrival_s, r)
                for r in read_workload(path, options.ignore_unknown_fields))
    raise InvalidRequestError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")


def _fit_length(request: Request, options: ImportOptions, counts: ImportCounts) -> Request | None:
    """The request with its prompt within --max-prompt-len, and always within the format's
    MAX_TOKENS_LIMIT (a longer trace prompt is dropped or clipped by --over-length, counted)."""
    limit = min(options.max_prompt_len or MAX_TOKENS_LIMIT, MAX_TOKENS_LIMIT)
    length = request.prompt_len
    if length is None or length <= limit:
        return request
    if options.over_length == "drop":
        counts.drop(f"prompt over {limit} tokens")
        return None
    counts.change(f"prompt clipped to {limit} tokens")
    prompt = request.prompt
    clipped = prompt.clipped(limit) if isinstance(prompt, PromptRecipe) else prompt[:limit]
    return _replace(request, prompt=clipped)


def _replace(request: Request, **changes: object) -> Request:
    from dataclasses import replace

    return replace(request, **changes)  # type: ignore[arg-type]


def select(pairs: Iterator[tuple[float | None, Request | Dropped]], options: ImportOptions,
           counts: ImportCounts, name: str | Path = "the source") -> Iterator[Request]:
    """Apply the options to ``source``'s pairs, counting every request in ``counts``.

    A later turn follows its conversation's first turn: out of the window or dropped with it.
    Keeping no request at all is an error (``name`` is the source's, for its message)."""
    kept_conversations: set[str] = set()
    first_turns = 0
    span = (math.inf, -math.inf)  # first and last first-turn times read
    for seconds, request in pairs:
        counts.read += 1
        if isinstance(request, Dropped):
            counts.drop(request)
            continue
        conversation = request.conversation_id
        if request.follows_previous_turn:
            if conversation not in kept_conversations:
                counts.drop("later turn of a conversation not kept")
                continue
        else:
            assert seconds is not None
            span = (min(span[0], seconds), max(span[1], seconds))
            if not options.start_s <= seconds < options.end_s:
                counts.drop("outside the time window")
                continue
            if options.limit is not None and first_turns >= options.limit:
                counts.drop(f"beyond --limit {options.limit}")
                continue
            request = _replace(request, arrival_s=(seconds - options.start_s)
                               * options.time_scale)
        if not request.prompt_len and request.prompt_len is not None:
            counts.drop("empty prompt")
            kept_conversations.discard(conversation)  # type: ignore[arg-type]
            continue
        fitted = _fit_length(request, options, counts)
        if fitted is None:
            kept_conversations.discard(conversation)  # type: ignore[arg-type]
            continue
        if fitted.max_tokens < 1:
            counts.change("output length 0 raised to 1")
            fitted = _replace(fitted, max_tokens=1)
        if fitted.max_tokens > MAX_TOKENS_LIMIT:
            counts.change(f"output length clipped to {MAX_TOKENS_LIMIT}")
            fitted = _replace(fitted, max_tokens=MAX_TOKENS_LIMIT)
        _check_kept(fitted, seconds, options, f"{name}: request {counts.read}")
        if conversation is not None:
            kept_conversations.add(conversation)
        first_turns += not fitted.follows_previous_turn
        counts.kept += 1
        yield fitted
    if not counts.kept:
        raise WorkloadFormatError(_nothing_kept(name, options, counts, span))


def _check_kept(request: Request, seconds: float | None, options: ImportOptions,
                where: str) -> None:
    """Hold a kept request to the rule run, whatif and loadgen hold it to
    (``replay.workloads.fields.check_request``: arrivals and think times within a week), so no
    import writes a file they would refuse."""
    if seconds is not None and options.time_scale != 1:
        where = (f"--time-scale {options.time_scale:g} puts the request at {seconds:g} s of the "
                 f"trace at {request.arrival_s:g} s")
    elif seconds is not None:
        where = f"{where} (at {seconds:g} s of the trace)"
    try:
        check_request(request, where)
    except InvalidRequestError as exc:
        raise InvalidRequestError(f"{exc} (run and whatif would refuse it: --time-scale, --end "
                                  "or --limit keep the arrivals within it)") from None


def _nothing_kept(name: str | Path, options: ImportOptions, counts: ImportCounts,
                  span: tuple[float, float]) -> str:
    if not counts.read:
        return f"{name}: holds no requests (an empty file, or a header only)"
    message = f"{name}: the import keeps none of its requests ({counts.describe()})"
    if "outside the time window" in counts.dropped and span[0] <= span[1]:
        message += (f"; its first turns arrive from {span[0]:g} to {span[1]:g} s, the window "
                    f"is [{options.start_s:g}, {options.end_s:g}) s")
    return message


def import_workload(path: str | Path, fmt: str, options: ImportOptions,
                    counts: ImportCounts) -> Iterator[Request]:
    """The requests ``options`` keep from ``path`` in format ``fmt``, streaming."""
    return select(source(path, fmt, options), options, counts, path)
