"""``replayllm workload import``: public traces and this project's files as workload requests.

Formats (docs/workloads.md, "Importing"): ``azure`` (Azure LLM inference 2023 and 2024 CSV),
``burstgpt`` (v1 and v1.2 CSV), ``mooncake`` (JSONL with ``hash_ids``), ``sharegpt`` (JSON
conversations, tokenized with the Qwen vocabulary) and ``replayllm`` (this project's JSONL or
Parquet). ``ImportOptions`` selects a time window and a number of requests, scales time and
clips or drops long prompts; ``ImportCounts`` counts every request read and every one dropped
or changed, by reason, so nothing is lost silently. A source whose rows are in time order stops
reading where no later row can be kept (past ``--end``, or ``--limit`` first turns kept:
``Gate.closed``); ``ImportCounts.stopped`` says where, and the rows after it are neither
counted nor checked.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from engine.errors import InvalidRequestError
from replay.workloads.fields import MAX_TOKENS_LIMIT, WorkloadFormatError, check_request
from replay.workloads.formats import FORMATS, key
from replay.workloads.import_options import (
    LATER_TURN,
    OUTSIDE,
    SALT_STRIDE,
    Gate,
    ImportCounts,
    ImportOptions,
    make_request,
)
from replay.workloads.recipe import PromptRecipe
from replay.workloads.request import REFERENCE_TEMPERATURE, Request

# A source yields, for a row it read but will not send, the reason (a str) in place of a
# request; ``select`` counts it as read and dropped for that reason (``Dropped``).
Dropped = str
BURSTGPT_FAILED = "failed request (Response tokens 0)"
MODELS_SHOWN = 20  # models named when --filter-model matches none
# Options of some formats only (ImportOptions field, flag, its value when not given, the formats
# it applies to): given with another format, an error (``check_format_options``), not ignored.
TRACE_FORMATS = ("azure", "burstgpt", "mooncake", "sharegpt")  # the public traces read
FORMAT_OPTIONS: tuple[tuple[str, str, object, tuple[str, ...]], ...] = (
    ("rate", "--rate", None, ("sharegpt",)), ("model", "--model", None, ("sharegpt",)),
    ("filter_model", "--filter-model", None, ("burstgpt",)),
    ("block_size", "--block-size", None, ("mooncake",)),
    # the CSV columns are read by name, other columns ignored; ShareGPT reads its fields only
    ("ignore_unknown_fields", "--ignore-unknown-fields", False, ("mooncake", "replayllm")),
    # what an importer gives the requests it makes; a workload file's keep their own (these
    # were ignored with --format replayllm, while the header recorded them)
    ("temperature", "--temperature", REFERENCE_TEMPERATURE, TRACE_FORMATS),
    ("ignore_eos", "--no-ignore-eos", True, TRACE_FORMATS),
    ("seed", "--seed", 0, TRACE_FORMATS),
)


def _lengths_rows(rows: Iterator[tuple[str, float, int, int, str | None]],
                  options: ImportOptions, failed: str | None = None
                  ) -> Iterator[tuple[str, float, Request | Dropped]]:
    """CSV rows as (where, trace seconds, request) with prompts unique to each row; with
    ``failed``, a row that generated nothing is that reason instead (BurstGPT marks a failed
    request by 0 response tokens; its ``without_fails`` files and vLLM's reader drop them);
    a row of another model than ``options.filter_model`` too."""
    for number, (where, seconds, prompt_len, output_len, model) in enumerate(rows, 2):
        if model is not None and key(model) != key(options.filter_model or ""):
            yield where, seconds, f"Model not {options.filter_model.strip()}"  # type: ignore
            continue
        if failed is not None and output_len == 0:
            yield where, seconds, failed
            continue
        recipe = PromptRecipe((), 1, prompt_len, options.seed * SALT_STRIDE + number)
        yield where, seconds, make_request(recipe, output_len, options)


def _one_model(path: str | Path, rows: Iterator[tuple[str, float, int, int, str | None]],
               model: str) -> Iterator[tuple[str, float, int, int, str | None]]:
    """``rows`` as they are, then, if no row's Model is ``model`` (case and spaces ignored),
    the error naming the models present, with their rows (the first ``MODELS_SHOWN``)."""
    present: dict[str, int] = {}
    wanted, matched = key(model), False
    for row in rows:
        name = str(row[4])
        matched = matched or key(name) == wanted
        if name in present or len(present) < MODELS_SHOWN:
            present[name] = present.get(name, 0) + 1
        yield row
    if present and not matched:
        listed = ", ".join(f"{name} ({n:,} row{'s' if n != 1 else ''})"
                           for name, n in sorted(present.items()))
        raise WorkloadFormatError(f"{path}: no row has Model {model.strip()!r} (the models "
                                  f"present: {listed})")


def trace_arrivals(rows: Iterator[tuple[str, float, Request | Dropped]], gate: Gate | None = None
                   ) -> Iterator[tuple[float, Request | Dropped]]:
    """A trace's (where, seconds, request) rows as (seconds after its first row, request).

    The one rule of every trace format's times: arrivals count from the first row (a trace of
    epoch times, or one whose first row is at 5 s, starts at once), and rows come in time order
    (equal times allowed): a row before the one above it is an error naming both. With
    ``select``'s ``gate``, reading stops after the row where the gate is ``closed`` (every later
    row, arriving no earlier, would be dropped): the rows after it are not read, nor checked."""
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
        if gate is not None and (why := gate.closed(seconds - first)) is not None:
            gate.stop(where, why)
            _close(rows)
            return


def _close(rows: Iterator[object]) -> None:
    """Close a generator left unfinished (its file with it) now, not when it is collected."""
    close = getattr(rows, "close", None)
    if close is not None:
        close()


def _workload_pairs(path: str | Path, options: ImportOptions, gate: Gate | None
                    ) -> Iterator[tuple[float | None, Request]]:
    """A workload file's requests as (arrival or None for a later turn, request). Its rows need
    not be in time order and a conversation's turns may lie anywhere after its first: reading
    stops only where ``--limit`` first turns are kept and none of the kept requests belongs to
    a conversation (no later row can then be kept)."""
    from replay.workloads.store import read_workload

    requests = read_workload(path, options.ignore_unknown_fields)
    for number, request in enumerate(requests, 1):
        yield (None if request.follows_previous_turn else request.arrival_s), request
        if gate is not None and not gate.in_conversation and (why := gate.full()) is not None:
            gate.stop(f"request {number:,} of {path}", why)
            _close(requests)
            return


def check_format_options(fmt: str, given: set[str]) -> None:
    """The one rule of options that apply to some formats only: each flag in ``given`` that
    does not apply to ``fmt`` is an error (one line), never silently ignored."""
    for _, flag, _, owners in FORMAT_OPTIONS:
        if flag in given and fmt not in owners:
            listed = " and ".join([", ".join(owners[:-1]), owners[-1]] if len(owners) > 1
                                  else owners)
            # the request options an importer gives (a workload file's requests carry theirs)
            keep = fmt == "replayllm" and owners == TRACE_FORMATS
            raise InvalidRequestError(f"{flag} applies to --format {listed} only, not {fmt}"
                                      + (" (its requests keep their own)" if keep else ""))


def source(path: str | Path, fmt: str, options: ImportOptions, gate: Gate | None = None
           ) -> Iterator[tuple[float | None, Request | Dropped]]:
    """(trace seconds or None for a later turn, request or why the row is dropped) of a file,
    in file order; a request's ``max_tokens`` may be 0 here (the trace generated nothing) and
    is fixed by ``select``. ``gate``: ``select``'s, for sources that skip building what it
    drops and stop reading where it keeps nothing more (``trace_arrivals``)."""
    check_format_options(fmt, {flag for name, flag, unset, _ in FORMAT_OPTIONS
                               if getattr(options, name) != unset})
    if fmt == "azure":
        from replay.workloads.csv_sources import azure_rows

        return trace_arrivals(_lengths_rows(azure_rows(path), options), gate)
    if fmt == "burstgpt":
        from replay.workloads.csv_sources import burstgpt_rows

        rows = burstgpt_rows(path, model=options.filter_model is not None)
        if options.filter_model is not None:
            rows = _one_model(path, rows, options.filter_model)
        return trace_arrivals(_lengths_rows(rows, options, BURSTGPT_FAILED), gate)
    if fmt == "mooncake":
        from replay.workloads.json_sources import mooncake_requests

        return trace_arrivals(mooncake_requests(path, options), gate)
    if fmt == "sharegpt":
        from replay.workloads.json_sources import sharegpt_requests

        return sharegpt_requests(path, options, gate)
    if fmt == "replayllm":
        return _workload_pairs(path, options, gate)
    raise InvalidRequestError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")


def _fit_length(request: Request, options: ImportOptions, counts: ImportCounts,
                history: int = 0) -> Request | None:
    """The request with its prompt within --max-prompt-len, and always within the format's
    MAX_TOKENS_LIMIT (a longer trace prompt is dropped or clipped by --over-length, counted).

    ``history``: a later turn's tokens before its own (the previous turns' prompts and answers,
    at most their ``max_tokens``), which the prompt it is sent with begins with: the limit holds
    for the whole of it, so only ``limit - history`` new tokens fit (none: dropped either way)."""
    limit = min(options.max_prompt_len or MAX_TOKENS_LIMIT, MAX_TOKENS_LIMIT)
    length = request.prompt_len
    if length is None or history + length <= limit:
        return request
    room = limit - history
    if options.over_length == "drop" or room < 1:
        counts.drop(f"prompt over {limit} tokens" if not history
                    else f"prompt over {limit} tokens with its conversation's history")
        return None
    counts.change(f"prompt clipped to {limit} tokens" if not history
                  else f"prompt clipped to {limit} tokens with its conversation's history")
    prompt = request.prompt
    clipped = prompt.clipped(room) if isinstance(prompt, PromptRecipe) else prompt[:room]
    return _replace(request, prompt=clipped)


def _replace(request: Request, **changes: object) -> Request:
    """``dataclasses.replace`` without its generic machinery (Request has no ``__post_init__``
    to run): it was a third of the import's time per row (a 27-million-row Azure trace)."""
    copy = object.__new__(Request)
    copy.__dict__.update(request.__dict__, **changes)
    return copy


