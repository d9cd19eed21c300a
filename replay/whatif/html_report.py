"""One self-contained HTML page of a whatif or tune run: tables and plots inline (PNG as
base64 data URIs), no script, no stylesheet or font from the network."""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1200px}"
         "table{border-collapse:collapse;font-size:13px;margin-bottom:1.5em}"
         "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
         "td:first-child,th:first-child{text-align:left}img{max-width:100%}"
         "pre{background:#f4f4f4;padding:.6em}")


def number(value: float) -> str:
    """A float cell of a table: a whole number in full (a token count, a step count; a column
    holding a cannot-run row's NaN is float), 1,000 and above to one decimal (a throughput:
    ``27386.9``, not ``2.739e+04``), other values to four significant digits."""
    if not math.isfinite(value):
        return "n/a" if math.isnan(value) else str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.1f}" if abs(value) >= 1000 else f"{value:.4g}"


def write_report(path: str | Path, title: str, lines: list[str],
                 tables: list[tuple[str, pd.DataFrame]], plots: dict[str, bytes]) -> Path:
    """Write the page: ``lines`` as preformatted text, each table, each PNG plot (``plots``:
    file name -> bytes, held by the caller; one ``<img class="plot">`` each, so a reader can
    count them)."""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
             f"</title><style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"]
    if lines:
        parts.append("<pre>" + html.escape("\n".join(lines)) + "</pre>")
    for caption, frame in tables:
        parts.append(f"<h2>{html.escape(caption)}</h2>")
        parts.append(frame.to_html(index=False, na_rep="n/a", float_format=number,
                                   border=0))
    for file_name, png in plots.items():
        data = base64.b64encode(png).decode("ascii")
        name = html.escape(Path(file_name).stem)
        parts.append(f"<h2>{name}</h2><img class='plot' alt='{name}' "
                     f"src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(parts), encoding="utf-8")
    return out
