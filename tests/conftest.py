import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped where there is none)")


def pytest_collection_modifyitems(config, items):
    from pykda import runtime
    if runtime.gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh, empty kernel cache directory for this test (memory cache cleared too)."""
    from pykda.runtime import cache
    monkeypatch.setenv(cache.ENV_CACHE_DIR, str(tmp_path / "kernels"))
    monkeypatch.setattr(cache, "_modules", {})
    return tmp_path / "kernels"
