#!/usr/bin/env python3
"""Replaces one file in a packaged .crate (a gzipped tar whose members sit
under `NAME-VERSION/`), keeping every other member, its order and its
metadata: `make dist` puts the generated README in the crate this way, so
hosts/rust/README.md (the repository's guide) is never overwritten.

    python3 tests/dist/replace_in_crate.py CRATE PATH_IN_PACKAGE NEW_FILE
"""

from __future__ import annotations

import gzip
import io
import os
import sys
import tarfile
import tempfile
from pathlib import Path


def replace(crate: Path, inner: str, content: bytes) -> None:
    with tarfile.open(crate, mode="r:gz") as source:
        members = source.getmembers()
        roots = {m.name.split("/", 1)[0] for m in members}
        if len(roots) != 1:
            raise ValueError(f"{crate}: expected one top folder, found {sorted(roots)}")
        target = f"{roots.pop()}/{inner}"
        if target not in {m.name for m in members}:
            raise ValueError(f"{crate}: no {target} to replace")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as out:
            for member in members:
                if member.name == target:
                    info = tarfile.TarInfo(member.name)
                    info.size, info.mode, info.mtime = (
                        len(content),
                        member.mode,
                        member.mtime,
                    )
                    info.uid, info.gid, info.uname, info.gname = (
                        member.uid,
                        member.gid,
                        member.uname,
                        member.gname,
                    )
                    out.addfile(info, io.BytesIO(content))
                elif member.isfile():
                    out.addfile(member, source.extractfile(member))
                else:
                    out.addfile(member)
    # Written beside, then renamed: a failure leaves the original crate whole.
    fd, temp = tempfile.mkstemp(dir=crate.parent, suffix=".crate.tmp")
    try:
        with (
            os.fdopen(fd, "wb") as raw,
            gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz,
        ):
            gz.write(buffer.getvalue())
        os.replace(temp, crate)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    crate, inner, new_file = Path(argv[0]), argv[1], Path(argv[2])
    try:
        replace(crate, inner, new_file.read_bytes())
    except (OSError, ValueError, tarfile.TarError) as e:
        print(f"replace_in_crate: {e}", file=sys.stderr)
        return 1
    print(f"{crate}: {inner} replaced by {new_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
