"""Every relative link in the repository's Markdown resolves (issue 18, item 4).

A link is an inline `[text](target)` or image `![alt](target)`, or a reference definition
`[label]: target`, outside fenced code blocks and inline code spans. Targets with a scheme
(http:, https:, mailto:, ...) are not checked; a pure `#anchor` is checked against the file's
own headings; `path#anchor` must name an existing file and, when that file is Markdown, one of
its headings under GitHub's slug rules: lower case, every character that is not a letter, a
digit, a space, `-` or `_` dropped, each space made `-`; the second and later headings with
the same slug get `-1`, `-2`, ... appended.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

REPO = Path(__file__).resolve().parent.parent

_SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "build", "dist", ".pytest_cache",
              ".ruff_cache", ".hypothesis", "__pycache__"}
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
# [text](target "title") and ![alt](target); text may hold one level of nested brackets.
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s)]+)(?:\s+[\"'(][^)]*)?\)")
_REFDEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.MULTILINE)
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)\s*$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def markdown_files(root: Path) -> list[Path]:
    """The Markdown files git tracks (or would: not ignored) under `root`, or every `*.md`
    outside build directories when `root` is not a git work tree."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard", "--", "*.md"],
                             cwd=root, check=True, capture_output=True, timeout=10).stdout
        files = [root / p for p in out.decode().split("\0") if p]
        if files:
            return sorted(f for f in files if f.exists())
    except (OSError, subprocess.SubprocessError):
        pass
    return sorted(p for p in root.rglob("*.md")
                  if not any(part in _SKIP_DIRS for part in p.relative_to(root).parts))


def _prose_lines(text: str) -> list[str]:
    """The file's lines with fenced code blocks blanked (line numbers kept)."""
    lines, fence = [], None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            lines.append("")
        elif fence is not None:
            if m and m.group(1).startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
            lines.append("")
        else:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before de-duplication)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text)                        # inline HTML tags
    text = text.strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub generates for the headings of a Markdown file."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    lines = _prose_lines(path.read_text(encoding="utf-8"))
    for i, line in enumerate(lines):
        m = _HEADING.match(line)
        text = m.group(2) if m else None
        if text is None and i > 0 and lines[i - 1].strip() and _SETEXT.match(line) \
                and not _HEADING.match(lines[i - 1]):
            text = lines[i - 1].strip()
        if text is None:
            continue
        base = slug(text)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link and image in the file's prose."""
    found = []
    for no, line in enumerate(_prose_lines(path.read_text(encoding="utf-8")), start=1):
        line = _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        for m in _INLINE.finditer(line):
            found.append((no, m.group(1)))
        for m in _REFDEF.finditer(line):
            found.append((no, m.group(1)))
    return [(no, t[1:-1] if t.startswith("<") and t.endswith(">") else t) for no, t in found]


def broken_links(root: Path, files: list[Path] | None = None) -> list[str]:
    """One line per link in the Markdown under `root` whose file or anchor does not exist."""
    problems = []
    cache: dict[Path, set[str]] = {}
    for md in files if files is not None else markdown_files(root):
        rel = md.relative_to(root)
        for no, target in links(md):
            if _SCHEME.match(target) or target.startswith("//"):
                continue
            path_part, _, anchor = target.partition("#")
            path_part = unquote(path_part.split("?", 1)[0])
            if path_part.startswith("/"):
                dest = root / path_part.lstrip("/")
            else:
                dest = (md.parent / path_part) if path_part else md
            dest = Path(dest)
            if not dest.exists():
                problems.append(f"{rel}:{no}: {target}: no such file {dest.relative_to(root)}"
                                if dest.resolve().is_relative_to(root.resolve())
                                else f"{rel}:{no}: {target}: outside the repository")
                continue
            if anchor and dest.is_file() and dest.suffix.lower() == ".md":
                dest = dest.resolve()
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if unquote(anchor).lower() not in cache[dest]:
                    problems.append(f"{rel}:{no}: {target}: no heading #{anchor} in "
                                    f"{dest.relative_to(root.resolve())}")
    return problems


def test_every_relative_link_in_the_repository_resolves():
    files = markdown_files(REPO)
    assert any(f.name == "README.md" for f in files)
    assert (REPO / "docs" / "DESIGN.md") in files
    assert broken_links(REPO, files) == []


def test_the_checker_finds_broken_links(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "img.png").write_bytes(b"\x89PNG")
    (tmp_path / "docs" / "A.md").write_text(
        "# The design\n\n## Cost model, in brief (`x`)\n\n## Cost model, in brief (`x`)\n\n"
        "Sub\n---\n\n```\n# not a heading\n[in code](missing_in_code.md)\n```\n",
        encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "ok: [design](docs/A.md), ![img](img.png \"title\"), [top](#readme),\n"
        "[anchor](docs/A.md#cost-model-in-brief-x), [dup](docs/A.md#cost-model-in-brief-x-1),\n"
        "[setext](docs/A.md#sub), [web](https://example.com/nope.md), [mail](mailto:a@b),\n"
        "`[span](missing_in_span.md)`\n\n# Readme\n\n"
        "broken: [gone](docs/GONE.md), ![pic](missing.png), [bad](docs/A.md#nope),\n"
        "[self](#nowhere), [code](docs/A.md#not-a-heading)\n\n[ref]: ../outside.md\n",
        encoding="utf-8")
    problems = broken_links(tmp_path, sorted(tmp_path.rglob("*.md")))
    joined = "\n".join(problems)
    assert len(problems) == 6, joined
    for bad in ("docs/GONE.md", "missing.png", "#nope", "#nowhere", "#not-a-heading",
                "../outside.md: outside the repository"):
        assert bad in joined
    for fine in ("img.png", "#readme", "cost-model-in-brief-x", "#sub", "example.com", "span"):
        assert fine not in joined.replace("#not-a-heading", "")


def test_slug_follows_github():
    assert slug("Cost model, in brief (`cost_models/`, DESIGN.md has the full statement)") == \
        "cost-model-in-brief-cost_models-designmd-has-the-full-statement"
    assert slug("Set-up and the two commands") == "set-up-and-the-two-commands"
    assert slug("The [link](x.md) text") == "the-link-text"
