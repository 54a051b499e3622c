"""The documentation keeps its promises: the README's two commands are the ones CI runs, every relative link and
#anchor of the README and of docs/ resolves (GitHub's heading slugs; mkdocs --strict for the pages), and
docs/layout.md names exactly the modules and folders that exist, one section per folder of the package in floor
order, each stating the floor its __init__.py declares and opening with its docstring's summary."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple
from urllib.parse import unquote

from helpers import ROOT, read_floors

README = ROOT / "README.md"
DOCS = ROOT / "docs"
CI = ROOT / ".ci" / "run"


# -- the README's two commands are CI's ----------------------------------------------------------------------------


# Both commands' set-up: the environment lock, hashes verified, then this project editable on top of it
SETUP = (
    "python3 -m venv .venv && .venv/bin/pip install -q uv==0.13.9 && "
    ".venv/bin/uv pip sync -q --compile-bytecode -p .venv requirements/lock.txt && "
    ".venv/bin/uv pip install -q -p .venv --no-deps -e . && "
)


def readme_line(number: int) -> str:
    return README.read_text(encoding="utf-8").splitlines()[number - 1]


def test_readme_line_4_is_the_command_ci_runs_as_command_1():
    """.ci/run runs `bash -c "$(sed -n 4p README.md)"`: line 4 must be the set-up-and-run command."""
    ci = CI.read_text(encoding="utf-8")
    reads = re.findall(r"sed -n (\d+)p README\.md", ci)
    assert reads == ["4", "5"], f".ci/run reads README line(s) {reads}, not line 4 then line 5"
    assert 'bash -c "$(sed -n 4p README.md)"' in ci.splitlines()
    line = readme_line(4)
    assert line == (SETUP + ". .venv/bin/activate && dvc repro"), line
    shlex.split(line)  # one shell line, quotes balanced


def test_readme_line_5_is_the_fast_tier_run_after_command_1_then_the_slow_tier():
    """Command 2 is the fast tier (-m "not slow", two workers); .ci/run runs it as the README reads, after command 1
    and its checks in the same clone (the order a newcomer runs them), then the slow tier's two parts, so that
    between them every test runs: not slow, slow and not alone, alone and not solo, solo (a solo test is alone, an alone
    test slow)."""
    line = readme_line(5)
    assert line == (SETUP + '.venv/bin/python -m pytest -m "not slow" -n 2'), line
    ci = CI.read_text(encoding="utf-8").splitlines()
    order = [
        ci.index('bash -c "$(sed -n 4p README.md)"'),
        ci.index(".venv/bin/python -m vcarepro.tools.lockcheck verify"),
        ci.index('bash -c "$(sed -n 5p README.md)"'),
        ci.index('.venv/bin/python -m pytest -m "slow and not alone" -n 2 --dist loadfile'),
        ci.index('.venv/bin/python -m pytest -m "alone and not solo" -n 2 --dist loadfile'),
        ci.index(".venv/bin/python -m pytest -m solo"),
    ]
    assert order == sorted(order), order
    assert readme_line(3) == "```bash" and readme_line(6) == "```"  # the README's first code block: these two lines


# -- links and anchors ----------------------------------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def prose(text: str) -> List[str]:
    """The lines outside fenced code blocks, with inline code spans blanked (links in code are not links)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            lines.append("")
            continue
        lines.append(
            ""
            if fenced or line.startswith("    ") and not line.lstrip().startswith(("-", "*", "|"))
            else re.sub(r"(`+).*?\1", "``", line)
        )
    return lines


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (code spans' content, links' text), lower-cased, punctuation other
    than '-' and '_' removed, each space a '-' (github-slugger, which GitHub's renderer follows)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> Set[str]:
    found: Set[str] = set()
    counts: Dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if fenced:
            continue
        match = HEADING.match(line)
        if match:
            slug = github_slug(match.group(2))
            n = counts.get(slug, 0)
            counts[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
        found.update(HTML_ANCHOR.findall(line))
    return found


def relative_links(path: Path) -> List[Tuple[int, str]]:
    return [
        (number, target)
        for number, line in enumerate(prose(path.read_text(encoding="utf-8")), 1)
        for target in LINK.findall(line)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)
    ]  # http:, https:, mailto: ...


def broken_links(path: Path) -> List[str]:
    problems = []
    for number, target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{where}: {file_part} does not exist")
        elif anchor:
            if dest.suffix != ".md":
                problems.append(f"{where}: an anchor into a file that is not Markdown")
            elif unquote(anchor) not in anchors(dest):
                problems.append(f"{where}: {dest.relative_to(ROOT)} has no heading with anchor #{anchor}")
    return problems


def test_every_relative_link_and_anchor_of_the_readme_resolves():
    assert relative_links(README), "the README links to no page of docs/"
    assert broken_links(README) == []


def test_every_relative_link_and_anchor_of_the_docs_resolves_on_github_too():
    """mkdocs checks the pages with its own slugs; GitHub's differ (it keeps runs of '-'), and the pages are read
    there as well."""
    pages = sorted(DOCS.glob("*.md"))
    assert pages
    assert [p for page in pages for p in broken_links(page)] == []


def test_the_readme_links_every_page_of_the_docs():
    linked = {(README.parent / target.partition("#")[0]).resolve() for _, target in relative_links(README)}
    assert sorted(p.name for p in DOCS.glob("*.md") if p.resolve() not in linked and p.name != "index.md") == []


def test_the_readmes_comparison_is_a_targeted_experiment_of_the_headline_pair_with_its_output_under_it():
    """tests/test_pipeline.py runs the README's one `dvc exp run`, `dvc exp show` and `dvc metrics diff` line on a
    micro repository; here, that they target the headline pair and the real output is pasted under them."""
    lines = README.read_text(encoding="utf-8").splitlines()
    found = {}
    for start in ("dvc exp show", "dvc exp run", "dvc metrics diff"):
        at = [i for i, line in enumerate(lines) if line.strip().startswith(start)]
        assert len(at) == 1, [lines[i] for i in at]
        found[start] = at[0]
    pair = ("deit_tiny-mhsa", "deit_tiny-vca")
    assert lines[found["dvc exp run"]].split()[-2:] == [f"eval_cls@{run}" for run in pair]  # nothing else runs
    assert "^deit_tiny-(mhsa|vca)" in lines[found["dvc exp show"]] and found["dvc exp show"] < found["dvc exp run"]
    assert all(f"runs/cls/{run}/headline.json" in lines[found["dvc metrics diff"]] for run in pair)
    marker = lines.index("<!-- comparing-runs output -->", found["dvc metrics diff"])
    assert marker <= found["dvc metrics diff"] + 3
    pasted = "\n".join(lines[marker : marker + 40])
    assert "[lr-half]" in pasted and all(f"{run}.top1_std" in pasted and f"{run}.n_seeds" in pasted for run in pair)


def test_the_docs_build_with_mkdocs_strict_every_link_and_anchor_between_pages_resolving(tmp_path):
    """mkdocs.yml's validation makes a missing page, link target or anchor a warning; --strict fails on any. mkdocs
    is in the test extra (README command 2 installs it)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--site-dir",
            str(tmp_path / "site"),
            "--config-file",
            str(ROOT / "mkdocs.yml"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").is_file()


# -- the layout page is checked, not hand-kept ----------------------------------------------------------------------


def code_tree() -> Set[str]:
    """Every folder and every file but __init__.py under src/vcarepro and stages, as `path/` or `path`."""
    names: Set[str] = set()
    for top in (ROOT / "src" / "vcarepro", ROOT / "stages"):
        names.add(top.relative_to(ROOT).as_posix() + "/")
        for path in top.rglob("*"):
            if "__pycache__" in path.parts or path.name.endswith((".pyc", ".egg-info")):
                continue
            rel = path.relative_to(ROOT).as_posix()
            if path.is_dir():
                names.add(rel + "/")
            elif path.name != "__init__.py":
                names.add(rel)
    return names


def named_in_layout() -> Set[str]:
    text = (DOCS / "layout.md").read_text(encoding="utf-8")
    return {name for name in re.findall(r"`([^`\s]+)`", text) if name.startswith(("src/vcarepro/", "stages/"))}


def test_the_layout_page_names_every_module_and_folder():
    assert sorted(code_tree() - named_in_layout()) == [], "add a line for each to docs/layout.md"


def test_everything_the_layout_page_names_exists():
    gone = [
        name
        for name in named_in_layout()
        if not (ROOT / name.rstrip("/")).exists() or name.endswith("/") != (ROOT / name.rstrip("/")).is_dir()
    ]
    assert sorted(gone) == [], "remove or rename these lines of docs/layout.md"


# -- the layout page follows the floors: one section per folder, in floor order ------------------------------------

SECTION = re.compile(r"^#{2,3} `src/vcarepro/([^/`]+)/`: floor (\d+)$")


def folder_sections() -> List[Tuple[str, int, List[str]]]:
    """docs/layout.md's folder sections in page order: (folder, the floor its heading states, its lines)."""
    sections: List[Tuple[str, int, List[str]]] = []
    body = None
    for line in (DOCS / "layout.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            match = SECTION.match(line)
            body = [] if match else None
            if match:
                sections.append((match.group(1), int(match.group(2)), body))
        elif body is not None:
            body.append(line)
    return sections


def docstring_summary(folder: str) -> str:
    """The first paragraph of the folder's docstring, on one line, its ``code`` spans in Markdown's `code`."""
    source = (ROOT / "src" / "vcarepro" / folder / "__init__.py").read_text(encoding="utf-8")
    doc = ast.get_docstring(ast.parse(source)) or ""
    return " ".join(doc.split("\n\n")[0].split()).replace("``", "`")


def table_paths(lines: List[str]) -> List[str]:
    return [match.group(1) for line in lines for match in [re.match(r"^\| `([^`]+)` \|", line)] if match]


def test_the_layout_page_has_one_section_per_folder_stating_the_floor_its_init_declares():
    declared = {name.rpartition(".")[2]: floor for name, floor in read_floors(ROOT / "src", "vcarepro").items()}
    assert {folder: floor for folder, floor in declared.items() if floor is None} == {}, "a folder without FLOOR"
    sections = folder_sections()
    assert sorted(folder for folder, _, _ in sections) == sorted(declared), "one section per folder of src/vcarepro"
    assert {folder: stated for folder, stated, _ in sections} == declared, "a heading's floor is not its folder's"


def test_the_layout_page_sections_go_up_the_floors():
    floors = [(stated, folder) for folder, stated, _ in folder_sections()]
    assert [stated for stated, _ in floors] == sorted(stated for stated, _ in floors), floors


def test_each_folder_section_opens_with_its_docstring_summary():
    opening = {folder: next((line for line in lines if line.strip()), "") for folder, _, lines in folder_sections()}
    assert opening == {folder: docstring_summary(folder) for folder in opening}


def test_each_folder_section_lists_exactly_its_folders_modules():
    """Every file and subfolder of a folder has its row in that folder's section, and the section lists nothing
    from elsewhere (the folder's own row may stand there too; its heading names it)."""
    tree = code_tree()
    for folder, _, lines in folder_sections():
        top = f"src/vcarepro/{folder}/"
        rows = table_paths(lines)
        assert [row for row in rows if not row.startswith(top)] == [], f"rows outside {top} in its section"
        assert sorted(name for name in tree if name.startswith(top) and name != top and name not in rows) == [], (
            f"{top}'s section lacks these rows"
        )
