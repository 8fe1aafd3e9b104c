"""config/values.py: the typed view of every knob, generated from the knob table (docsgen.render_typed_values).

The file is held current by test_docsgen's stale check; here every value the resolver can give, in each mode, with
the profiles' defaults and with a value set for every knob, must have the type the view declares, so mypy's
checks on `settings.knobs.NAME` rest on the truth."""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest

from hyperqwen.config.knobs import KNOBS, MODES
from hyperqwen.config.settings import format_value, resolve_settings
from hyperqwen.config.values import KnobValues

HINTS = typing.get_type_hints(KnobValues)
KNOB_NAMES = [f.name.upper() for f in dataclasses.fields(KnobValues)]


def has_type(value: object, hint: object) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(has_type(value, arg) for arg in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin is tuple:
        return isinstance(value, tuple) and all(isinstance(word, str) for word in value)
    if hint is type(None):
        return value is None
    if hint in (int, float):
        return isinstance(value, (int, float) if hint is float else int) and not isinstance(value, bool)
    assert isinstance(hint, type), hint
    return isinstance(value, hint)


def test_the_view_names_every_knob_once():
    assert list(KNOB_NAMES) == [k.name for k in KNOBS]
    assert list(HINTS) == [k.name.lower() for k in KNOBS]


@pytest.mark.parametrize("mode", MODES)
def test_every_default_has_the_declared_type(mode):
    settings = resolve_settings({}, mode=mode)
    values = settings.knobs
    for name in KNOB_NAMES:
        assert has_type(getattr(values, name.lower()), HINTS[name.lower()]), (name, settings[name])


def test_a_value_set_for_each_knob_has_the_declared_type():
    """Each knob set to its own default written as text (what .env would hold), or to its first choice."""
    environ = {}
    for knob in KNOBS:
        text = knob.choices[-1] if knob.kind == "choice" else format_value(knob, knob.default)
        if text and not knob.secret:
            environ[knob.name] = text
    settings = resolve_settings(environ, mode="single")
    for name in environ:
        assert settings.explicit(name), name
        assert has_type(getattr(settings.knobs, name.lower()), HINTS[name.lower()]), (name, settings[name])
