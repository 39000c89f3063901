"""Exception types raised by cupygemm.

Bad arguments raise the built-in ``ValueError`` / ``TypeError``; failures of the
toolchain or the device raise subclasses of :class:`CupygemmError`.
"""
from __future__ import annotations


class CupygemmError(RuntimeError):
    """Base class of cupygemm's own errors (compilation, device, cache)."""


class CupygemmCompileError(CupygemmError):
    """NVRTC rejected a kernel. Carries the compiler log and the kernel config."""

    def __init__(self, message: str, log: str = "", config: object = None):
        super().__init__(f"{message}\n--- NVRTC log ---\n{log}" if log else message)
        self.log = log
        self.config = config


class CupygemmDeviceError(CupygemmError):
    """No usable GPU (none, wrong compute capability, driver too old) or a driver call failed."""


class CupygemmToolchainError(CupygemmError):
    """NVRTC (or another CUDA library we load) is missing or unusable."""


class CupygemmCacheError(CupygemmError):
    """A cache archive does not match this installation (version, NVRTC, arch, SM count, sources) or is damaged."""
