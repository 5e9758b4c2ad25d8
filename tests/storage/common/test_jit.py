"""Kernels load where numba cannot cache beside the source or in ~/.cache (read-only installs)."""

import numba
import numba.core.caching as caching
import numpy as np

from storage.common import jit


def _kernel(a):
    s = 0
    for x in a:
        s += x
    return s


def test_kernels_cache_under_the_temp_dir_when_no_usual_place_is_writable(tmp_path, monkeypatch):
    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", [caching.UserProvidedCacheLocator])
    monkeypatch.setattr(numba.config, "CACHE_DIR", "")
    monkeypatch.setattr(jit.tempfile, "gettempdir", lambda: str(tmp_path))
    fn = jit.njit(nogil=True)(_kernel)
    assert fn(np.arange(10)) == 45
    assert numba.config.CACHE_DIR.startswith(str(tmp_path))
    assert any(p.suffix == ".nbi" for p in tmp_path.rglob("*")), "the compiled kernel was not cached"


def test_kernels_compile_uncached_when_nothing_is_writable(monkeypatch):
    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", [])
    monkeypatch.setattr(numba.config, "CACHE_DIR", "")
    fn = jit.njit(nogil=True)(_kernel)
    assert fn(np.arange(4)) == 6
