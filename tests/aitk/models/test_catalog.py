"""The torch-free list of built-in archs equals what the registry imports."""

from __future__ import annotations

from aitk.models import catalog, registry


def test_static_builtin_archs_match_the_registry():
    found = registry.discover(include_repo_extensions=False)
    assert catalog.builtin_archs() == set(found.models)


def test_extension_packages_are_seen(tmp_path):
    assert not catalog.has_extensions(tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "__init__.py").write_text("")
    assert catalog.has_extensions(tmp_path)
