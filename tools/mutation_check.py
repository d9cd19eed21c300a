"""Mutation check: do the property tests catch small bugs in the scheduler core?

Each mutant is one exact text substitution (old -> new) in ``engine/block_manager.py``,
``engine/scheduler.py`` or ``engine/policy.py`` (``tools/mutants_outside.py`` runs another set,
written apart from these, through the same runner). For each, the repository is copied to a
temporary directory (the working tree is never touched while a mutant runs), the substitution is
applied to the copy, and
the property suite runs there with the ``ci`` Hypothesis profile (same examples; shrinking skipped,
a failure only needs to be found) under a timeout. A mutant is *killed* when a test fails (or the
run times out: a livelock), *survived* when the suite passes.

The old text of every mutant must occur exactly as often as declared, or the script stops before
running anything: mutants cannot silently rot when the engine changes.

    python tools/mutation_check.py                 # every mutant, 2 at a time, table + score
    python tools/mutation_check.py -k victim -j 1  # mutants whose name contains "victim"
    python tools/mutation_check.py --shrink        # shrink failures: minimal counterexamples
    python tools/mutation_check.py --list          # the mutants, checked against the sources

Exit status: 0 when the score reaches ``--min-score`` (default 0.9), 1 when it does not, 2 when a
mutant's old text is missing or the unmutated suite fails.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BM = "engine/block_manager.py"
SCHED = "engine/scheduler.py"
POLICY = "engine/policy.py"
SUITE = (
    "tests/engine/test_block_manager_state.py",
    "tests/engine/test_scheduler_properties.py",
    "tests/engine/test_model_batch_invariance.py",
    "tests/engine/test_policy.py",
    "tests/engine/test_overlap.py",
)
# Strict-xfail tests documenting engine findings: a mutant could make one pass (XPASS, a failure),
# which would be counted as a kill by the wrong test; they are left out of mutant runs.
FINDINGS = (
    "tests/engine/test_block_manager_state.py::"
    "test_live_hashed_block_stays_findable_after_its_duplicate_is_evicted",
)
# What a copy needs to import the engine and run the suite.
COPY = ("engine", "tracing", "replay", "tests", "docs", "traces", "pyproject.toml")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", ".pytest_cache")


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    what: str
    count: int = 1  # how many times ``old`` occurs (every occurrence is replaced)


MUTANTS: tuple[Mutant, ...] = (
    # --- engine/block_manager.py ------------------------------------------------------------------
    Mutant(
        "may_append_off_by_one",
        BM,
        "        if seq.num_tokens > len(seq.block_table) * self.block_size:\n"
        "            self._allocate_fresh(seq, len(seq.block_table))",
        "        if seq.num_tokens >= len(seq.block_table) * self.block_size:\n"
        "            self._allocate_fresh(seq, len(seq.block_table))",
        "may_append takes a new block when the current one is exactly full",
    ),
    Mutant(
        "may_append_hashes_late",
        BM,
        "        if seq.num_tokens % self.block_size == 0:\n"
        "            self.register_full_blocks(seq, seq.num_tokens, self.hold_decode_blocks)",
        "        if seq.num_tokens % self.block_size == 1:\n"
        "            self.register_full_blocks(seq, seq.num_tokens, self.hold_decode_blocks)",
        "a block filled by decoding is entered into the cache one token late",
    ),
    Mutant(
        "refcount_decrement_skipped",
        BM,
        "            block.ref_count -= 1\n",
        "            block.ref_count -= 1 if logical_index else 0\n",
        "deallocate skips the refcount decrement of a sequence's first block",
    ),
    Mutant(
        "hit_refcount_not_incremented",
        BM,
        "                else:\n                    block.ref_count += 1",
        "                else:\n                    pass",
        "a cache hit on a block in use does not take a reference",
    ),
    Mutant(
        "hit_on_free_block_left_on_free_list",
        BM,
        "                if block.ref_count == 0:\n"
        "                    self._take_free_block(block_id)",
        "                if block.ref_count == -1:\n"
        "                    self._take_free_block(block_id)",
        "a hit on a freed cached block takes a reference but leaves it on the free list",
    ),
    Mutant(
        "hash_never_registered",
        BM,
        "            self.hash_to_block_id[block_hash] = block.block_id",
        "            self.hash_to_block_id.get(block_hash, block.block_id)",
        "register_full_blocks hashes blocks but never enters them in the index",
    ),
    Mutant(
        "hit_token_check_removed",
        BM,
        "                if block.token_ids != chunk:\n                    break",
        "                if False:\n                    break",
        "a hash hit is taken without comparing the block's stored tokens",
    ),
    Mutant(
        "hit_falls_back_to_any_block",
        BM,
        "                block_id = self.hash_to_block_id.get(block_hash, -1)",
        "                block_id = self.hash_to_block_id.get(\n"
        "                    block_hash, next(iter(self.hash_to_block_id.values()), -1)\n"
        "                )",
        "a hash miss falls back to any cached block (taken if its tokens match the chunk)",
    ),
    Mutant(
        "nondeterministic_free_block",
        BM,
        "        return heap[0][2]\n",
        "        return list(free)[id(heap) // 16 % len(free)]\n",
        "the free block handed out depends on an object's address (not reproducible)",
    ),
    Mutant(
        "free_list_newest_first",
        POLICY,
        "    return block.released\n",
        "    return -block.released\n",
        "allocation takes the most recently freed block (evicts the freshest cache entries)",
    ),
    Mutant(
        "release_first_block_first",
        BM,
        "for logical_index in range(len(table) - 1, -1, -1):",
        "for logical_index in range(len(table)):",
        "deallocate frees a sequence's first block first (its prefix is evicted first)",
    ),
    Mutant(
        "last_block_recompute_removed",
        BM,
        "        max_hits = num_full if num_full * block_size < seq.num_tokens else num_full - 1",
        "        max_hits = num_full",
        "a completely cached prompt is served entirely from cache (nothing left to compute)",
    ),
    Mutant(
        "cached_tokens_not_reset_on_preemption",
        BM,
        "        seq.num_cached_tokens = 0\n        seq.num_computed_tokens = 0\n",
        "        seq.num_computed_tokens = 0\n",
        "deallocate (preemption) leaves num_cached_tokens set",
    ),
    Mutant(
        "deallocate_counts_after_clear",
        BM,
        "        return count\n",
        "        return len(table)\n",
        "deallocate reports the size of the table after clearing it (0 blocks released)",
    ),
    Mutant(
        "reused_block_keeps_hash",
        BM,
        "            block = self._take_free_block(block_id)\n"
        "            self._forget_contents(block)",
        "            block = self._take_free_block(block_id)",
        "a cached block handed out fresh keeps its hash and index entry",
    ),
    Mutant(
        "parent_hash_not_chained",
        BM,
        "        parent = blocks[table[index - 1]].hash if index > 0 else NO_HASH",
        "        parent = NO_HASH",
        "blocks registered after the first chunk are hashed without their parent",
    ),
    Mutant(
        "can_allocate_short_by_one_token",
        BM,
        "return len(self.free_block_ids) >= self.blocks_needed(seq.num_tokens)",
        "return len(self.free_block_ids) >= self.blocks_needed(seq.num_tokens - 1)",
        "can_allocate forgets the block of the prompt's last token",
    ),
    # --- engine/scheduler.py ----------------------------------------------------------------------
    Mutant(
        "decode_room_off_by_one",
        SCHED,
        "        if seq.num_tokens > len(seq.block_table) * self.block_size:\n"
        "            while not self.block_manager.free_block_ids:",
        "        if seq.num_tokens >= len(seq.block_table) * self.block_size:\n"
        "            while not self.block_manager.free_block_ids:",
        "a decode whose token fits the last slot of its last block still claims a free block",
    ),
    Mutant(
        "victim_oldest",
        POLICY,
        "        return candidates[-1]\n",
        "        return candidates[1] if len(candidates) > 1 else candidates[0]\n",
        "a decode needing a block preempts the oldest remaining running sequence, not the newest",
    ),
    Mutant(
        "victim_self_first",
        POLICY,
        "        return candidates[-1]\n",
        "        return candidates[0]\n",
        "a decode needing a block preempts itself although newer sequences are running",
    ),
    Mutant(
        "mixed_labelled_prefill",
        SCHED,
        'kind = "mixed" if prefills and decodes else ("prefill" if prefills else "decode")',
        'kind = "prefill" if prefills else "decode"',
        "a chunked step mixing prefill chunks and decodes is labelled prefill",
    ),
    Mutant(
        "running_order_lost",
        SCHED,
        "        running.extendleft(reversed(visited))",
        "        running.extend(visited)",
        "decoded sequences go behind the unscheduled ones (admission order lost)",
    ),
    Mutant(
        "preempted_to_back_of_queue",
        SCHED,
        "        self.waiting.appendleft(seq)",
        "        self.waiting.append(seq)",
        "a preempted sequence queues behind every waiting request",
    ),
    Mutant(
        "token_budget_strict",
        POLICY,
        "            if seq.num_tokens > step.tokens_left:",
        "            if seq.num_tokens >= step.tokens_left:",
        "prefill_first refuses a prompt that exactly fills the token budget",
    ),
    Mutant(
        "seq_budget_off_by_one",
        SCHED,
        "            if step.seqs_left <= 0 or step.tokens_left <= 0",
        "            if step.seqs_left < 0 or step.tokens_left <= 0",
        "admission takes one sequence past max_num_seqs",
    ),
    Mutant(
        "running_seq_budget_off_by_one",
        SCHED,
        "        while running and step.tokens_left > 0 and step.seqs_left > 0:",
        "        while running and step.tokens_left > 0 and step.seqs_left >= 0:",
        "the running sequences' pass schedules one sequence past max_num_seqs",
    ),
    Mutant(
        "chunk_overruns_budget",
        SCHED,
        "        if not 1 <= query_len <= min(remaining, step.tokens_left):",
        "        if not 1 <= query_len <= min(remaining, step.tokens_left + 1):",
        "the scheduler lets a prompt chunk take one token more than the budget left",
    ),
    Mutant(
        "chunked_chunk_one_over",
        POLICY,
        "        return min(remaining, step.tokens_left)\n",
        "        return min(remaining, step.tokens_left + 1)\n",
        "chunked asks for one token more than the budget left (the scheduler must refuse it)",
    ),
    # --- engine/policy.py (and the eviction bookkeeping it reads) ---------------------------------
    Mutant(
        "priority_victim_newest",
        POLICY,
        "key=lambda i: (step.priority(candidates[i]), i))",
        "key=lambda i: i)",
        "priority preempts the newest sequence whatever its priority",
    ),
    Mutant(
        "priority_admission_fcfs",
        POLICY,
        "key=lambda i: (step.priority(waiting[i]), i))",
        "key=lambda i: i)",
        "priority admits first come first served, ignoring priorities",
    ),
    Mutant(
        "priority_inverted",
        POLICY,
        "key=lambda i: (step.priority(waiting[i]), i))",
        "key=lambda i: (-step.priority(waiting[i]), i))",
        "priority admits the worst priority first",
    ),
    Mutant(
        "chunked_stops_with_a_token_left",
        POLICY,
        "            if step.tokens_left <= 0:",
        "            if step.tokens_left <= 1:",
        "chunked stops admitting while one token of budget is left",
    ),
    Mutant(
        "lru_ignores_last_use",
        POLICY,
        "    return (block.last_used, block.released)\n",
        "    return (block.released, block.last_used)\n",
        "lru eviction hands out blocks in release order",
    ),
    Mutant(
        "last_use_not_recorded",
        BM,
        "            if used > block.last_used:\n                block.last_used = used",
        "            if used > block.last_used:\n                pass",
        "a released block keeps its old last use (lru evicts recently used blocks)",
    ),
    Mutant(
        "mixed_admits_before_running",
        SCHED,
        "            self._run_running(step, batch)\n            self._admit(step, batch)",
        "            self._admit(step, batch)\n            self._run_running(step, batch)",
        "a mixed-batch policy admits before the running sequences get their share",
    ),
    Mutant(
        "chunk_progress_not_recorded",
        SCHED,
        "                if not sample:\n                    seq.num_computed_tokens = ctx",
        "                if not sample:\n                    pass",
        "postprocess forgets the progress of a prefill chunk that samples nothing",
    ),
    Mutant(
        "max_tokens_off_by_one",
        SCHED,
        "elif num_tokens - seq.num_prompt_tokens >= seq.max_tokens or",
        "elif num_tokens - seq.num_prompt_tokens > seq.max_tokens or",
        "a request produces max_tokens + 1 tokens",
    ),
    Mutant(
        "max_model_len_off_by_one",
        SCHED,
        "        num_tokens >= max_model_len:",
        "        num_tokens > max_model_len:",
        "a request may grow one token past max_model_len",
    ),
    Mutant(
        "eos_ignores_ignore_eos",
        SCHED,
        "if token_id == eos and not seq.ignore_eos and token_id != PENDING_TOKEN:",
        "if token_id == eos and token_id != PENDING_TOKEN:",
        "EOS finishes a request even with ignore_eos",
    ),
    Mutant(
        "admission_peak_off_by_one",
        SCHED,
        "peak_blocks = self.block_manager.blocks_needed(final_len - 1)",
        "peak_blocks = self.block_manager.blocks_needed(final_len)",
        "admission counts the KV of the last sampled token, rejecting requests that fit",
    ),
    Mutant(
        "finished_blocks_not_released",
        SCHED,
        "        if release:\n            self.block_manager.deallocate(seq)",
        "        if release:\n            pass",
        "a finished request keeps its blocks",
    ),
    Mutant(
        "decode_fill_not_hashed",
        SCHED,
        "        self.block_manager.may_append(seq)\n        return True",
        "        if seq.num_tokens % self.block_size:\n"
        "            self.block_manager.may_append(seq)\n"
        "        return True",
        "a decode whose token fills its block never enters the block into the prefix cache",
    ),
)


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # killed / survived / timeout / error
    seconds: float
    killers: list[str] = field(default_factory=list)
    detail: str = ""


def check_sources(mutants: tuple[Mutant, ...]) -> list[str]:
    """Every mutant's old text must occur exactly ``count`` times in today's source."""
    problems = []
    for m in mutants:
        source = (ROOT / m.path).read_text()
        found = source.count(m.old)
        if found != m.count:
            problems.append(
                f"{m.name}: old text occurs {found} times in {m.path} (expected {m.count}):\n"
                + "\n".join("    | " + line for line in m.old.splitlines())
            )
        if m.old == m.new:
            problems.append(f"{m.name}: old and new text are the same")
    names = [m.name for m in mutants]
    problems += [
        f"duplicate mutant name {n}" for n in sorted({n for n in names if names.count(n) > 1})
    ]
    return problems


def make_copy(base: Path) -> Path:
    base.mkdir(parents=True)
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, base / name, ignore=IGNORE)
        elif src.exists():
            shutil.copy2(src, base / name)
    return base


_LABELS = re.compile(r"(?:invariants|properties) violated: ([a-z_, ]+)")


def _killers(junit: Path) -> tuple[list[str], str]:
    """Failing tests (with the invariant/property names they report) from a JUnit XML file."""
    if not junit.exists():
        return [], ""
    killers, first = [], ""
    for case in ET.parse(junit).getroot().iter("testcase"):
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is None:
            continue
        text = (failure.get("message") or "") + "\n" + (failure.text or "")
        labels = sorted(
            {lab.strip() for m in _LABELS.finditer(text) for lab in m.group(1).split(",")}
        )
        name = case.get("name", "?")
        if name == "runTest":  # a state machine's TestCase: name it by its class
            name = case.get("classname", "?").rsplit(".", 1)[-1]
        killers.append(name + (f" [{', '.join(labels)}]" if labels else ""))
        if not first:
            first = (
                (failure.get("message") or "").splitlines()[0][:200]
                if failure.get("message")
                else ""
            )
    return killers, first


def run_suite(
    copy: Path, tests: tuple[str, ...], timeout: float, profile: str, shrink: bool,
    first_failure: bool = False,
) -> tuple[str, float, list[str], str]:
    junit = copy / "junit.xml"
    junit.unlink(missing_ok=True)
    env = dict(os.environ)
    env.update(
        {
            "HYPOTHESIS_PROFILE": profile,
            "PYTHONPATH": str(copy),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    if not shrink:
        env["HYPOTHESIS_NO_SHRINK"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        f"--junitxml={junit}",
        *(["-x"] if first_failure else []),
        "--rootdir",
        str(copy),
        *tests,
        *[f"--deselect={test}" for test in FINDINGS],
    ]
    began = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - began, [], f"no verdict within {timeout:.0f} s"
    seconds = time.monotonic() - began
    killers, first = _killers(junit)
    if proc.returncode == 0:
        return "survived", seconds, [], ""
    if proc.returncode == 1 and killers:
        return "killed", seconds, killers, first
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    return "error", seconds, killers, " | ".join(tail)


def evaluate(
    mutant: Mutant | None, work: Path, args: argparse.Namespace
) -> tuple[str, float, list[str], str]:
    copy = make_copy(work / (mutant.name if mutant else "baseline"))
    try:
        if mutant is not None:
            target = copy / mutant.path
            source = target.read_text()
            target.write_text(source.replace(mutant.old, mutant.new))
        first = args.first_failure and mutant is not None
        return run_suite(copy, tuple(args.tests), args.timeout, args.profile, args.shrink, first)
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def print_table(outcomes: list[Outcome]) -> None:
    width = max(len(o.mutant.name) for o in outcomes)
    print(f"\n{'mutant':<{width}}  {'file':<24}  {'result':<8}  {'time':>6}  killed by")
    print(f"{'-' * width}  {'-' * 24}  {'-' * 8}  {'-' * 6}  {'-' * 40}")
    for o in outcomes:
        by = "; ".join(o.killers) if o.killers else (o.detail if o.status != "survived" else "-")
        print(
            f"{o.mutant.name:<{width}}  {o.mutant.path:<24}  {o.status:<8}  {o.seconds:5.0f}s  {by}"
        )


def main(argv: list[str] | None = None, mutants_set: tuple[Mutant, ...] | None = None) -> int:
    """Run the mutation check over ``mutants_set`` (default: ``MUTANTS``)."""
    all_mutants = MUTANTS if mutants_set is None else mutants_set
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-k",
        dest="select",
        action="append",
        default=[],
        help="only mutants whose name contains this (repeatable: any of them)",
    )
    parser.add_argument("-j", "--jobs", type=int, default=2, help="mutants run in parallel")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant")
    parser.add_argument("--profile", default="ci", help="Hypothesis profile (default ci)")
    parser.add_argument("--shrink", action="store_true", help="shrink failures (slower)")
    parser.add_argument("-x", "--first-failure", action="store_true",
                        help="stop a mutant's run at its first failing test (same score, faster; "
                        "the table then names one killer)")
    parser.add_argument("--min-score", type=float, default=0.9)
    parser.add_argument("--tests", nargs="+", default=list(SUITE), help="test files to run")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    args = parser.parse_args(argv)

    problems = check_sources(all_mutants)
    if problems:
        print("mutation check: mutants no longer match the sources:", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 2
    mutants = [m for m in all_mutants if not args.select or any(k in m.name for k in args.select)]
    if args.list:
        for m in mutants:
            print(f"{m.name:<40} {m.path:<24} {m.what}")
        return 0
    if not mutants:
        print(f"no mutant matches {' or '.join(args.select)!r}", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(prefix="replayllm-mutants-") as tmp:
        work = Path(tmp)
        if not args.no_baseline:
            print("baseline: the unmutated suite must pass ...", flush=True)
            status, seconds, killers, detail = evaluate(None, work, args)
            if status != "survived":
                print(f"baseline {status} in {seconds:.0f}s: {'; '.join(killers)} {detail}")
                return 2
            print(f"baseline passes in {seconds:.0f}s", flush=True)
        outcomes: list[Outcome] = []

        def one(m: Mutant) -> Outcome:
            status, seconds, killers, detail = evaluate(m, work, args)
            out = Outcome(m, status, seconds, killers, detail)
            print(f"  {m.name}: {status} ({seconds:.0f}s)", flush=True)
            return out

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            outcomes = list(pool.map(one, mutants))

    print_table(outcomes)
    killed = sum(o.status in ("killed", "timeout") for o in outcomes)
    errors = [o for o in outcomes if o.status == "error"]
    score = killed / len(outcomes)
    print(
        f"\nmutation score: {killed}/{len(outcomes)} killed = {score:.0%} "
        "(timeouts count as killed)"
    )
    survivors = [o.mutant.name for o in outcomes if o.status == "survived"]
    if survivors:
        print("survivors: " + ", ".join(survivors))
    if errors:
        print(
            "errors (the suite crashed; counted as not killed): "
            + ", ".join(o.mutant.name for o in errors)
        )
    return 0 if score >= args.min_score else 1


if __name__ == "__main__":
    sys.exit(main())
