"""Progress bars for long benchmark work: training a workload, sweeps, testbed runs.

A thin layer over :mod:`tqdm` so every long loop of the benchmarks looks the same. The bar draws
on standard error with a rate and a time left when that is a terminal, and is silent otherwise;
callers then keep writing their own occasional plain lines (see :func:`quiet`), so logs and
captured output stay short.
"""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm.auto import tqdm

__all__ = ["progress_bar", "quiet"]


def progress_bar(total: int, desc: str, *, initial: int = 0, unit: str = "step",
                 enabled: bool | None = None, file: TextIO | None = None) -> tqdm:
    """A tqdm bar for a loop of ``total`` units.

    Args:
        total: Units at completion (steps, methods, slices).
        desc: Label shown first (e.g. the method being trained).
        initial: Units already done (e.g. the step a resumed run starts at).
        unit: Name of one unit.
        enabled: ``None`` draws only when ``file`` is a terminal; ``True``/``False`` force it.
        file: Where to draw (default: standard error).

    Returns:
        The bar: advance it with ``bar.update(k)``, annotate it with ``bar.set_postfix_str``
        and finish it with ``bar.close()`` (or use it as a context manager).
    """
    return tqdm(total=max(1, int(total)), initial=int(initial), desc=desc, unit=unit,
                file=file if file is not None else sys.stderr,
                disable=None if enabled is None else not enabled,
                dynamic_ncols=True, leave=True, mininterval=0.2)


def quiet(bar: tqdm) -> bool:
    """Whether ``bar`` draws nothing (not a terminal), so the caller should log plain lines."""
    return bool(bar.disable)
