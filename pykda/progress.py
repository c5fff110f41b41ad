"""Progress bars: tqdm's (the `progress` extra) where it is installed.

The bars go to stderr and are cleared when done (`leave=False`), so what a command prints on
stdout is the same with or without tqdm. Without tqdm the items pass through unchanged, or, for
steps a user waits on (the demo's), with a plain line each."""
from __future__ import annotations

from typing import Any, Callable, Iterable


def progress(items: Iterable, desc: str, label: Callable[[Any], str] | None = None, unit: str = "it",
             plain_lines: bool = False, total: int | None = None) -> Iterable:
    """`items` under a tqdm bar (with `label(item)` shown beside it) when tqdm is importable;
    without it `items` itself, or with `plain_lines` a printed line per item. `total`: the count
    of an iterator (items that arrive as they are made); otherwise len(items)."""
    try:
        from tqdm import tqdm
    except ImportError:
        if not plain_lines:
            return items
        if total is None:
            items = list(items)
            total = len(items)
        return _lines(items, desc, label or str, total)
    return _bar(tqdm, items, desc, label, unit, total)


def _bar(tqdm, items, desc, label, unit, total):
    with tqdm(items, desc=desc, unit=unit, leave=False, dynamic_ncols=True, total=total) as bar:
        for item in bar:
            if label is not None:
                bar.set_postfix_str(label(item), refresh=False)
            yield item


def _lines(items: Iterable, desc: str, label: Callable[[Any], str], total: int):
    for i, item in enumerate(items, 1):
        print(f"{desc} [{i}/{total}] {label(item)}", flush=True)
        yield item
