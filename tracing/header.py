"""Helpers that fill the environment part of a trace header (``run.json``).

The engine builds the header (config, model, block size, ...) and passes it to the sink's
``open``; ``provenance()`` supplies what describes the code and the moment.
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Mapping
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

# Distributions whose versions can change what a trace holds or how fast it was made.
TRACKED_PACKAGES = (
    "replayllm",
    "torch",
    "transformers",
    "triton",
    "flash-attn",
    "numpy",
    "pyarrow",
    "pandas",
    "xxhash",
)
GIT_TIMEOUT_S = 2.0
_REPO_ROOT = Path(__file__).resolve().parent.parent


def package_versions(packages: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str]:
    """Installed versions of ``packages`` (absent ones are left out), plus Python's.

    Read from package metadata, so nothing heavy (torch) is imported.
    """
    versions = {"python": platform.python_version()}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def git_commit(repo: str | Path | None = None) -> str | None:
    """The commit checked out in ``repo`` (default: this source tree), ``+dirty`` if modified.

    None where there is no git, no repository, or git does not answer within ``GIT_TIMEOUT_S``.
    """
    cwd = Path(repo) if repo is not None else _REPO_ROOT
    try:
        sha = _git(cwd, "rev-parse", "HEAD")
        if sha is None:
            return None
        status = _git(cwd, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}+dirty" if status else sha


def _git(cwd: Path, *args: str) -> str | None:
    done = subprocess.run(
        ["git", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=GIT_TIMEOUT_S,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def start_time() -> str:
    """Now as an ISO 8601 UTC timestamp with microseconds, e.g. ``2025-01-31T12:00:00.000001Z``."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def host_cpu() -> dict[str, Any]:
    """The host's CPU model (``/proc/cpuinfo``'s model name where there is one, else the
    platform's processor name) and logical CPU count: eager steps are bound by the host's
    launch rate, so their times follow it (docs/gpu-notes.md, session 9)."""
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            model = next((line.split(":", 1)[1].strip() for line in info
                          if line.startswith("model name")), "")
    except OSError:
        pass
    return {"model": model or platform.processor() or platform.machine(), "cpus": os.cpu_count()}


def provenance() -> dict[str, Any]:
    """``versions``, ``git_commit``, ``start_time`` and ``host``: the part of a header that
    describes the code, the moment and the machine, not the engine."""
    return {"versions": package_versions(), "git_commit": git_commit(), "start_time": start_time(),
            "host": host_cpu()}


def executor_device(description: Mapping[str, Any]) -> str:
    """The device an executor describes, by name where it gives one ("NVIDIA H200"), else its
    torch device ("cuda:0", "cpu"); empty where it says neither."""
    return str(description.get("device_name") or description.get("device") or "")


def recorded_device(header: Mapping[str, Any]) -> str:
    """The device a trace was recorded on: its executor's (``executor_device``), else the
    header's own ``device``; empty where neither is there."""
    executor = header.get("executor")
    named = executor_device(executor) if isinstance(executor, Mapping) else ""
    return named or str(header.get("device") or "")
