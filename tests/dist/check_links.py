#!/usr/bin/env python3
"""Checks the relative links of the repository's Markdown: each must name a
file (or folder) inside the repository, and a `#anchor` must name a heading
(GitHub's slug) or an HTML anchor of the Markdown file it points into.

    python3 tests/dist/check_links.py                 # docs/**/*.md, README.md, hosts/README.md, hosts/*/README.md
    python3 tests/dist/check_links.py --root DIR FILE...

Links with a scheme (https:, mailto:) are not fetched: no network. Links in
code (fenced blocks, `inline code`) are not links. Exits 1 and prints
`file:line: target: why` for each dead link.
"""

from __future__ import annotations

import argparse
import re
import sys
import urllib.parse
from pathlib import Path

DEFAULT_GLOBS = ("docs/**/*.md", "README.md", "hosts/README.md", "hosts/*/README.md")

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
# [text](dest "title") and ![alt](dest); dest may be <...>.
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>\n]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)"
)
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>\n]*>|\S+)")
HTML_LINK = re.compile(
    r"<(?:a|img|source)\b[^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE
)
HTML_ANCHOR = re.compile(
    r"<[a-z]+\b[^>]*?\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE
)
ATX_HEADING = re.compile(r"^\s{0,3}(#{1,6})(?:\s+(.*?))?\s*$")
SETEXT_UNDERLINE = re.compile(r"^\s{0,3}(=+|-+)\s*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:|^//")
LINE_ANCHOR = re.compile(r"^L\d+(?:C\d+)?(?:-L\d+(?:C\d+)?)?$")
CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)")


def strip_code_spans(line: str) -> str:
    """The line with its inline code blanked (a link in code is not a link)."""
    return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) for the lines outside fenced code blocks."""
    lines, fence = [], None
    for number, line in enumerate(text.splitlines(), start=1):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)[0] * len(match.group(1))
            continue
        if fence is not None:
            if line.strip().startswith(fence) and set(line.strip()) <= {fence[0]}:
                fence = None
            continue
        lines.append((number, line))
    return lines


def slug_text(heading: str) -> str:
    """A heading's rendered text: links and images reduced to their text,
    emphasis markers dropped, code kept as written."""
    heading = re.sub(r"!\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    heading = re.sub(r"\[([^\]]*)\]\[[^\]]*\]", r"\1", heading)
    heading = re.sub(r"<[^>]+>", "", heading)
    parts = []
    last = 0
    for match in CODE_SPAN.finditer(heading):
        parts.append(
            re.sub(r"\*+|(?<!\w)_+|_+(?!\w)", "", heading[last : match.start()])
        )
        parts.append(match.group(2).strip())
        last = match.end()
    parts.append(re.sub(r"\*+|(?<!\w)_+|_+(?!\w)", "", heading[last:]))
    return "".join(parts)


def github_slug(text: str) -> str:
    """GitHub's anchor for a heading (github-slugger): lower case, punctuation
    dropped (letters, digits, `_`, `-` and spaces kept), spaces to hyphens."""
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in "_- " or c.isalpha())
    return text.replace(" ", "-")


def anchors(path: Path, cache: dict[Path, set[str]]) -> set[str]:
    """The anchors of a Markdown file: its headings' slugs (with GitHub's -1,
    -2 for repeats) and the ids and names of its HTML elements."""
    if path in cache:
        return cache[path]
    found: set[str] = set()
    counts: dict[str, int] = {}

    def add(heading: str) -> None:
        base = github_slug(slug_text(heading))
        n = counts.get(base, 0)
        counts[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")

    previous: tuple[int, str] | None = None
    for number, line in prose_lines(path.read_text(encoding="utf-8", errors="replace")):
        match = ATX_HEADING.match(line)
        if match:
            add(re.sub(r"\s+#+\s*$", "", match.group(2) or ""))
        elif (
            SETEXT_UNDERLINE.match(line)
            and previous is not None
            and previous[0] == number - 1
            and previous[1].strip()
            and not previous[1].lstrip().startswith(("-", "*", "+", ">", "|", "#"))
            and not (line.strip().startswith("-") and len(line.strip()) < 2)
        ):
            add(previous[1].strip())
        for anchor in HTML_ANCHOR.findall(line):
            found.add(anchor)
        previous = (number, line)
    cache[path] = found
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in a Markdown file's prose."""
    found = []
    for number, line in prose_lines(path.read_text(encoding="utf-8", errors="replace")):
        prose = strip_code_spans(line)
        for pattern in (INLINE_LINK, REFERENCE, HTML_LINK):
            for match in pattern.finditer(prose):
                target = match.group(1)
                if target.startswith("<") and target.endswith(">"):
                    target = target[1:-1]
                found.append((number, target.strip()))
    return found


def check_link(
    source: Path, target: str, root: Path, cache: dict[Path, set[str]]
) -> str | None:
    """Why a relative link is dead, or None."""
    if not target or SCHEME.match(target):
        return None
    path_part, _, anchor = target.partition("#")
    path_part = urllib.parse.unquote(path_part.split("?", 1)[0])
    if path_part:
        base = root if path_part.startswith("/") else source.parent
        resolved = (base / path_part.lstrip("/")).resolve()
    else:
        resolved = source.resolve()
    try:
        resolved.relative_to(root.resolve())
    except ValueError:
        return "points outside the repository"
    if not resolved.exists():
        return "no such file"
    if not anchor:
        return None
    if resolved.is_dir():
        return "an anchor on a folder"
    if resolved.suffix.lower() in (".md", ".markdown"):
        wanted = urllib.parse.unquote(anchor)
        known = anchors(resolved, cache)
        if wanted in known or wanted.lower() in known:
            return None
        return (
            f"no heading or anchor #{wanted} in {resolved.relative_to(root.resolve())}"
        )
    if LINE_ANCHOR.match(anchor):
        return None
    return f"an anchor #{anchor} into a file that is not Markdown"


def check(files: list[Path], root: Path) -> list[str]:
    problems = []
    cache: dict[Path, set[str]] = {}
    for path in files:
        for number, target in links(path):
            why = check_link(path, target, root, cache)
            if why:
                shown = (
                    path.resolve().relative_to(root.resolve())
                    if path.resolve().is_relative_to(root.resolve())
                    else path
                )
                problems.append(f"{shown}:{number}: {target}: {why}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parents[2],
        help="the repository (default: this checkout)",
    )
    parser.add_argument(
        "files",
        nargs="*",
        type=Path,
        help="Markdown files (default: docs/**/*.md, README.md, hosts/README.md, hosts/*/README.md)",
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()
    files = args.files or sorted(
        {p for pattern in DEFAULT_GLOBS for p in root.glob(pattern)}
    )
    if not files:
        print("check_links: no Markdown files to check", file=sys.stderr)
        return 2
    problems = check(files, root)
    for problem in problems:
        print(problem)
    links_seen = sum(len(links(p)) for p in files)
    print(
        f"check_links: {len(files)} files, {links_seen} links, {len(problems)} dead",
        file=sys.stderr,
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
