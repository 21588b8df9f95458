"""What every benchmark prints with: one table layout and argument checks."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    left: int = 1,
    group: slice | None = None,
    width: int = 120,
) -> None:
    """A rich table when rich is installed, else aligned text.

    The first ``left`` columns are left-aligned, the others right-aligned; a
    rule closes each run of rows that agree on the columns ``group`` selects.
    """
    columns, rows = list(columns), [list(r) for r in rows]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(r[i]) for r in [columns, *rows]) for i in range(len(columns))]
        print(title)
        for cells in [columns, *rows]:
            print(
                "  ".join(
                    c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
                )
            )
        print()
        return
    table = Table(title=title, title_justify="left")
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i < left else "right", no_wrap=True)
    for i, cells in enumerate(rows):
        last = group is not None and (i + 1 == len(rows) or rows[i + 1][group] != cells[group])
        table.add_row(*cells, end_section=last)
    Console(width=max(width, Console().width)).print(table)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """argparse type: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value
