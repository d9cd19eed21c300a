"""Where the Triton kernel tests run: compiled on CUDA, else in Triton's interpreter on CPU.

Import this before any kernel module. Without triton the importing test module is skipped.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # Must be set before the kernels are decorated: triton.jit picks the interpreter then.
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton", reason="triton is not installed (CPU CI has none)")
DEVICE = "cuda" if HAS_CUDA else "cpu"


def _interpreter_numpy2_shim() -> None:
    """Let the interpreter run loops with run-time bounds under numpy 2.

    Triton 3.6's interpreter holds scalars as 1-element arrays and converts them for ``range``
    with ``int(array)``, which numpy 2 refuses for arrays of rank 1; ``.item()`` is the same value.
    Compiled kernels are unaffected.
    """
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "numpy2_shim", False):
        return

    def patch(tensor: type, scope: object) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch.numpy2_shim = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patch


def load_kernel_modules(*names: str) -> list[ModuleType]:
    """Import the kernel modules, decorated for the interpreter when there is no CUDA."""
    modules = [importlib.import_module(name) for name in names]
    if not HAS_CUDA:
        _interpreter_numpy2_shim()
        # Another test may have imported them before the interpreter switch: decorate again.
        modules = [importlib.reload(module) for module in modules]
    return modules
