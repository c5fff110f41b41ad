"""Progress bars for the benches: tqdm's (the `progress` extra) where it is installed, else nothing.

The bars go to stderr and are cleared when done (`leave=False`), so the tables on stdout are the
same with or without tqdm."""
from __future__ import annotations

from typing import Any, Callable, Iterable


def progress(items: Iterable, desc: str, label: Callable[[Any], str] | None = None, unit: str = "it") -> Iterable:
    """`items` under a tqdm bar (with `label(item)` shown beside it) when tqdm is importable;
    `items` itself when it is not."""
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return _bar(tqdm, items, desc, label, unit)


def _bar(tqdm, items, desc, label, unit):
    with tqdm(items, desc=desc, unit=unit, leave=False, dynamic_ncols=True) as bar:
        for item in bar:
            if label is not None:
                bar.set_postfix_str(label(item), refresh=False)
            yield item
