"""`from leasing import ...` works before and after `django.setup()`, in a fresh interpreter."""

from __future__ import annotations

import pytest

import leasing

pytestmark = pytest.mark.django_db


def test_no_submodule_shadows_an_exported_function():
    import pkgutil

    submodules = {info.name for info in pkgutil.iter_modules(leasing.__path__)}
    functions = {name for name in leasing.__all__ if callable(getattr(leasing, name))}
    functions -= {name for name in leasing.__all__ if isinstance(getattr(leasing, name), type)}
    assert not submodules & functions


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        leasing.nonsense  # noqa: B018