def select(pairs: Iterator[tuple[float | None, Request | Dropped]], options: ImportOptions,
           counts: ImportCounts, name: str | Path = "the source", gate: Gate | None = None
           ) -> Iterator[Request]:
    """Apply the options to ``source``'s pairs, counting every request in ``counts``.

    A later turn follows its conversation's first turn: out of the window or dropped with it.
    Keeping no request at all is an error (``name`` is the source's, for its message).
    ``gate``: the one given to the source, if any (it counts the first turns kept, and says
    where the source stopped reading: ``counts.stopped``)."""
    # Each kept conversation's tokens so far (prompts and answers: the next turn's history);
    # None where a text prompt's length is not known before the engine tokenizes it.
    kept_conversations: dict[str, int | None] = {}
    gate = gate or Gate(options)
    span = (math.inf, -math.inf)  # first and last first-turn times read
    for seconds, request in pairs:
        counts.read += 1
        if seconds is not None:
            span = (min(span[0], seconds), max(span[1], seconds))
        if isinstance(request, Dropped):
            counts.drop(request)
            continue
        conversation = request.conversation_id
        if request.follows_previous_turn:
            if conversation not in kept_conversations:
                counts.drop(LATER_TURN)
                continue
        else:
            assert seconds is not None
            dropped = gate.drops(seconds)
            if dropped is not None:
                counts.drop(dropped)
                continue
            request = _replace(request, arrival_s=(seconds - options.start_s)
                               * options.time_scale)
        if request.think_time_s and options.time_scale != 1:  # every time of the traffic
            request = _replace(request, think_time_s=request.think_time_s * options.time_scale)
        if not request.prompt_len and request.prompt_len is not None:
            counts.drop("empty prompt")
            kept_conversations.pop(conversation, None)  # type: ignore[arg-type]
            continue
        history = kept_conversations.get(conversation) if request.follows_previous_turn else 0
        fitted = _fit_length(request, options, counts, history or 0)
        if fitted is None:
            kept_conversations.pop(conversation, None)  # type: ignore[arg-type]
            continue
        if fitted.max_tokens < 1:
            counts.change("output length 0 raised to 1")
            fitted = _replace(fitted, max_tokens=1)
        if fitted.max_tokens > MAX_TOKENS_LIMIT:
            counts.change(f"output length clipped to {MAX_TOKENS_LIMIT}")
            fitted = _replace(fitted, max_tokens=MAX_TOKENS_LIMIT)
        _check_kept(fitted, seconds, options, f"{name}: request {counts.read}")
        if conversation is not None:
            kept_conversations[conversation] = (
                None if history is None or fitted.prompt_len is None
                else history + fitted.prompt_len + fitted.max_tokens)
            gate.in_conversation = True
        gate.first_turns += not fitted.follows_previous_turn
        counts.kept += 1
        yield fitted
    counts.stopped = gate.stopped
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
    elif options.time_scale != 1:
        where = (f"{where}: --time-scale {options.time_scale:g} makes its think time "
                 f"{request.think_time_s:g} s")
    elif seconds is not None:
        where = f"{where} (at {seconds:g} s of the trace)"
    try:
        check_request(request, where)
    except InvalidRequestError as exc:
        hint = ("--time-scale, --end or --limit keep the arrivals within it" if seconds is not None
                else "a smaller --time-scale keeps the think times within it")
        raise InvalidRequestError(f"{exc} (run and whatif would refuse it: {hint})") from None


def _nothing_kept(name: str | Path, options: ImportOptions, counts: ImportCounts,
                  span: tuple[float, float]) -> str:
    if not counts.read:
        return f"{name}: holds no requests (an empty file, or a header only)"
    message = f"{name}: the import keeps none of its requests ({counts.describe()})"
    if OUTSIDE in counts.dropped and span[0] <= span[1]:
        message += (f"; its first turns arrive from {span[0]:g} to {span[1]:g} s, the window "
                    f"is [{options.start_s:g}, {options.end_s:g}) s")
    return message


def import_workload(path: str | Path, fmt: str, options: ImportOptions,
                    counts: ImportCounts) -> Iterator[Request]:
    """The requests ``options`` keep from ``path`` in format ``fmt``, streaming."""
    gate = Gate(options)
    return select(source(path, fmt, options, gate), options, counts, path, gate)
