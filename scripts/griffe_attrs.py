"""A griffe extension for the API reference: attrs classes get the ``__init__`` attrs writes for them.

griffe reads the source without importing it, so an ``@define`` / ``@frozen`` class has no ``__init__`` to
show, and the reference listed ``Chunk``, ``Hit`` or ``LiveRecord`` without their constructor or defaults. This
extension writes that ``__init__`` statically, the way attrs does: every annotated class attribute that is not a
``ClassVar`` becomes a parameter, in definition order, after the inherited attrs classes' ones; ``field(default=)``
and ``field(factory=)`` give its default (a factory shows as its call, ``list()``, a lambda as its body),
``field(init=False)`` leaves it out, ``field(alias=)`` names it, a private ``_name`` is passed as ``name``, and
``kw_only`` (on the decorator or the field) makes it keyword-only. With ``merge_init_into_class`` the class's
heading then shows the signature.
Used by ``mkdocs.yml``; not part of the package.
"""

from __future__ import annotations

from typing import Any

import griffe

#: The decorators that make an attrs class (``from attrs import define, frozen`` and the ``attr`` spellings).
DECORATORS = frozenset(
    f"{module}.{name}"
    for module in ("attrs", "attr")
    for name in ("define", "frozen", "mutable", "s", "attrs", "dataclass")
)
FIELDS = frozenset({"attrs.field", "attr.field", "attr.ib", "attr.attrib", "attrs.attrib"})
FACTORIES = frozenset({"attrs.Factory", "attr.Factory"})


def _decorator(cls: griffe.Class) -> griffe.Expr | str | None:
    for decorator in cls.decorators:
        value = decorator.value
        path = _path(value.function if isinstance(value, griffe.ExprCall) else value)
        if path in DECORATORS:
            return value
    return None


def _path(value: object) -> str | None:
    return value.canonical_path if isinstance(value, griffe.Expr) else None


def _arguments(call: object) -> dict[str, Any]:
    """The keyword arguments of a call expression (``{}`` for anything else)."""
    if not isinstance(call, griffe.ExprCall):
        return {}
    return {a.name: a.value for a in call.arguments if isinstance(a, griffe.ExprKeyword)}


def _is_true(value: object) -> bool:
    return str(value) == "True"


def _parameters(cls: griffe.Class) -> list[griffe.Parameter]:
    """The ``__init__`` parameters ``cls``'s own attributes give (not its bases')."""
    options = _arguments(_decorator(cls))
    if str(options.get("init")) == "False":
        return []
    out = []
    for member in cls.members.values():
        if member.is_alias or not isinstance(member, griffe.Attribute) or member.annotation is None:
            continue
        if "property" in member.labels or (
            "class-attribute" in member.labels and "instance-attribute" not in member.labels
        ):
            continue  # a property or a ClassVar: not a field
        value = member.value
        field = _arguments(value) if isinstance(value, griffe.ExprCall) and _path(value.function) in FIELDS else None
        if field is not None and str(field.get("init")) == "False":
            continue
        default: str | griffe.Expr | None
        if field is None:
            default = value
        elif "factory" in field:
            factory = field["factory"]  # a lambda shows as what it makes, anything else as its call
            lam = isinstance(factory, griffe.ExprLambda) and not factory.parameters
            default = factory.body if lam else griffe.ExprCall(function=factory, arguments=[])
        else:
            default = field.get("default")
            if isinstance(default, griffe.ExprCall) and _path(default.function) in FACTORIES:
                default = griffe.ExprCall(function=default.arguments[0], arguments=[])
        name = str(field["alias"]).strip("'\"") if field and "alias" in field else member.name.lstrip("_")
        keyword = _is_true(options.get("kw_only")) or (field is not None and _is_true(field.get("kw_only")))
        kind = griffe.ParameterKind.keyword_only if keyword else griffe.ParameterKind.positional_or_keyword
        out.append(griffe.Parameter(name, annotation=member.annotation, kind=kind, default=default))
    return out


def attrs_init(cls: griffe.Class) -> griffe.Function | None:
    """The ``__init__`` attrs writes for ``cls`` (``None``: not an attrs class, or it writes its own)."""
    if _decorator(cls) is None or "__init__" in cls.members:
        return None
    try:
        bases = [c for c in reversed(cls.mro()) if _decorator(c) is not None]
    except ValueError:  # a base griffe cannot resolve
        bases = []
    merged: dict[str, griffe.Parameter] = {}
    for owner in (*bases, cls):
        for parameter in _parameters(owner):
            merged.pop(parameter.name, None)
            merged[parameter.name] = parameter  # a redefined field moves to its new place, as in attrs
    params = list(merged.values())
    ordered = [p for p in params if p.kind is not griffe.ParameterKind.keyword_only]
    ordered += [p for p in params if p.kind is griffe.ParameterKind.keyword_only]
    self = griffe.Parameter("self", kind=griffe.ParameterKind.positional_or_keyword)
    return griffe.Function(
        "__init__", lineno=0, endlineno=0, parent=cls, parameters=griffe.Parameters(self, *ordered), returns="None"
    )


def _walk(obj: griffe.Module | griffe.Class, seen: set[str]) -> None:
    if obj.path in seen:
        return
    seen.add(obj.path)
    if isinstance(obj, griffe.Class) and (init := attrs_init(obj)) is not None:
        obj.set_member("__init__", init)
    for member in list(obj.members.values()):
        if not member.is_alias and isinstance(member, griffe.Module | griffe.Class):
            _walk(member, seen)


class AttrsInit(griffe.Extension):
    """Gives every attrs class of a loaded package the ``__init__`` attrs writes for it."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Write the ``__init__`` of every attrs class in ``pkg``."""
        _walk(pkg, set())
