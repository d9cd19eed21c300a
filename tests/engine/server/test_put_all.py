"""The frontend hands a step's first tokens to their streams before the other tokens of the
step, so a new request's first chunk is not written after every other stream's; each stream's
own items keep their order."""

from __future__ import annotations

import asyncio

from engine.sampling_params import SamplingParams
from engine.server.engine_loop import RequestStream, put_all


def _stream() -> RequestStream:
    return RequestStream([1, 2, 3], SamplingParams(max_tokens=4), 0.0)


def test_first_tokens_wake_their_tasks_first_and_each_stream_keeps_its_order() -> None:
    async def run() -> tuple[list[str], dict[str, list[tuple]]]:
        old = [_stream() for _ in range(3)]
        for stream in old:
            stream.answered = True
        new = _stream()
        names = {id(s): n for s, n in zip([*old, new], ["a", "b", "c", "new"])}
        woke: list[str] = []
        got: dict[str, list[tuple]] = {n: [] for n in names.values()}

        async def read(stream: RequestStream, items: int) -> None:
            for _ in range(items):
                item = await stream.queue.get()
                woke.append(names[id(stream)])
                got[names[id(stream)]].append(item)

        tasks = [asyncio.ensure_future(read(s, 1)) for s in old]
        tasks.append(asyncio.ensure_future(read(new, 2)))
        await asyncio.sleep(0)  # every reader waits on its queue
        put_all([(old[0], [7], None, None), (old[1], [8], None, None),
                 (old[2], [9], None, None), (new, [5], None, None), (new, [], "length", None)])
        await asyncio.gather(*tasks)
        return woke, got

    woke, got = asyncio.run(run())
    assert woke[0] == "new"  # its first token before the step's other three
    assert got["new"] == [([5], None, None), ([], "length", None)]  # its finish after it
    assert [got[n] for n in "abc"] == [[([7], None, None)], [([8], None, None)],
                                       [([9], None, None)]]


def test_a_stream_is_answered_once_a_token_reaches_it() -> None:
    stream, finished = _stream(), _stream()
    put_all([(stream, [4], None, None), (finished, [], "abort", None)])
    assert stream.answered and not finished.answered
