"""A load run's measurements: per-request table, the metric summary (``replay.metrics``' keys,
so ``whatif``'s table prints it beside a trace and a prediction), and its Parquet file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from engine.errors import ReplayLLMError
from replay.loadgen.answer import TIMED_OUT, Measured
from replay.metrics import LATENCIES, PERCENTILES

METADATA_KEY = b"replayllm_loadgen"
SOURCE = "client"
# ``requests_frame``'s columns, all of which a reader takes (``whatif --compare``'s table, plots).
NUMERIC_COLUMNS = ("index", "arrival_s", "sent_s", "prompt_tokens", "max_tokens",
                   "completion_tokens", "ttft_s", "tpot_s", "e2e_s", "queue_s", "send_lag_s")
REQUEST_COLUMNS = (*NUMERIC_COLUMNS, "itl_s", "finish_reason", "error")
# Written since; a reader does not require it (earlier results lack it): where each request's
# completion_tokens came from, "usage" (the server's count) or "chunks" (output chunks).
TOKEN_SOURCE = "token_source"
# Written since, defaulted on reading an earlier result (none retried): how many times each
# request was sent again (``client.send``: a 429, 502, 503, 504, no connection), and the seconds
# from its first send to the accepted one's (in its TTFT and e2e, which count from the first
# send; not in a server's).
RETRIES = "retries"
RETRY_WAIT = "retry_wait_s"
OPTIONAL_COLUMNS = (TOKEN_SOURCE, RETRIES, RETRY_WAIT)


class ResultError(ReplayLLMError):
    """A file is not a readable loadgen result; the message names it and says why."""


def requests_frame(measured: list[Measured]) -> pd.DataFrame:
    """One row per request: when it was due and (first) sent, client-side TTFT / TPOT / e2e,
    tokens, the inter-token latencies (``itl_s``: gaps between output chunks, ``client``'s
    token arrivals), any error, and the retries (``client.send``) with the time they took."""
    rows = []
    for m in measured:
        ttft = m.first_token_s - m.sent_s
        # The answer's end (an answer with no output has one); a result of a client that did
        # not keep it: the last output's.
        e2e = (m.last_token_s if np.isnan(m.end_s) else m.end_s) - m.sent_s
        n = m.completion_tokens
        # Over the gap from the first output to the last: none where all came in one chunk,
        # whose tokens' times the client cannot see (not 0 s a token).
        tpot = ((m.last_token_s - m.first_token_s) / (n - 1)
                if n > 1 and len(m.chunk_times_s) > 1 else float("nan"))
        rows.append({
            "index": m.index, "arrival_s": m.arrival_s, "sent_s": m.sent_s,
            "prompt_tokens": m.prompt_tokens or m.prompt_len, "max_tokens": m.max_tokens,
            "completion_tokens": n, "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e,
            "queue_s": float("nan"),  # the server's queue is not visible to a client
            "send_lag_s": m.sent_s - m.arrival_s,  # how late the client sent it
            "itl_s": np.diff(m.chunk_times_s).tolist(), "finish_reason": m.finish_reason,
            "error": m.error, TOKEN_SOURCE: m.token_source, RETRIES: m.retries,
            RETRY_WAIT: m.retry_wait_s,
        })
    # Its columns even with no rows.
    return pd.DataFrame(rows, columns=[*REQUEST_COLUMNS, *OPTIONAL_COLUMNS])


def token_sources(frame: pd.DataFrame) -> str:
    """Where the run's completion-token counts came from: "usage", "chunks", "usage+chunks"
    (some requests each way) or "none" (no request got an answer)."""
    found = set(frame[TOKEN_SOURCE]) if TOKEN_SOURCE in frame.columns else set()
    return "+".join(name for name in ("usage", "chunks") if name in found) or "none"


def unmeasured(frame: pd.DataFrame) -> list[str]:
    """One line for each figure some answered requests could not give (left out of the
    summary's statistics of it): no TTFT where no output came, no TPOT where more than one
    token came in a single chunk."""
    ok = frame[frame["error"] == ""]
    no_output = int(ok["ttft_s"].isna().sum())
    one_chunk = int((ok["ttft_s"].notna() & ok["tpot_s"].isna()
                     & (ok["completion_tokens"] > 1)).sum())
    lines = []
    if no_output:
        lines.append(f"note: {_requests(no_output)} sent no output (no TTFT): the answer ended "
                     "without text; its e2e is when it ended")
    if one_chunk:
        lines.append(f"note: {_requests(one_chunk)} sent their output in one chunk (no TPOT): "
                     "the times between their tokens cannot be seen")
    return lines


def _requests(n: int) -> str:
    return f"{n} request{'' if n == 1 else 's'}"


def summarize(frame: pd.DataFrame, wall_s: float) -> dict[str, float]:
    """The metrics ``replay.metrics.compute`` reports that a client can measure."""
    ok = frame[frame["error"] == ""]
    completion = float(ok["completion_tokens"].sum())
    summary: dict[str, float] = {
        "requests": float(len(frame)),
        "errors": float(len(frame) - len(ok)),
        "timeouts": float(frame["error"].str.startswith(TIMED_OUT).sum()) if len(frame) else 0.0,
        "completion_tokens": completion,
        "retries": float(frame[RETRIES].sum()) if RETRIES in frame.columns else 0.0,
    }
    if len(ok):
        makespan = float((ok["sent_s"] + ok["e2e_s"]).max() - ok["arrival_s"].min())
    else:
        makespan = wall_s
    summary["makespan_s"] = makespan
    summary["throughput_tok_s"] = completion / makespan if makespan > 0 else float("nan")
    for name in LATENCIES:
        values = ok[f"{name}_s"].to_numpy(dtype=float)
        finite = values[np.isfinite(values)]
        summary[f"{name}_mean_s"] = float(finite.mean()) if len(finite) else float("nan")
        for p in PERCENTILES:
            summary[f"{name}_p{p}_s"] = (float(np.percentile(finite, p)) if len(finite)
                                         else float("nan"))
    gaps = np.concatenate([np.asarray(g, dtype=float) for g in ok["itl_s"]] or [np.empty(0)])
    summary["itl_mean_s"] = float(gaps.mean()) if len(gaps) else float("nan")
    for p in PERCENTILES:
        summary[f"itl_p{p}_s"] = float(np.percentile(gaps, p)) if len(gaps) else float("nan")
    return summary


def write_result(path: str | Path, frame: pd.DataFrame, summary: dict[str, float],
                 run: dict[str, Any]) -> Path:
    """Per-request rows in Parquet, with the summary and the run's settings in its metadata;
    written to a temporary sibling renamed over ``path``, so a failure or an interrupt while
    writing leaves no half file (and an earlier result whole)."""
    from tracing.outfile import write_via_temporary

    table = pa.Table.from_pandas(frame, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[METADATA_KEY] = json.dumps({"summary": summary, "run": run}).encode()
    table = table.replace_schema_metadata(meta)
    return write_via_temporary(path, lambda tmp: pq.write_table(table, tmp))


def is_result(path: str | Path) -> bool:
    """Whether ``path`` is a loadgen result file (not a trace directory)."""
    p = Path(path)
    if not p.is_file():
        return False
    try:
        return METADATA_KEY in (pq.read_schema(p).metadata or {})
    except (OSError, pa.ArrowInvalid):
        return False


def read_result(path: str | Path) -> tuple[pd.DataFrame, dict[str, float], dict[str, Any]]:
    """(per-request rows, summary, run settings) of a loadgen result file; a ``ResultError``
    naming the file and what is wrong for one that is not, or whose metadata (an object of a
    numeric ``summary`` and a ``run`` object) or columns (``REQUEST_COLUMNS``) are not as
    ``write_result`` writes them. A result written before the retry columns reads with none
    retried."""
    try:
        table = pq.read_table(path)
        raw = (table.schema.metadata or {}).get(METADATA_KEY)
        if raw is None:
            raise ResultError(f"{path}: not a loadgen result (no replayllm_loadgen metadata)")
        info = json.loads(raw)
        frame = table.to_pandas()
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise ResultError(f"{path}: not a loadgen result ({exc})") from None
    summary = info.get("summary") if isinstance(info, dict) else None
    if not (isinstance(summary, dict) and isinstance(info.get("run"), dict)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                    for v in summary.values())):
        raise ResultError(f"{path}: malformed loadgen metadata (an object holding a summary of "
                          "numbers and a run object expected)")
    missing = [name for name in REQUEST_COLUMNS if name not in frame.columns]
    if missing:
        raise ResultError(f"{path}: not a loadgen result: no {', '.join(missing)} column"
                          f"{'s' if len(missing) > 1 else ''}")
    for name, default in ((RETRIES, 0), (RETRY_WAIT, 0.0)):
        if name not in frame.columns:  # an earlier result: nothing was retried
            frame[name] = default
    wrong = [name for name in (*NUMERIC_COLUMNS, RETRIES, RETRY_WAIT)  # no rows: no type
             if len(frame) and not pd.api.types.is_numeric_dtype(frame[name])]
    if wrong:
        raise ResultError(f"{path}: loadgen result column {wrong[0]} is not numeric "
                          f"({frame[wrong[0]].dtype})")
    return frame, summary, info["run"]


def table_row(label: str, summary: dict[str, float], frame: pd.DataFrame | None = None,
              notes: list[str] | None = None) -> dict:
    """A row for ``replay.whatif.report.variants_table`` (``notes``: its summary's notes)."""
    return {"label": label, "source": SOURCE, "status": "ok", "metrics": summary,
            "requests": frame, "notes": notes or []}
