#!/usr/bin/env python3
"""bench/table.py: puts the rows `make bench` collected into BENCHMARKS.md,
between the "make bench: begin" and "end" markers (the section is made at
the end of the file the first time), under one header: figure, gpurentd,
reference, ratio, load average, command, date. Rows are Markdown table rows
as bench/reads.py prints them; other lines of the inputs (claims, billing)
go below the table verbatim, in a code block.

    python3 bench/table.py BENCHMARKS.md build/bench/*.out
"""
import sys

BEGIN, END = "<!-- make bench: begin -->", "<!-- make bench: end -->"
HEADER = ("| figure | gpurentd | reference (same run) | ratio | load average | command | date |\n"
          "|---|---|---|---|---|---|---|\n")


def main():
    doc_path, inputs = sys.argv[1], sys.argv[2:]
    rows, raw = [], []
    for path in inputs:
        with open(path) as f:
            for line in f:
                (rows if line.startswith("| ") else raw).append(line if line.endswith("\n") else line + "\n")
    section = BEGIN + "\n\n" + HEADER + "".join(rows)
    if raw:
        section += "\nIn-process benchmarks of the same run (bench/claims, bench/billing):\n\n```\n" + "".join(raw) + "```\n"
    section += "\n" + END
    with open(doc_path) as f:
        doc = f.read()
    if BEGIN in doc and END in doc:
        doc = doc[:doc.index(BEGIN)] + section + doc[doc.index(END) + len(END):]
    else:
        doc = doc.rstrip("\n") + "\n\n## make bench (latest run)\n\n" + section + "\n"
    with open(doc_path, "w") as f:
        f.write(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
