"""The formats ``workload import`` reads, told by the names their files hold, for the one error a
file of another format gets: it names what the file holds (its CSV columns or its record's JSON
fields), every format read with the names it needs, and the format whose names the file has, if
one has them (``--format azure`` given a BurstGPT file, a Mooncake file given as CSV)."""

from __future__ import annotations

import csv
import json

from replay.workloads.fields import WorkloadFormatError

FORMATS = ("azure", "burstgpt", "mooncake", "sharegpt", "replayllm")
# format: (what it is, the column or field names a file of it must hold)
NEEDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "azure": ("CSV", ("TIMESTAMP", "ContextTokens", "GeneratedTokens")),
    "burstgpt": ("CSV", ("Timestamp", "Request tokens", "Response tokens")),
    "mooncake": ("JSONL", ("timestamp", "input_length", "output_length")),
    "sharegpt": ("JSON", ("conversations",)),
}
# format: other sets of names a file of it may hold instead (OpenAI-style chat files,
# LMSYS-Chat-1M and WildChat)
OR_NEEDS: dict[str, tuple[tuple[str, ...], ...]] = {"sharegpt": (("messages",),
                                                                ("conversation",))}
SHOWN, SHOWN_CHARS = 12, 40  # names shown of what a file holds, characters of each


def key(name: str) -> str:
    """A column name as matched: case, and spaces around and inside it, ignored."""
    return "".join(name.split()).casefold()


def name_sets(fmt: str) -> tuple[tuple[str, ...], ...]:
    """The sets of names a file of ``fmt`` holds one of (all the names of a set)."""
    return (NEEDS[fmt][1],) + OR_NEEDS.get(fmt, ())


def supported() -> str:
    """Every format read, with the names each needs."""
    parts = [f"{fmt} ({kind}: {' or '.join(', '.join(s) for s in name_sets(fmt))})"
             for fmt, (kind, _) in NEEDS.items()]
    return "; ".join(parts + ["replayllm (this project's JSONL or Parquet)"])


def names_in(line: str) -> tuple[str, list[str]]:
    """What a file's first line holds: ('fields', the keys of a JSON object) or ('columns',
    its CSV cells)."""
    text = line.strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return "fields", [str(k) for k in value]
    return "columns", next(csv.reader([text]), [])


def not_format(problem: str, fmt: str, found: tuple[str, list[str]]) -> WorkloadFormatError:
    """The one-line error of a file that is not ``fmt``: ``problem`` says where and why
    ('t.csv:1: not a BurstGPT CSV: no column 'Request tokens''), ``found`` what the file holds
    (``names_in`` of its first line, or ('fields', keys) of a JSON record)."""
    noun, names = found
    shown = [n if len(n) <= SHOWN_CHARS else n[:SHOWN_CHARS] + "..." for n in names[:SHOWN]]
    listed = ", ".join(shown) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
    message = (f"{problem} ({noun} found: {listed or 'none'}); workload import reads "
               f"{supported()}")
    match = looks_like(names, fmt)
    if match:
        message += f"; this file looks like --format {match}"
    return WorkloadFormatError(message)


def looks_like(names: list[str], other_than: str | None = None) -> str | None:
    """The trace format (not ``other_than``) whose needed names ``names`` all hold, if one."""
    keys = {key(n) for n in names}
    return next((f for f in NEEDS if f != other_than
                 and any(all(key(n) in keys for n in need) for need in name_sets(f))), None)
