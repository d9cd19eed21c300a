"""The start-up heap kept out of the garbage collector's oldest-generation passes.

An engine's start-up leaves a large heap that lives as long as the engine (the model's modules,
the tokenizer, compiled kernels, the block pool, imported libraries): ~170k tracked objects on a
CPU, more on a GPU host. A full collection walks every one of them and stops every thread of the
process while it does; allocations during a long run trigger one now and then, and the engine's
next step waits for it (docs/gpu-notes.md, session 22). Freezing the heap once start-up is done
(``gc.freeze``) leaves it out of every later pass; what the run allocates is still collected.
vLLM, SGLang and TensorRT-LLM do the same after their warm-up.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect the garbage start-up left, then freeze every object alive; return how many are
    frozen.

    An earlier freeze is undone first, so a process that starts engines in turn collects what a
    dropped one left (frozen objects in a reference cycle are never collected while frozen)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def release_heap() -> None:
    """Undo the freeze (an engine closed): the frozen objects are collected as usual again,
    those of any other engine still open in the process too (the next start-up freezes anew)."""
    gc.unfreeze()
