"""How ``--help`` names things. typer 0.2x prints a flag as ``<bool>``, a repeatable option as
``<list[str]>`` and a required argument as ``{model}``, and (in rich markup) keeps a docstring's
line breaks, so a wrapped sentence broke mid-line in the command list: the command classes here
give flags no metavar, repeatable options their element's, arguments the usual ``MODEL``, and
help text its paragraphs only."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

#: element types of repeatable options as typer's own metavars spell them
_TYPE_NAMES = {str: "str", Path: "path", int: "int", float: "float"}


def _one_line_paragraphs(text: str | None) -> str | None:
    """Join the lines of each paragraph: a docstring wrapped at 100 columns is one sentence."""
    if not text:
        return text
    paragraphs = re.split(r"\n\s*\n", text.strip())
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def _plain_metavars(params: list[Any]) -> None:
    """A flag shows no metavar; a repeatable option its element type (``<str>``)."""
    for param in params:
        if param.metavar is not None or not isinstance(param, TyperOption):
            continue
        if param.is_flag:
            param.metavar = ""
        elif param.multiple:
            descriptor = getattr(param, "type_descriptor", None)  # typer >= 0.2x
            element = (get_args(descriptor.annotation) or (str,))[0] if descriptor else str
            param.metavar = f"<{_TYPE_NAMES.get(element, getattr(element, '__name__', 'value'))}>"


class Command(TyperCommand):
    """A quantbench command: plain metavars, one-line paragraphs, ``MODEL`` in the usage line."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.help = _one_line_paragraphs(self.help)
        _plain_metavars(self.params)

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        _plain_metavars(params)  # --help is added here, not in __init__
        return params

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = (param.name or "").upper() + ("..." if param.nargs != 1 else "")
                pieces.append(name if param.required else f"[{name}]")
        return pieces


class Group(TyperGroup):
    """The ``quantbench`` group: the same plain metavars for its own options."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        _plain_metavars(params)
        return params
