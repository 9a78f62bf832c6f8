"""Screenshots of the built site in headless Chromium, each checked not to be blank.

    sphinx-build -W -b html docs docs/_build/html
    python docs/screenshots.py docs/_build/html docs/_build/screenshots

Opens the index, a guide, an API page and the results page (with its figures) in Debian's
``chromium`` (``apt-get install chromium``; ``CHROMIUM`` names another binary), writes one PNG
per page and exits non-zero when a page fails to render: a screenshot that is nearly one colour,
or a results page whose figures are missing from the build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: Page of the built site → screenshot name.
PAGES: dict[str, str] = {
    "index.html": "index",
    "guides/new_format.html": "guide",
    "generated/dynamiq.all_reduce.html": "api",
    "results.html": "results",
}


def chromium() -> str | None:
    """The Chromium binary to use, or ``None`` when none is installed."""
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def screenshot(page: Path, out: Path, *, width: int = 1280, height: int = 1600,
               timeout: float = 120.0) -> Path:
    """Render ``page`` (an HTML file) in headless Chromium and save a PNG of ``width × height``.

    Raises:
        RuntimeError: no Chromium, or it failed or wrote nothing.
    """
    exe = chromium()
    if exe is None:
        raise RuntimeError("no chromium found: apt-get install chromium (or set CHROMIUM)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--no-first-run", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
               f"--window-size={width},{height}", f"--screenshot={out}",
               "--virtual-time-budget=5000", page.resolve().as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not out.is_file() or out.stat().st_size == 0:
        raise RuntimeError(f"chromium failed on {page} ({proc.returncode}): {proc.stderr[-2000:]}")
    return out


def ink(png: Path) -> tuple[float, float]:
    """``(fraction of pixels that differ from the most common colour, fraction that are
    saturated colours)`` of a PNG: text gives the first, plotted lines the second."""
    import numpy as np
    from matplotlib import image

    rgb = image.imread(str(png))[..., :3]
    flat = (rgb.reshape(-1, 3) * 255).astype(np.int32)
    keys = flat[:, 0] * 65536 + flat[:, 1] * 256 + flat[:, 2]
    values, counts = np.unique(keys, return_counts=True)
    background = values[counts.argmax()]
    differ = float((keys != background).mean())
    saturation = flat.max(1) - flat.min(1)
    return differ, float((saturation > 80).mean())


def check_site(site: Path, outdir: Path) -> dict[str, tuple[float, float]]:
    """Screenshot :data:`PAGES` of the built ``site`` into ``outdir`` and check each.

    Returns:
        Page name → :func:`ink` of its screenshot.

    Raises:
        RuntimeError: a page is missing, blank, or the results page lacks its figures.
    """
    found = {}
    for rel, name in PAGES.items():
        page = site / rel
        if not page.is_file():
            raise RuntimeError(f"{page} is missing: build the site first")
        png = screenshot(page, outdir / f"{name}.png")
        differ, colour = ink(png)
        if differ < 0.02:
            raise RuntimeError(f"{png} is blank ({differ:.1%} of pixels off the background)")
        found[name] = (differ, colour)
    html = (site / "results.html").read_text(encoding="utf-8")
    figures = [line for line in html.split('src="')[1:] if line.split('"')[0].endswith(".svg")]
    missing = [f for f in figures if not (site / f.split('"')[0]).is_file()]
    if not figures or missing:
        raise RuntimeError(f"results page figures missing: {len(figures)} found, {missing}")
    if found["results"][1] < 0.002:
        raise RuntimeError("the results page shows no coloured figure")
    return found


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    try:
        report = check_site(Path(sys.argv[1]), Path(sys.argv[2]))
    except RuntimeError as e:
        sys.exit(str(e))
    for name, (differ, colour) in report.items():
        print(f"{name:8} {differ:6.1%} ink, {colour:6.2%} colour -> {Path(sys.argv[2]) / name}.png")
