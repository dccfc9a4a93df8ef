"""Typed configuration fields: a config dataclass's values checked against its declared types.

Configurations reach the trainers from people: ``--agent-config FIELD=VALUE`` literals, and the
``config.json`` that ``--resume`` reads back.  A value of the wrong kind (a list for a learning
rate, a number for a tuple of layer widths) must be refused with a message naming the field
*before* anything is built, compiled or written — not surface as a traceback from deep inside a
jitted function after the run directory exists.

:func:`conform` gives a value in its field's declared type or raises ``ValueError``:

=====================  ==================================================================
declared type          accepted
=====================  ==================================================================
``bool``               ``True`` / ``False`` (NumPy bools too); not 0 or 1
``int``                integers (NumPy integers too); not bools, not floats such as 2.0
``float``              any real number but NaN (ints become floats; ±inf passes: ranges are
                       each config's own business); a JAX value passes as it is (the
                       compiled loop vmaps over some settings)
``str``                strings
``tuple[T, ...]``      a list or tuple whose every element conforms to ``T``
``tuple``              a list or tuple; inner lists become tuples (``env_options`` pairs)
``X | None``           ``None``, or what ``X`` accepts
``Any``                anything (the caller checks it)
a dataclass            an instance of it (:func:`dataclass_from_json` builds one from JSON)
=====================  ==================================================================

:func:`conform_fields` applies it to every field of a frozen dataclass instance (for
``__post_init__``); :func:`check_ranges` checks named numeric fields against the usual bounds
(counts, positive, non-negative, fractions); :func:`dataclass_from_json` rebuilds a dataclass
from its ``dataclasses.asdict`` JSON form, requiring every field and recursing into nested
dataclasses.

Fields by path, for the presets (``rlhp_jax.presets``) and the command lines generated from the
configs (``experiments/cli.py``): :func:`field_paths` lists every leaf field of a config with
nested configs' fields as ``"ensemble.num_members"``; :func:`with_changes` applies changes given
by path to a config's keyword arguments, each value conformed; :func:`from_text` reads a
command-line value in a field's declared type; :func:`field_docs` gives each field's source
comment (the help text of its flag).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import json
import math
import textwrap
import tokenize
import types
import typing
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rlhp_jax.preferences import is_concrete


def describe(value: Any) -> str:
    """A value as an error message shows it (short)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@functools.lru_cache(maxsize=None)
def field_types(cls) -> dict[str, Any]:
    """The declared (evaluated) type of every field of the dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def optional_type(hint) -> Any | None:
    """``X`` for a declared ``X | None`` (or ``Optional[X]``), else None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0]
    return None


