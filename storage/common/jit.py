"""numba.njit with an on-disk cache wherever the package is installed.

numba caches compiled kernels beside the source, else in the user's cache dir (~/.cache/numba); where
neither is writable (a read-only site-packages and HOME on a cluster node) numba.njit(cache=True)
refuses at import ("no locator available"). Then kernels cache under the temp dir, and failing that
compile without a cache (each process then compiles what it uses, about a second per kernel family).
Set NUMBA_CACHE_DIR to choose the place.
"""

from __future__ import annotations

import os
import tempfile
import threading
from typing import Any


def _no_locator(exc: RuntimeError) -> bool:
    return "no locator available" in str(exc)


def njit(**kwargs):
    """numba.njit(cache=True, **kwargs), falling back as the module docstring says."""
    import numba  # here, so that importing this module (for lazy_kernel) loads no numba

    def wrap(fn):
        try:
            return numba.njit(cache=True, **kwargs)(fn)
        except RuntimeError as exc:
            if not _no_locator(exc):
                raise
        config: Any = numba.config  # settings are module attributes numba sets at import
        if not config.CACHE_DIR:
            uid = os.getuid() if hasattr(os, "getuid") else "user"
            config.CACHE_DIR = os.path.join(tempfile.gettempdir(), f"kafkalog-numba-{uid}")
            try:
                return numba.njit(cache=True, **kwargs)(fn)
            except RuntimeError as exc:
                if not _no_locator(exc):
                    raise
        return numba.njit(cache=False, **kwargs)(fn)

    return wrap


def lazy_kernel(fn, **kwargs):
    """A getter for njit(**kwargs)(fn), compiled (or loaded from the cache) on its first call: code that
    runs fn in plain Python for small inputs never pays for numba. Threads that ask at once (a table pass
    reads partitions in threads) get the one kernel, made once."""
    kernel = None
    lock = threading.Lock()

    def get():
        nonlocal kernel
        if kernel is None:
            with lock:
                if kernel is None:
                    kernel = njit(**kwargs)(fn)
        return kernel

    return get
