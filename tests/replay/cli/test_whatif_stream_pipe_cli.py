"""``whatif --workload PIPE --stream``: the streamed run reads its workload once to check it and
once per variant, and a pipe's second read is empty, so it simulated 0 requests and exited 0 (a
table of "n/a", a wrong answer in silence). A pipe is now one line, exit 2, before any read."""

from __future__ import annotations

import os
import threading

from _cli import run_cli


def test_a_piped_workload_is_refused_by_the_streamed_run(tmp_path) -> None:
    rows = "".join('{"prompt": [1, 2, 3, 4], "max_tokens": 4}\n' for _ in range(5))
    fifo = tmp_path / "w.jsonl"
    os.mkfifo(fifo)

    def feed() -> None:  # a writer as a shell's <(...) has one, fed until the reader is gone
        try:
            with open(fifo, "w") as handle:
                for _ in range(3):
                    handle.write(rows)
        except OSError:
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    try:
        code, text, err = run_cli(["whatif", "--workload", str(fifo), "--stream", "--set",
                                   "num_kvcache_blocks=64", "--no-plots", "--out",
                                   str(tmp_path / "o")])
    finally:  # release a writer still waiting for a reader
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(timeout=5)
    assert code == 2, text + err
    assert "must be a regular file, not a pipe" in err
    assert "Traceback" not in err and not (tmp_path / "o").exists()
