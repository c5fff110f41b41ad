"""Jinja render of a kernel template into one self-contained CUDA translation unit.

Templates `#include "x.cuh"` the hand-written headers of `kernels_cu`; the renderer inlines
each header once, so the result compiles on its own with NVRTC or with nvcc.
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import jinja2

_PKG = Path(__file__).resolve().parent.parent
# Installed wheel: data inside the package; source checkout: the repository's folders.
TEMPLATE_DIR = next(p for p in (_PKG / "templates", _PKG.parent / "templates") if p.is_dir())
HEADER_DIR = next(p for p in (_PKG / "kernels_cu", _PKG.parent / "src" / "kernels_cu") if p.is_dir())

_INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"\s*$', re.M)
# set (to anything but "" or "0"): every kernel is built for compute-sanitizer, with
# `#define PYKDA_SANITIZE 1` first (`python -m pykda sanitize` sets it for racecheck); a template
# may then trade speed for what the tools can follow. The define is part of the source, so such
# builds have cache entries of their own.
SANITIZE_ENV = "PYKDA_SANITIZE"


@functools.lru_cache(maxsize=None)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def _inline_headers(source: str, seen: set[str]) -> str:
    def expand(match: re.Match) -> str:
        name = match.group(1)
        if name in seen:
            return ""
        seen.add(name)
        path = HEADER_DIR / name
        if not path.is_file():
            raise FileNotFoundError(f"kernel header {name!r} not found in {HEADER_DIR}")
        text = path.read_text(encoding="utf-8").replace("#pragma once\n", "")
        return f"// ---- {name} ----\n" + _inline_headers(text, seen) + f"// ---- end {name} ----"
    return _INCLUDE.sub(expand, source)


def template_names() -> list[str]:
    return sorted(p.name.removesuffix(".cu.j2") for p in TEMPLATE_DIR.glob("*.cu.j2"))


def render(template: str, params: dict) -> str:
    """Render `templates/<template>.cu.j2` with `params` and inline its headers."""
    try:
        tpl = _environment().get_template(f"{template}.cu.j2")
    except jinja2.TemplateNotFound:
        raise ValueError(f"unknown kernel template {template!r}; known: {template_names()}") from None
    try:
        rendered = tpl.render(**params)
    except jinja2.UndefinedError as exc:   # a parameter the template reads was not given
        raise ValueError(f"kernel template {template!r}: {exc} (a template parameter; given: "
                         f"{sorted(params)})") from None
    source = _inline_headers(rendered, set())
    if os.environ.get(SANITIZE_ENV, "") not in ("", "0"):
        source = "#define PYKDA_SANITIZE 1\n" + source
    return source
