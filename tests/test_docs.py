"""The documentation builds without warnings, and its guides run as written.

* ``test_sphinx_build`` builds the HTML docs with warnings as errors (marked ``docs``).
* ``test_page_runs`` executes every Python code block of each page (``docs/*.rst`` and
  ``docs/guides/*.rst``), in order, in one fresh namespace per page; doctest-style blocks
  (``>>>``) are checked as doctests. Whatever a page registers is unregistered afterwards, so
  other tests never see it. Fragments that need a process group are ``text`` blocks next to a
  complete program under ``docs/examples/`` or ``examples/``.
* ``test_example_script_runs`` runs every program of ``docs/examples/`` (the files with a
  ``__main__`` block) as its readers would, in a fresh interpreter; the programs check their own
  results.
* ``test_api_page_lists_public_api`` keeps ``docs/api.rst`` in step with ``dynamiq.__all__``.
"""

from __future__ import annotations

import doctest
import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dynamiq

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GUIDES = sorted((DOCS / "guides").glob("*.rst"))
PAGES = sorted(DOCS.glob("*.rst")) + GUIDES
EXAMPLES = sorted(p for p in (DOCS / "examples").glob("*.py")
                  if '__name__ == "__main__"' in p.read_text(encoding="utf-8"))

_DIRECTIVE = re.compile(
    r"^(?P<indent>\s*)\.\.\s+(?:(?:code-block|code|sourcecode)::\s*(?:python3?|pycon)|doctest::)"
    r"(?:\s+\S.*)?\s*$"
)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(line number, dedented source)`` of every Python code block in a reST document."""
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        m = _DIRECTIVE.match(lines[i])
        i += 1
        if not m:
            continue
        indent = len(m.group("indent"))
        # directive options (":caption: ...") come first, then the indented body
        while i < len(lines) and re.match(r"^\s+:[\w-]+:", lines[i]):
            i += 1
        start = i
        body: list[str] = []
        while i < len(lines):
            line = lines[i]
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                break
            body.append(line)
            i += 1
        while body and not body[0].strip():  # blank lines between the directive and the code
            body.pop(0)
            start += 1
        src = textwrap.dedent("\n".join(body)).rstrip() + "\n"
        if src.strip():
            blocks.append((start + 1, src))
    return blocks


def _registries() -> list:
    regs = [dynamiq.FORMATS, dynamiq.QUANTIZERS, dynamiq.TRANSFORMS]
    # later components (codecs, topologies, ...) are covered as soon as they are exported
    for name in getattr(dynamiq, "__all__", []):
        obj = getattr(dynamiq, name, None)
        if isinstance(obj, dynamiq.Registry) and all(obj is not r for r in regs):
            regs.append(obj)
    return regs


@pytest.fixture
def clean_registries():
    """Unregister every name (and alias) added while the test runs."""
    regs = _registries()
    before = [(set(r.names()), set(r.aliases())) for r in regs]
    try:
        yield
    finally:
        for r, (names, _aliases) in zip(regs, before):
            for name in r.names():
                if name not in names:
                    r.unregister(name)  # also drops the aliases pointing to it
        leftovers = {
            r.kind: sorted(set(r.aliases()) - aliases)
            for r, (_names, aliases) in zip(regs, before)
            if set(r.aliases()) - aliases
        }
        assert not leftovers, f"a guide added aliases to built-in names: {leftovers}"


def _run_block(path: Path, line: int, src: str, namespace: dict) -> None:
    where = f"{path.relative_to(ROOT)}:{line}"
    if src.lstrip().startswith(">>>"):
        test = doctest.DocTestParser().get_doctest(src, namespace, where, str(path), line)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        out: list[str] = []
        runner.run(test, out=out.append, clear_globs=False)
        namespace.update(test.globs)  # DocTest works on a copy; later blocks build on it
        assert runner.failures == 0, f"doctest block at {where} failed:\n{''.join(out)}"
        return
    code = compile("\n" * (line - 1) + src, str(path), "exec")
    exec(code, namespace)


def test_guides_have_code() -> None:
    assert GUIDES, "no guides found under docs/guides"
    for path in GUIDES:
        assert python_blocks(path.read_text(encoding="utf-8")), f"{path.name} has no code"


@pytest.mark.parametrize("path", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_page_runs(path: Path, clean_registries) -> None:
    namespace: dict = {"__name__": f"docs_page_{path.stem}"}
    for line, src in python_blocks(path.read_text(encoding="utf-8")):
        _run_block(path, line, src, namespace)


def test_examples_found() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"first_all_reduce.py", "all_reduce_my_format.py"} <= names, names


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_script_runs(path: Path) -> None:
    if path.stem.startswith("testbed"):
        from dynamiq.testbed import unavailable_reason

        reason = unavailable_reason()
        if reason:
            pytest.skip(f"no network testbed here: {reason}")
    proc = subprocess.run([sys.executable, str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=800)
    assert proc.returncode == 0, f"{path.name} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    assert proc.stdout.strip(), f"{path.name} printed nothing"


def test_block_extraction() -> None:
    text = textwrap.dedent(
        """\
        Title
        =====

        .. code-block:: python
           :caption: one

           a = 1

           b = a + 1

        Text.

        .. code-block:: console

           $ not python

        - item

          .. code-block:: python

             c = 3
        """
    )
    blocks = python_blocks(text)
    assert [src for _, src in blocks] == ["a = 1\n\nb = a + 1\n", "c = 3\n"]
    assert blocks[0][0] == 7


def _documented_names() -> set[str]:
    text = (DOCS / "api.rst").read_text(encoding="utf-8")
    names = set()
    for block in re.findall(r"\.\. autosummary::\n((?:[ \t]+.*\n|[ \t]*\n)+)", text + "\n"):
        for line in block.splitlines():
            entry = line.strip()
            if entry and not entry.startswith(":"):
                names.add(entry.removeprefix("~").rsplit(".", 1)[-1])
    return names


def test_api_page_lists_public_api() -> None:
    public = {n for n in dynamiq.__all__ if not n.startswith("__")}
    documented = _documented_names()
    missing = sorted(public - documented)
    extra = sorted(documented - public)
    assert not missing, f"add these public names to an autosummary list in docs/api.rst: {missing}"
    assert not extra, f"docs/api.rst lists names that dynamiq.__all__ does not export: {extra}"


@pytest.mark.docs
def test_sphinx_build(tmp_path: Path) -> None:
    if importlib.util.find_spec("sphinx") is None:
        pytest.skip("sphinx is not installed (pip install -e '.[docs]' or '.[test]')")
    out, doctrees = tmp_path / "html", tmp_path / "doctrees"
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    cmd += ["-d", str(doctrees), str(DOCS), str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        print(proc.stdout)
        print(proc.stderr, file=sys.stderr)
    assert proc.returncode == 0, f"sphinx-build failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    assert (out / "index.html").is_file()
    assert (out / "api.html").is_file()
    for name in ("schedule-ring", "schedule-butterfly", "schedule-hierarchical",
                 "gpt-stdlib-ring", "train"):  # drawn by conf.py from the topologies / JSON
        assert (out / "_images" / f"{name}.svg").is_file(), name
    _screenshots(out, tmp_path / "shots")


def _screenshots(site: Path, outdir: Path) -> None:
    """The built site renders in headless Chromium (``docs/screenshots.py``), when installed."""
    spec = importlib.util.spec_from_file_location("docs_screenshots", DOCS / "screenshots.py")
    shots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shots)
    if shots.chromium() is None:
        pytest.skip("site built; no chromium for the screenshots (apt-get install chromium)")
    report = shots.check_site(site, outdir)
    assert set(report) == {"index", "guide", "api", "results"}
    for name, (differ, _colour) in report.items():
        assert differ > 0.02, f"{name} screenshot is blank"


def test_doctest_blocks_are_checked() -> None:
    path = ROOT / "docs" / "guides" / "example.rst"  # only used in messages
    ns: dict = {}
    _run_block(path, 1, ">>> a = 20\n>>> a + 1\n21\n", ns)
    assert ns["a"] == 20
    with pytest.raises(AssertionError, match="doctest block"):
        _run_block(path, 1, ">>> 1 + 1\n3\n", ns)
