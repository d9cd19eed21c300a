"""The CLI's file arguments, checked before any work: one rule per kind of path, for every
command that takes one.

Outputs follow ``tracing.outdir`` (a directory written whole) and ``tracing.outfile`` (a file:
never over a directory, a symlink, a file another tool wrote or into a trace); a mistake is one
line at once, not a traceback after a long search, and never a lost file. What an input file
holds is its loader's to check (``engine.profiling.load_profile`` a profile's rows), not here.
"""

from __future__ import annotations

from pathlib import Path

from engine.errors import ReplayLLMError
from engine.profiling import PROFILE_FORMAT
from tracing.outdir import check_output_dir
from tracing.outfile import check_output_file, holds, starts_with

# How replay/whatif/html_report.write_report starts a page titled "replayllm ...".
REPORT_START = b"<!DOCTYPE html><html><head><meta charset='utf-8'><title>replayllm "
# Formats a plot may be saved in (by its suffix); matplotlib names itself in each file.
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


class PathArgumentError(ReplayLLMError):
    """A file argument cannot be used; the message names it and says why."""


def check_out_dir(out: str | Path, kind: str) -> None:
    """``--out`` of a command that rewrites its directory whole (``whatif``, ``tune``): empty,
    absent, or an earlier output of ``kind`` (``tracing.outdir.check_output_dir``)."""
    check_output_dir(Path(out).expanduser(), kind, force=True)


def check_report(report: str | Path | None, out_dir: str | Path | None = None) -> None:
    """``--report FILE.html``: a new file, or an earlier replayllm report; never inside
    ``out_dir`` (rewritten whole by the command) or a trace."""
    if report is None:
        return
    path = check_output_file(report, "report", starts_with(REPORT_START))
    if out_dir is not None:
        out = Path(out_dir).expanduser().resolve()
        if out in path.resolve().parents:
            raise PathArgumentError(f"{report}: is inside --out {out_dir}, which the command "
                                    "rewrites whole; write the report elsewhere")


def check_plot_file(plot: str | Path) -> None:
    """A plot's file (``workload describe --plots``): a supported suffix, a new file or an
    earlier plot."""
    if Path(plot).suffix.lower() not in PLOT_SUFFIXES:
        raise PathArgumentError(f"{plot}: a plot is written as {', '.join(PLOT_SUFFIXES)} "
                                "(by the file's suffix)")
    check_output_file(plot, "plot", holds(b"Matplotlib"))


def check_workload_out(out: str | Path, source: str | Path | None = None) -> None:
    """``workload generate/import --out``: a new file, or a workload file replayllm wrote."""
    if source is not None and Path(out).expanduser().resolve() == Path(source).resolve():
        raise PathArgumentError("--out must not be the source file")
    check_output_file(out, "workload file", _is_workload_file)


def check_profile_out(out: str | Path) -> None:
    """``profile --out``: a new file, or an earlier device profile."""
    check_output_file(out, "profile", starts_with(b'{\n "format": "' + PROFILE_FORMAT.encode()))


def check_bench_json(out: str | Path) -> None:
    """``bench --json``: a new file, or a JSON document (the suites write one, indented)."""
    check_output_file(out, "benchmark result", starts_with(b"{\n"))


# Suffixes of other formats than a loadgen result's (Parquet, whatever its name): such an --out
# would hold Parquet bytes its name's readers cannot open.
OTHER_FORMATS = (".csv", ".tsv", ".json", ".jsonl", ".ndjson", ".txt", ".gz", ".html", ".xlsx")


def check_result_out(out: str | Path) -> None:
    """``loadgen --out``: a new file, or an earlier loadgen result (checked first: a file it
    must not replace is named as such); never a name of another format."""
    from replay.loadgen.result import is_result

    check_output_file(out, "loadgen result", is_result)
    if str(out).lower().endswith(OTHER_FORMATS):
        raise PathArgumentError(f"--out {out}: a loadgen result is a Parquet file; name it "
                                ".parquet (read it with pandas.read_parquet or whatif --compare)")


def _is_workload_file(path: Path) -> bool:
    from replay.workloads.store import FORMAT_NAME, read_metadata

    try:
        return FORMAT_NAME in read_metadata(path)
    except Exception:  # noqa: BLE001 - whatever it holds, it is not one of ours
        return False


def check_profile_arg(profile: str | None) -> None:
    """``whatif --profile A.json[,B.json]``: names at least one file. What each file holds is
    ``engine.profiling.load_profile``'s to check (it validates every profile it reads)."""
    if profile is None:
        return
    from replay.whatif.cost.profile import profile_paths

    if not profile_paths(profile):
        raise PathArgumentError(f"--profile {profile!r} names no file")
