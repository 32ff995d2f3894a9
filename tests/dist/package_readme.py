#!/usr/bin/env python3
"""Writes a package's README (the crate's, the wheel's, the npm package's) from
its template in tests/dist/readme/, for `make dist`.

    python3 tests/dist/package_readme.py TEMPLATE OUT --version 0.9.0 --contract 0.9.0 \
        [--source-url https://github.com/OWNER/agent-retry [--source-ref REF]] \
        [--ships REPO_PATH=PACKAGE_PATH ...]

`{{version}}` and `{{contract}}` are substituted. A template's links are
relative to the template, like any Markdown in the repository (so
check_links.py checks them where they stand), and must be live. In the
package there is no repository around the README, so each link becomes:
- the file's path in the package, for a file the package ships (`--ships`);
- else `SOURCE_URL/blob/REF/PATH`, when the repository's URL is given;
- else its text followed by the path in the repository, as code: no
  placeholder URL is ever written (tests/dist/README.md).
The result is checked: no placeholder left, no relative link but to shipped files.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_links

ROOT = Path(__file__).resolve().parents[2]
PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")
# [text](target) and ![alt](target), no title (the templates use none).
LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*([^)\s]+)\s*\)")


class TemplateError(Exception):
    pass


def substitute(text: str, values: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise TemplateError(f"unknown placeholder {{{{{name}}}}}")
        return values[name]

    return PLACEHOLDER.sub(value, text)


def rewrite_links(
    text: str,
    template: Path,
    root: Path,
    ships: dict[str, str],
    source_url: str,
    source_ref: str,
) -> str:
    """The template's prose with every relative link made right for the package."""
    cache: dict[Path, set[str]] = {}
    prose_numbers = {number for number, _ in check_links.prose_lines(text)}
    out = []
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if number not in prose_numbers:
            out.append(line)
            continue

        def replace(match: re.Match[str], number: int = number) -> str:
            image, label, target = match.group(1), match.group(2), match.group(3)
            if check_links.SCHEME.match(target):
                return match.group(0)
            why = check_links.check_link(template, target, root, cache)
            if why:
                raise TemplateError(f"{template}:{number}: {target}: {why}")
            path_part, hash_, anchor = target.partition("#")
            resolved = (
                (template.parent / path_part).resolve()
                if path_part
                else template.resolve()
            )
            repo_path = resolved.relative_to(root.resolve()).as_posix()
            fragment = f"{hash_}{anchor}"
            if repo_path in ships:
                return f"{image}[{label}]({ships[repo_path]}{fragment})"
            if source_url:
                return f"{image}[{label}]({source_url.rstrip('/')}/blob/{source_ref}/{repo_path}{fragment})"
            if image:
                raise TemplateError(
                    f"{template}:{number}: an image needs --source-url or --ships: {target}"
                )
            return f"{label} (`{repo_path}{fragment}` in the agent-retry repository)"

        out.append(LINK.sub(replace, line))
    return "".join(out)


def check_result(text: str, ships: dict[str, str]) -> None:
    left = PLACEHOLDER.search(text)
    if left:
        raise TemplateError(f"a placeholder is left: {left.group(0)}")
    shipped = set(ships.values())
    for _number, line in check_links.prose_lines(text):
        for match in LINK.finditer(check_links.strip_code_spans(line)):
            target = match.group(3)
            if (
                not check_links.SCHEME.match(target)
                and target.partition("#")[0] not in shipped
            ):
                raise TemplateError(
                    f"a relative link to a file the package does not ship: {target}"
                )


def generate(
    template: Path,
    version: str,
    contract: str,
    ships: dict[str, str],
    source_url: str = "",
    source_ref: str = "",
    root: Path = ROOT,
) -> str:
    if source_url and not source_ref:
        raise TemplateError(
            "--source-url needs --source-ref (a tag or commit the links point at)"
        )
    text = substitute(
        template.read_text(encoding="utf-8"), {"version": version, "contract": contract}
    )
    text = rewrite_links(text, template, root, ships, source_url, source_ref)
    check_result(text, ships)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("template", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--version", required=True)
    parser.add_argument("--contract", required=True)
    parser.add_argument("--source-url", default="")
    parser.add_argument("--source-ref", default="")
    parser.add_argument(
        "--ships", action="append", default=[], metavar="REPO_PATH=PACKAGE_PATH"
    )
    parser.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    ships = {}
    for pair in args.ships:
        repo_path, sep, package_path = pair.partition("=")
        if not sep:
            parser.error(f"--ships {pair}: REPO_PATH=PACKAGE_PATH")
        ships[repo_path] = package_path
    try:
        text = generate(
            args.template,
            args.version,
            args.contract,
            ships,
            args.source_url,
            args.source_ref,
            args.root,
        )
    except TemplateError as e:
        print(f"package_readme: {e}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"{args.out}: from {args.template}, version {args.version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
