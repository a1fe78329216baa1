"""Every exception notifier defines sits under ``NotifierError``, so one ``except`` (the CLI's,
a test's) tells the errors notifier raises on purpose from the unexpected."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import notifier
from notifier.errors import AdapterCrash, InvalidInput, NotifierError


def _exception_classes() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for module_info in pkgutil.walk_packages(notifier.__path__, "notifier."):
        if module_info.name == "notifier.__main__":
            continue  # running it is the CLI
        module = importlib.import_module(module_info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == module.__name__:
                found.append(value)
    return found


def test_every_exception_of_notifier_is_a_notifier_error() -> None:
    classes = _exception_classes()
    assert len(classes) > 10  # the walk found the package's modules
    assert [c.__qualname__ for c in classes if not issubclass(c, NotifierError)] == []


def test_refused_input_and_adapter_crashes_have_one_base_each() -> None:
    by_name = {c.__name__: c for c in _exception_classes()}
    for name in ("InvalidChannelConfig", "JsonRefused", "BodyRefused"):
        assert issubclass(by_name[name], InvalidInput)
        assert issubclass(by_name[name], ValueError)  # msgspec's __post_init__ contract
    for name in ("WebhookAdapterCrash", "TelegramAdapterCrash"):
        assert issubclass(by_name[name], AdapterCrash)
