"""The one arity check: do a call's arguments fit a recorded signature?

A recorded signature is text, as ``inspect.signature``, ``__text_signature__`` or a pybind docstring gives it:
``"(src, dst, block_mapping)"``, ``"(self, /, x, *, y=1)"``, ``"(arg0: torch.Tensor, arg1: int) -> None"``.
:func:`parse_signature` reads it with :mod:`ast` (as the parameter list of a ``def``) into an
:class:`inspect.Signature`; :func:`check_call` binds the call's shape to it with ``Signature.bind``, so the
reason is Python's own ("missing a required argument: 'block_mapping'"). A signature that does not parse
(C++ types in a pybind docstring) is unknown: no finding.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Sequence

_ANY = object()


def _signature_text(text: str) -> str:
    text = text.strip()
    start = text.find("(")
    return text[start:] if start >= 0 else text


def parse_signature(text: str | None) -> inspect.Signature | None:
    """The signature ``text`` as an :class:`inspect.Signature` (parameters, kinds, which have defaults); None when
    it cannot be read as a Python parameter list."""
    if not text:
        return None
    body = _signature_text(text)
    if "->" in body:
        body = body[: body.rfind("->")].rstrip()
    try:
        tree = ast.parse(f"def _f{body}: pass")
    except SyntaxError:
        return None
    fn = tree.body[0]
    if not isinstance(fn, ast.FunctionDef):
        return None
    a = fn.args
    params: list[inspect.Parameter] = []
    positional = [*a.posonlyargs, *a.args]
    first_default = len(positional) - len(a.defaults)
    for i, arg in enumerate(positional):
        kind = (inspect.Parameter.POSITIONAL_ONLY if i < len(a.posonlyargs)
                else inspect.Parameter.POSITIONAL_OR_KEYWORD)
        params.append(inspect.Parameter(arg.arg, kind, default=_ANY if i >= first_default else inspect.Parameter.empty))
    if a.vararg is not None:
        params.append(inspect.Parameter(a.vararg.arg, inspect.Parameter.VAR_POSITIONAL))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params.append(inspect.Parameter(arg.arg, inspect.Parameter.KEYWORD_ONLY,
                                        default=inspect.Parameter.empty if default is None else _ANY))
    if a.kwarg is not None:
        params.append(inspect.Parameter(a.kwarg.arg, inspect.Parameter.VAR_KEYWORD))
    try:
        return inspect.Signature(params)
    except ValueError:
        return None


def check_call(signature: str | None, positional: int, keywords: Sequence[str] = (), *,
               star_args: bool = False, star_kwargs: bool = False, bound_method: bool = False) -> str | None:
    """Why a call with ``positional`` arguments and ``keywords`` does not fit ``signature``; None when it fits or
    cannot be told (signature unknown, ``*args``/``**kwargs`` at the call site make the count unknowable).

    ``bound_method``: the signature's first parameter is ``self`` and the call does not pass it.
    """
    sig = parse_signature(signature)
    if sig is None:
        return None
    if bound_method and sig.parameters:
        sig = sig.replace(parameters=list(sig.parameters.values())[1:])
    if star_args or star_kwargs:
        return None
    try:
        sig.bind(*([_ANY] * positional), **dict.fromkeys(keywords, _ANY))
    except TypeError as exc:
        return str(exc)
    return None


def call_shape(call: ast.Call) -> tuple[int, tuple[str, ...], bool, bool]:
    """(positional count, keyword names, has ``*args``, has ``**kwargs``) of a call in the AST."""
    star_args = any(isinstance(a, ast.Starred) for a in call.args)
    positional = sum(1 for a in call.args if not isinstance(a, ast.Starred))
    keywords = tuple(k.arg for k in call.keywords if k.arg is not None)
    star_kwargs = any(k.arg is None for k in call.keywords)
    return positional, keywords, star_args, star_kwargs


def describe(call: ast.Call) -> str:
    """``3 positional, keywords a, b`` for a finding's "found"."""
    positional, keywords, star_args, star_kwargs = call_shape(call)
    out = f"{positional} positional argument{'s' if positional != 1 else ''}"
    if keywords:
        out += ", keyword " + ", ".join(keywords)
    if star_args or star_kwargs:
        out += " (and * / ** arguments)"
    return out
