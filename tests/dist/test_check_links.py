"""Tests of the link checker (check_links.py) and the package README generator
(package_readme.py, replace_in_crate.py) on fixtures: `make docs-links` runs
them (python3 -m unittest discover -s tests/dist -p 'test_*.py')."""

from __future__ import annotations

import contextlib
import io
import shutil
import sys
import tarfile
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import check_links
import package_readme
import replace_in_crate

FIXTURES = HERE / "link-fixtures"


def run_checker(*files: Path) -> tuple[int, list[str]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = check_links.main(["--root", str(FIXTURES), *map(str, files)])
    return code, out.getvalue().splitlines()


class CheckLinks(unittest.TestCase):
    def test_live_links_pass(self) -> None:
        code, problems = run_checker(FIXTURES / "live/README.md")
        self.assertEqual(problems, [])
        self.assertEqual(code, 0)
        # And the links were all seen (code and fenced blocks excepted).
        targets = [t for _, t in check_links.links(FIXTURES / "live/README.md")]
        self.assertEqual(len(targets), 13, targets)
        self.assertNotIn("missing.md", targets)
        self.assertNotIn("missing-too.md", targets)

    def test_each_dead_link_fails_with_its_line(self) -> None:
        code, problems = run_checker(FIXTURES / "dead/README.md")
        self.assertEqual(code, 1)
        self.assertEqual(
            problems,
            [
                "dead/README.md:4: docs/gone.md: no such file",
                "dead/README.md:5: ../live/docs/page.md#no-such-heading: no heading or anchor #no-such-heading in live/docs/page.md",
                "dead/README.md:6: ../../../../../../etc/passwd: points outside the repository",
                "dead/README.md:7: missing.svg: no such file",
                "dead/README.md:10: missing-ref.md: no such file",
                "dead/README.md:11: ../live/docs/#x: an anchor on a folder",
                "dead/README.md:11: #nowhere: no heading or anchor #nowhere in dead/README.md",
            ],
        )

    def test_github_slugs(self) -> None:
        cases = {
            "The demo server's eras": "the-demo-servers-eras",
            "Contract 0.7.0": "contract-070",
            "A heading with `snake_case` and _emphasis_": "a-heading-with-snake_case-and-emphasis",
            "[Linked](x.md) text **bold**": "linked-text-bold",
            "Über — café": "über--café",
        }
        for heading, slug in cases.items():
            self.assertEqual(
                check_links.github_slug(check_links.slug_text(heading)), slug, heading
            )

    def test_the_repository_default_set_is_found(self) -> None:
        root = HERE.parents[1]
        files = sorted(
            {p for pattern in check_links.DEFAULT_GLOBS for p in root.glob(pattern)}
        )
        names = [p.relative_to(root).as_posix() for p in files]
        for expected in (
            "README.md",
            "hosts/README.md",
            "hosts/rust/README.md",
            "docs/events.md",
        ):
            self.assertIn(expected, names)


class PackageReadme(unittest.TestCase):
    def template(self, text: str) -> Path:
        folder = Path(tempfile.mkdtemp(dir=FIXTURES / "live/docs"))
        self.addCleanup(shutil.rmtree, folder)
        path = folder / "template.md"
        path.write_text(text, encoding="utf-8")
        return path

    TEXT = (
        "# pkg {{version}} speaks {{ contract }}\n\n"
        "See [the page](../page.md#repeat), [licence](../../README.md) and [web](https://example.invalid/).\n\n"
        "```sh\ninstall pkg-{{version}}.tgz   # [not a link](nowhere.md)\n```\n"
    )

    def test_links_point_at_the_repository_when_its_url_is_given(self) -> None:
        text = package_readme.generate(
            self.template(self.TEXT),
            "1.2.3",
            "1.2.0",
            {"README.md": "README.md"},
            "https://example.invalid/o/r/",
            "v1.2.3",
            root=FIXTURES / "live",
        )
        self.assertIn("# pkg 1.2.3 speaks 1.2.0", text)
        self.assertIn("install pkg-1.2.3.tgz", text)
        self.assertIn(
            "[the page](https://example.invalid/o/r/blob/v1.2.3/docs/page.md#repeat)",
            text,
        )
        self.assertIn(
            "[licence](README.md)",
            text,
            "a shipped file stays relative, at its place in the package",
        )
        self.assertIn("[web](https://example.invalid/)", text)
        self.assertIn("[not a link](nowhere.md)", text, "code is left as written")

    def test_without_a_url_no_placeholder_is_written(self) -> None:
        text = package_readme.generate(
            self.template(self.TEXT), "1.2.3", "1.2.0", {}, root=FIXTURES / "live"
        )
        self.assertIn(
            "the page (`docs/page.md#repeat` in the agent-retry repository)", text
        )
        self.assertIn("licence (`README.md` in the agent-retry repository)", text)
        self.assertNotIn("](../", text)

    def test_a_dead_link_or_unknown_placeholder_in_a_template_is_an_error(self) -> None:
        for text, message in [
            ("[x](../gone.md)\n", "no such file"),
            ("[x](../page.md#gone)\n", "no heading or anchor"),
            ("{{versoin}}\n", "unknown placeholder"),
        ]:
            with self.assertRaisesRegex(package_readme.TemplateError, message):
                package_readme.generate(
                    self.template(text), "1", "1", {}, root=FIXTURES / "live"
                )

    def test_the_real_templates_generate(self) -> None:
        root = HERE.parents[1]
        for name, ships in [
            ("crate.md", {"LICENSE": "LICENSE"}),
            ("python.md", {}),
            (
                "npm.md",
                {
                    "LICENSE": "LICENSE",
                    "hosts/typescript/KNOWN_GAPS.md": "KNOWN_GAPS.md",
                },
            ),
        ]:
            text = package_readme.generate(
                HERE / "readme" / name, "9.8.7", "9.8.0", ships, root=root
            )
            self.assertIn("9.8.7", text)
            self.assertNotIn("{{", text)
            self.assertNotIn("](../", text, name)


class ReplaceInCrate(unittest.TestCase):
    def test_the_readme_is_replaced_and_the_rest_kept(self) -> None:
        folder = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, folder)
        crate = folder / "x-1.0.0.crate"
        with tarfile.open(crate, "w:gz", format=tarfile.GNU_FORMAT) as tar:
            for name, data in [
                ("x-1.0.0/Cargo.toml", b"[package]\n"),
                ("x-1.0.0/README.md", b"old"),
                ("x-1.0.0/src/lib.rs", b"//! x\n"),
            ]:
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(data), 0o644, 1234
                tar.addfile(info, io.BytesIO(data))
        replace_in_crate.replace(crate, "README.md", b"# new\n")
        with tarfile.open(crate, "r:gz") as tar:
            self.assertEqual(
                tar.getnames(),
                ["x-1.0.0/Cargo.toml", "x-1.0.0/README.md", "x-1.0.0/src/lib.rs"],
            )
            self.assertEqual(tar.extractfile("x-1.0.0/README.md").read(), b"# new\n")
            self.assertEqual(tar.extractfile("x-1.0.0/src/lib.rs").read(), b"//! x\n")
            self.assertEqual(tar.getmember("x-1.0.0/README.md").mtime, 1234)
        with self.assertRaisesRegex(ValueError, "no x-1.0.0/NOPE.md"):
            replace_in_crate.replace(crate, "NOPE.md", b"")


if __name__ == "__main__":
    unittest.main()
