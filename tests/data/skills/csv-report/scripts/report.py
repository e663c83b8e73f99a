#!/usr/bin/env python3
"""Writes a Markdown report of a CSV file, from the skill's own template."""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from summary import summarise  # noqa: E402

TEMPLATE = HERE.parent / "resources" / "template.md"


def main():
    src = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else "/workspace/report.md"
    s = summarise(src)
    ranges = "\n".join(
        f"- {col}: {lo:g} to {hi:g}" for col, (lo, hi) in s["ranges"].items()
    )
    text = TEMPLATE.read_text().format(
        source=src, rows=s["rows"], columns=", ".join(s["columns"]), ranges=ranges
    )
    pathlib.Path(out).write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
