#!/usr/bin/env python3
"""Writes docs/fuzzing.md from the long run's libFuzzer logs (`make -f fuzz/fuzz.mk fuzz-report`,
run by `fuzz-long` at its end).

For every target it reads fuzz/work/<target>.log (libFuzzer's output: the `stat::` lines of
-print_final_stats=1, the last `cov: ft:` status line, crash and timeout markers) and
fuzz/work/<target>.meta (written by fuzz.mk: when the run started, the commit, the machine's
load, the seconds and the exit status). No figure in the page is typed by hand.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

STATUS_LINE = re.compile(r"^#(\d+)\s+\S+\s+cov: (\d+) ft: (\d+)")
CRASH_MARKERS = ("Test unit written to", "==ERROR: libFuzzer", "ERROR: libFuzzer:")


def read_meta(path: Path) -> dict[str, str]:
    meta: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition(" ")
        if key:
            meta[key] = value.strip()
    return meta


def read_log(path: Path) -> dict[str, object]:
    stats: dict[str, str] = {}
    cov = ft = None
    last_exec = 0
    artifacts: list[str] = []
    errors: list[str] = []
    interrupted = False
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("stat::"):
            key, _, value = line[len("stat::") :].partition(":")
            stats[key.strip()] = value.strip()
        elif m := STATUS_LINE.match(line):
            last_exec, cov, ft = int(m.group(1)), int(m.group(2)), int(m.group(3))
        elif "libFuzzer: run interrupted" in line:
            interrupted = True
        elif "Test unit written to" in line:
            artifacts.append(line.split("Test unit written to", 1)[1].strip())
        elif "panicked at" in line:
            # A Rust panic's message (the broken invariant) is on the next line.
            errors.append(lines[i + 1].strip() if i + 1 < len(lines) else line.strip())
        elif any(marker in line for marker in CRASH_MARKERS):
            errors.append(line.strip())
    return {
        "executions": int(stats["number_of_executed_units"])
        if "number_of_executed_units" in stats
        else last_exec,
        "exec_per_sec": int(stats["average_exec_per_sec"])
        if "average_exec_per_sec" in stats
        else None,
        "slowest_s": stats.get("slowest_unit_time_sec"),
        "peak_rss_mb": stats.get("peak_rss_mb"),
        "final_stats": "number_of_executed_units" in stats,
        "cov": cov,
        "ft": ft,
        "artifacts": artifacts,
        "errors": errors,
        "interrupted": interrupted,
    }


def fmt(n: int | None) -> str:
    return "–" if n is None else f"{n:,}"


def row(target: str, work: Path) -> tuple[str, int, int, int, str | None]:
    """One table row, and the executions, seconds and crashes it adds to the total, and a note."""
    log, meta_path = work / f"{target}.log", work / f"{target}.meta"
    if not log.exists() or not meta_path.exists():
        return f"| `{target}` | not run | | | | | | | | |", 0, 0, 0, None
    meta, stats = read_meta(meta_path), read_log(log)
    if "seconds" not in meta:
        return (
            f"| `{target}` | running or killed (no end in `{meta_path.name}`) | | | | | | | | |",
            0,
            0,
            0,
            None,
        )
    asked = int(meta.get("runs-asked", "0"))
    executions, seconds = int(stats["executions"]), int(meta["seconds"])
    crashes = len(stats["artifacts"])
    if stats["interrupted"]:
        status = (
            f"stopped (SIGINT) after {executions / asked:.0%} of {asked:,}"
            if asked
            else "stopped (SIGINT)"
        )
    elif crashes or stats["errors"]:
        status = f"**crashed** after {executions:,} of {asked:,}"
        crashes = max(crashes, 1)
    elif meta.get("exit") != "0" or not stats["final_stats"]:
        status = f"**failed** (exit {meta.get('exit')})"
    else:
        status = "complete"
    load = f"{meta.get('load-start', '?').split()[0]} → {meta.get('load-end', '?').split()[0]} on {meta.get('cores', '?')} cores, nice {meta.get('nice', '?')}"
    uncommitted = int(meta.get("uncommitted", "0") or 0)
    commit = f"`{meta.get('commit', '?')}`" + (
        f" + {uncommitted} files changed in guest/, fuzz/" if uncommitted else ""
    )
    cov_ft = f"{fmt(stats['cov'])} / {fmt(stats['ft'])}"
    line = (
        f"| `{target}` | {executions:,} | {status} | {seconds:,} | {fmt(stats['exec_per_sec'])} | {crashes} | {cov_ft}"
        f" | {meta.get('started', '?')} | {commit} | {load} |"
    )
    note = None
    if stats["artifacts"] or stats["errors"]:
        first = (stats["errors"] or ["?"])[0]
        note = f"- `{target}`: {first[:300]}" + (
            f" (input: `{stats['artifacts'][0]}`)" if stats["artifacts"] else ""
        )
    return line, executions, seconds, crashes, note


def render(targets: list[str], work: Path) -> str:
    rows, notes = [], []
    total_exec = total_s = total_crashes = 0
    for target in targets:
        line, executions, seconds, crashes, note = row(target, work)
        rows.append(line)
        total_exec, total_s, total_crashes = (
            total_exec + executions,
            total_s + seconds,
            total_crashes + crashes,
        )
        if note:
            notes.append(note)
    out = [
        "# Fuzzing results",
        "",
        "<!-- Written by `make -f fuzz/fuzz.mk fuzz-long` (or `fuzz-report`), fuzz/fuzz_report.py: do not edit. -->",
        "",
        "The last long run's figures, written by `make -f fuzz/fuzz.mk fuzz-long` from libFuzzer's logs",
        "(`fuzz/work/<target>.log`, its `stat::` lines and last status line) and what `fuzz.mk` noted of",
        "each run (`fuzz/work/<target>.meta`). The targets, their invariants and the findings are in",
        "[`fuzz/README.md`](../fuzz/README.md).",
        "",
        "Seconds are the fuzzing's wall time (after the build); exec/s is libFuzzer's average; crashes count",
        "crashes, timeouts (`-timeout=5`) and broken invariants (a panic); cov / ft are libFuzzer's",
        "coverage counters at the end; the load is the 1-minute load average at the run's start and end.",
        "",
        "| target | executions | run | seconds | exec/s | crashes | cov / ft | started (UTC) | commit | machine load |",
        "|---|---:|---|---:|---:|---:|---|---|---|---|",
        *rows,
        f"| **total** | **{total_exec:,}** | | **{total_s:,}** | | **{total_crashes}** | | | | |",
        "",
    ]
    if notes:
        out += [
            "Crashes (reproduce with `cargo +nightly fuzz run --fuzz-dir fuzz --features libfuzzer <target> <input>`):",
            "",
            *notes,
            "",
        ]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work", type=Path, required=True, help="fuzz/work: the logs and meta files"
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="the page to write (docs/fuzzing.md)"
    )
    parser.add_argument("targets", nargs="+")
    args = parser.parse_args(argv)
    try:
        page = render(args.targets, args.work)
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(
            f"fuzz_report: cannot read the logs in {args.work}: {e}"
        ) from e
    args.out.write_text(page, encoding="utf-8")
    print(f"fuzz_report: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