def conform(hint, value: Any, name: str) -> Any:
    """``value`` in the declared type ``hint`` of field ``name`` (see the module docstring), or a
    ``ValueError`` saying ``"<name> must be <kind>, got <value>"``."""
    inner = optional_type(hint)
    if inner is not None:
        return None if value is None else conform(inner, value, name)
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise ValueError(f"{name} must be True or False, got {describe(value)}")
    if hint is int:
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
            return int(value)
        raise ValueError(f"{name} must be an int, got {describe(value)}")
    if hint is float:
        if isinstance(value, jax.Array):  # tracers included
            return value
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
            try:
                number = float(value)
            except OverflowError:  # an int beyond float range
                raise ValueError(f"{name} must be a float, got {describe(value)}") from None
            if math.isnan(number):
                raise ValueError(f"{name} must be a number, got nan")
            return number
        raise ValueError(f"{name} must be a float, got {describe(value)}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"{name} must be a string, got {describe(value)}")
    if hint is tuple or typing.get_origin(hint) is tuple:
        return _conform_tuple(hint, value, name)
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        raise ValueError(f"{name} must be a {hint.__name__}, got {describe(value)}")
    raise TypeError(f"{name}: conform does not know the declared type {hint!r}")


def _conform_tuple(hint, value, name: str) -> tuple:
    args = typing.get_args(hint)
    if not isinstance(value, (list, tuple)):
        kind = f"a tuple of {args[0].__name__}s" if len(args) == 2 and args[1] is Ellipsis else "a tuple"
        raise ValueError(f"{name} must be {kind}, got {describe(value)}")
    if len(args) == 2 and args[1] is Ellipsis:  # tuple[T, ...]
        try:
            return tuple(conform(args[0], x, name) for x in value)
        except ValueError:
            raise ValueError(f"{name} must be a tuple of {args[0].__name__}s, got {describe(value)}") from None
    if args:
        raise TypeError(f"{name}: conform does not know the declared type {hint!r}")
    return tuple(tuple(x) if isinstance(x, list) else x for x in value)


def conform_fields(instance) -> None:
    """Check every field of a frozen dataclass ``instance`` against its declared type, storing the
    conformed values (an int given for a float field becomes a float, a list a tuple).  For
    ``__post_init__``; raises ``ValueError`` naming the first field that does not conform."""
    for name, hint in field_types(type(instance)).items():
        value = getattr(instance, name)
        fixed = conform(hint, value, name)
        if fixed is not value:
            object.__setattr__(instance, name, fixed)


MAX_COUNT = 2**31 - 1  # the compiled programs count steps, labels and episodes in int32


def check_ranges(cfg, *, counts=(), positive=(), nonnegative=(), fractions=()) -> None:
    """The named fields of ``cfg`` within their bounds: ``counts`` >= 1, ``positive`` > 0,
    ``nonnegative`` >= 0, ``fractions`` in [0, 1], and every one finite and at most
    :data:`MAX_COUNT` (a hand-edited ``config.json`` asking for 10**20 steps ended in a NumPy or XLA
    traceback); None (an unset optional field) and traced values pass.  Raises
    ``ValueError("<field> must be ..., got <value>")``."""
    rules = ((counts, lambda v: v >= 1, "must be at least 1"), (positive, lambda v: v > 0, "must be > 0"),
             (nonnegative, lambda v: v >= 0, "must be >= 0"), (fractions, lambda v: 0 <= v <= 1, "must be in [0, 1]"))
    for names, ok, requirement in rules:
        for name in names:
            value = getattr(cfg, name)
            if value is None or not is_concrete(value):
                continue
            if not ok(value):
                raise ValueError(f"{name} {requirement}, got {value}")
            if not (math.isfinite(value) and value <= MAX_COUNT):
                raise ValueError(f"{name} must be finite and at most {MAX_COUNT:,}, got {value}")


SWEEP_KEY = "sweep"  # experiments.sweep's config.json: its base run config, and the sweep's own flags under this key


def is_sweep_config(saved: Any) -> bool:
    """Whether a ``config.json``'s content is a sweep's (``experiments.sweep``), not a run's: it holds
    a run's fields too, so every reader of run directories asks this first."""
    return isinstance(saved, dict) and SWEEP_KEY in saved


def config_object(directory) -> dict | None:
    """``directory``'s ``config.json`` as a plain JSON object, unchecked, or None where it is missing
    or is not one (a run killed while writing it, a damaged file): for tools that only look at what
    a directory holds (a grid's plan, a sweep's output directory, the labeling tools)."""
    path = Path(directory) / "config.json"
    try:
        if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:  # a FIFO would be read for ever
            return None
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return config if isinstance(config, dict) else None


MAX_CONFIG_BYTES = 1 << 20  # a run's config.json is a few kB; nothing larger is read as one


# Fields added after runs had been written, each with the value that does what every run before it
# did: a config.json without one of these is read with that value, so older runs resume and count in
# the grids.  Any other missing field is still refused.
ADDED_FIELDS: dict[tuple[str, str], Any] = {
    ("EnsembleConfig", "next_obs"): False,  # r̂ of (o_t, a_t), as before the option
    ("EnsembleConfig", "use_action"): True,  # A.1's MLP reads the action, as before the option
}


def dataclass_from_json(cls, values: Any, where: str = ""):
    """``cls`` rebuilt from its ``dataclasses.asdict`` JSON form (what ``config.json`` holds).

    Every field must be present (a file from another version is refused rather than completed
    with today's defaults), except those of ``ADDED_FIELDS``, whose value there reproduces the runs
    written before them; keys that are no field are ignored.  Nested dataclass fields are
    rebuilt from their JSON objects in turn; a field the caller has already built is kept.
    Raises ``ValueError`` naming the field (``where``: the path of ``values``, for the message)."""
    label = where or cls.__name__
    if not isinstance(values, dict):
        raise ValueError(f"{label} must be a JSON object, got {describe(values)}")
    types_ = field_types(cls)
    values = {**{name: old for (owner, name), old in ADDED_FIELDS.items()
                 if owner == cls.__name__ and name in types_ and name not in values}, **values}
    missing = [name for name in types_ if name not in values]
    if missing:
        raise ValueError(f"{label} lacks {', '.join(missing)}")
    kwargs = {}
    for name, hint in types_.items():
        path = f"{where}.{name}" if where else name
        value = values[name]
        if dataclasses.is_dataclass(hint) and not isinstance(value, hint):
            kwargs[name] = dataclass_from_json(hint, value, path)
        else:
            kwargs[name] = conform(hint, value, path)
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise ValueError(f"{where}: {e}" if where else str(e)) from None


# ------------------------------------------------------------------ fields by path
def field_paths(cls, skip=(), prefix: str = "") -> list[tuple[str, Any]]:
    """``(path, declared type)`` of every leaf field of the dataclass ``cls``, in declaration
    order, nested dataclass fields expanded (``"ensemble.num_members"``); ``skip``: paths left
    out, with everything under them."""
    out = []
    for name, hint in field_types(cls).items():
        path = prefix + name
        if path in skip:
            continue
        if dataclasses.is_dataclass(hint):
            out += field_paths(hint, skip, path + ".")
        else:
            out.append((path, hint))
    return out


def field_default(cls, name: str) -> Any:
    """The default value of field ``name`` of the dataclass ``cls`` (``MISSING`` when it has none)."""
    f = cls.__dataclass_fields__[name]
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def type_at(cls, path: str) -> Any:
    """The declared type of the field at ``path`` of ``cls``; ``ValueError`` if there is none."""
    head, _, rest = path.partition(".")
    hints = field_types(cls)
    if head not in hints:
        raise ValueError(f"{cls.__name__} has no field {head!r} ({path})")
    if rest:
        if not dataclasses.is_dataclass(hints[head]):
            raise ValueError(f"{cls.__name__}.{head} is not a config with fields ({path})")
        return type_at(hints[head], rest)
    return hints[head]


def with_changes(cls, values: dict, changes: dict) -> dict:
    """``values`` (keyword arguments for the dataclass ``cls``) with ``changes`` made.

    A key of ``changes`` is a field's path: ``"segment_length"``, or ``"ensemble.num_members"`` for
    a field of a nested config, which changes a copy of that config (the one in ``values``, else
    the field's default); a nested config's name may also take a dict of its fields' changes or a
    whole instance.  Every value is conformed to its field's declared type (:func:`conform`: an
    int given for a float becomes a float).  Raises ``ValueError`` naming the path: an unknown
    field, a value of the wrong kind, or what the nested config's own checks refuse."""
    flat = {}
    for key, value in changes.items():
        hint = type_at(cls, key)
        if isinstance(value, dict) and dataclasses.is_dataclass(hint):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    out = dict(values)
    for path in sorted(flat, key=lambda p: p.count(".")):  # whole configs before their fields
        head, _, rest = path.partition(".")
        if rest:
            type_at(cls, path)
            base = out[head] if head in out else field_default(cls, head)
            out[head] = _replaced(base, rest, flat[path], head)
        else:
            out[head] = conform(field_types(cls)[head], flat[path], path)
    return out


def _replaced(instance, path: str, value: Any, where: str):
    """The dataclass ``instance`` with the field at ``path`` set to ``value`` (conformed)."""
    head, _, rest = path.partition(".")
    name = f"{where}.{head}"
    new = (_replaced(getattr(instance, head), rest, value, name) if rest
           else conform(field_types(type(instance))[head], value, name))
    return dataclasses.replace(instance, **{head: new})


def from_text(hint, text: str, name: str) -> Any:
    """A command-line value for a field of declared type ``hint``: ``none`` for an optional
    field's None, ``true``/``false`` for a bool, a number, a string as written, a Python literal
    for a tuple (``"(('noop_max', 30),)"``); then :func:`conform`.  ``ValueError`` naming ``name``."""
    inner = optional_type(hint)
    if inner is not None:
        return None if text.strip().lower() == "none" else from_text(inner, text, name)
    if hint is bool:
        words = {"true": True, "false": False}
        if text.strip().lower() not in words:
            raise ValueError(f"{name} must be true or false, got {text!r}")
        return words[text.strip().lower()]
    if hint is int or hint is float:
        try:
            value = hint(text)
        except ValueError:
            raise ValueError(f"{name} must be {'an int' if hint is int else 'a number'}, got {text!r}") from None
        return conform(hint, value, name)
    if hint is str or hint is Any:
        return text
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(f"{name}: cannot parse {text!r} (a Python literal)") from None
    return conform(hint, value, name)


@functools.lru_cache(maxsize=None)
def field_docs(cls) -> dict[str, str]:
    """Each field of the dataclass ``cls`` with its comment in the source: the comment lines just
    above the field and the comment after it on its line, joined ("" for a field with none; {}
    when the source cannot be read)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, tokenize.TokenError):
        return {}
    lines = source.splitlines()
    comments = {t.start[0]: t.string.lstrip("#").strip() for t in tokens if t.type == tokenize.COMMENT}
    alone = {n for n in comments if lines[n - 1].lstrip().startswith("#")}
    docs = {}
    for node in tree.body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above, n = [], node.lineno - 1
            while n in alone:
                above.insert(0, comments[n])
                n -= 1
            after = [comments[node.lineno]] if node.lineno in comments else []
            docs[node.target.id] = " ".join(above + after)
    return docs
