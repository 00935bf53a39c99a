"""The base of every user setting: one typed pydantic model per mapping, each key declared once with its type,
default, bounds and help (``Field(description=...)``), and one-line errors that name the key and the fix.

Data flow position: before anything runs. A capture-spec YAML (:class:`vllm_eagle3.resolve.SpecFile`), vLLM's
``--additional-config`` ``vllm_eagle3`` mapping, its ``check:`` (:mod:`vllm_eagle3.wiring_check`), ``watch:``
(:mod:`vllm_eagle3.watch`) and live-k settings load into subclasses of :class:`Settings`; a bad key or value raises
the owning module's exception (``error``) with one line from :func:`one_line`, never pydantic's multi-line dump.
Strict: YAML and JSON give real types, so ``"yes"`` is no bool, ``512.5`` no int, ``true`` no number, NaN no bound.
"""

from __future__ import annotations

import types
import typing
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["Settings", "field_help", "one_line"]


class Settings(BaseModel):
    """A frozen, strict mapping of settings that rejects unknown keys. Subclasses set ``section`` (the mapping's name
    in messages, e.g. ``check``) and ``error`` (the exception their module raises), and declare each key as
    ``name: type = Field(default, ge=..., description="one line of meaning")``. Constructing one directly, or through
    :meth:`from_mapping`, raises ``error`` with :func:`one_line`'s message."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    section: ClassVar[str] = ""
    error: ClassVar[type[Exception]] = ValueError
    list_key_help: ClassVar[bool] = False  # an unknown key lists every known key WITH its help (short mappings)

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise self.error(one_line(exc, type(self), "", self.section)) from None

    @classmethod
    def from_mapping(cls, data: Any, where: str = "", context: Any = None):
        """A YAML/JSON value -> settings: ``None`` gives the defaults; anything else must be a mapping of known keys.
        ``where`` (e.g. ``capture spec x.yaml``) leads the error line; ``context`` reaches the validators."""
        if data is None:
            data = {}
        try:
            return cls.model_validate(data, context=context)
        except ValidationError as exc:
            raise cls.error(one_line(exc, cls, where, cls.section)) from None

    @classmethod
    def help_table(cls) -> dict[str, str]:
        """Every key with its help line, in declaration order (for docs and ``--help``)."""
        return {name: field_help(cls, name) for name in cls.model_fields}


# ------------------------------------------------------------------------------------------------ help and errors

_KINDS = {bool: "bool", int: "int", float: "number", str: "string"}


def field_help(model: type[BaseModel], name: str) -> str:
    """One line for a key, from its declaration alone: kind, bounds, default, meaning.
    E.g. ``number in (0, 0.5] (default 0.02): at most this fraction of the engine's time goes to the check``."""
    field = model.model_fields[name]
    kinds = [a for a in typing.get_args(field.annotation) or (field.annotation,) if a is not type(None)]
    kind = _KINDS.get(kinds[0], "") if len(kinds) == 1 else ""
    low = high = ""
    for m in field.metadata:  # annotated_types' Gt/Ge/Lt/Le, as Field(gt=..., ...) records them
        if getattr(m, "gt", None) is not None:
            low = f"({m.gt}"
        elif getattr(m, "ge", None) is not None:
            low = f"[{m.ge}"
        elif getattr(m, "lt", None) is not None:
            high = f"{m.lt})"
        elif getattr(m, "le", None) is not None:
            high = f"{m.le}]"
    if low and high:
        bounds = f"in {low}, {high}"
    else:
        bounds = (f"> {low[1:]}" if low[0] == "(" else f">= {low[1:]}") if low else ""
        bounds = bounds or ((f"< {high[:-1]}" if high[-1] == ")" else f"<= {high[:-1]}") if high else "")
    default = None if field.is_required() else field.get_default(call_default_factory=True)
    optional = "optional" if default is None and not field.is_required() else ""
    shown = f"(default {_show(default)})" if default is not None else ""
    head = " ".join(p for p in (optional, kind, bounds, shown) if p)
    return f"{head}: {field.description}" if head else str(field.description)


def one_line(exc: ValidationError, model: type[BaseModel], where: str = "", section: str = "") -> str:
    """Pydantic's errors -> ONE line naming the key, what is wrong and the fix, in the form of the rest of the
    package: ``{where}: {section}.{key} = {value!r} is invalid ({problem}): {help}``; an unknown key:
    ``{where}: unknown key(s) ['x']; known keys: a, b``. Unknown keys are told first (a typo explains the rest), then
    the first other error in declaration order. A validator's own message (a ``ValueError`` raised with the fix
    already in it) is kept as written."""
    errors = exc.errors(include_url=False)
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    lead = f"{where}: " if where else ""
    if unknown:
        parent = unknown[0]["loc"][:-1]
        names = sorted(str(e["loc"][-1]) for e in unknown if e["loc"][:-1] == parent)
        owner = _model_at(model, parent)
        if owner is not None and getattr(owner, "list_key_help", False):
            known = "allowed keys: " + "; ".join(f"{k}: {field_help(owner, k)}" for k in owner.model_fields)
        else:
            known = "known keys: " + ", ".join(owner.model_fields if owner is not None else ())
        return f"{lead}{_path(section, parent)}{': ' if parent or section else ''}unknown key(s) {names}; {known}"
    e = errors[0]
    loc, value = e["loc"], e.get("input")
    key = _path(section, loc)
    owner = _model_at(model, loc)
    if e["type"] in ("model_type", "dict_type") and owner is not None:
        subject = f"{lead}{key}" if key else (where or owner.__name__)
        return f"{subject} must be a mapping such as {_example(owner)}, got {value!r}"
    cause = (e.get("ctx") or {}).get("error")
    if isinstance(cause, getattr(owner, "error", ())) or (isinstance(cause, Exception) and not loc):
        return f"{lead}{cause}"  # a nested Settings' own line, or a model-level validator's message
    if e["type"] == "missing":
        return f"{lead}`{key}` is missing: {_help_at(model, loc)}"
    problem = str(cause) if isinstance(cause, Exception) else e["msg"][:1].lower() + e["msg"][1:]
    return f"{lead}{key} = {value!r} is invalid ({problem}): {_help_at(model, loc)}"


def _path(section: str, loc: tuple) -> str:
    return ".".join(str(p) for p in (section, *loc) if p != "")


def _show(value: Any) -> str:
    """A default as YAML writes it: ``true``, ``none``, ``600`` (not ``600.0``)."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "none"}[value]
    return f"{value:g}" if isinstance(value, float) else str(value)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The BaseModel classes an annotation names (``WatchConfig | None`` -> [WatchConfig])."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _models_in(a)]
    return []


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model whose mapping sits at ``loc`` (``()`` -> ``model`` itself), or None past a plain field."""
    for part in loc:
        field = model.model_fields.get(str(part))
        found = _models_in(field.annotation) if field is not None else []
        if not found:
            return None
        model = found[0]
    return model


def _help_at(model: type[BaseModel], loc: tuple) -> str:
    owner = _model_at(model, loc[:-1]) if loc else None
    name = str(loc[-1]) if loc else ""
    return field_help(owner, name) if owner is not None and name in owner.model_fields else "see the documentation"


def _example(model: type[BaseModel]) -> str:
    """``{enabled: true, window: 512}``: the first two keys with defaults, as YAML flow."""
    shown = [
        f"{n}: {_show(f.get_default(call_default_factory=True))}"
        for n, f in model.model_fields.items()
        if not f.is_required()
    ]
    return "{" + ", ".join(shown[:2]) + "}"
