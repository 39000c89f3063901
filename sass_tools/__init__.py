"""sass_tools: read, inspect and patch NVIDIA sm_90a cubins (pure Python, no GPU needed).

Modules:
    :mod:`sass_tools.elf`        cubin (ELF64, CUDA 12 ABI 7 and CUDA 13 ABI 8) parsing and in-place patching
    :mod:`sass_tools.sass`       128-bit instruction decode / re-encode (control fields, predicate, FP32 operands)
    :mod:`sass_tools.interleave` the FFMA yield/reuse interleave pass

Command line: ``python -m sass_tools info|dump|interleave FILE.cubin``.
"""

PASS_VERSION: str = "1"
"""Version of the interleave pass output; bump whenever the bytes it produces for some input could change
(the JIT puts it in its cache key)."""

__version__ = "0.1.0"

from . import elf, sass, interleave  # noqa: E402
from .elf import Cubin, Kernel  # noqa: E402
from .interleave import InterleaveResult, KernelReport, interleave_ffma, is_interleaved  # noqa: E402
from .sass import Instruction, decode  # noqa: E402

__all__ = [
    "PASS_VERSION",
    "Cubin",
    "Kernel",
    "Instruction",
    "decode",
    "interleave_ffma",
    "is_interleaved",
    "InterleaveResult",
    "KernelReport",
    "elf",
    "sass",
    "interleave",
]
