"""Condense Snakemake's output for scripts/study.sh: one line per finished job, the whole output in a file.

Reads Snakemake's output on stdin, appends every line to the file given as the first argument and prints
    [  12/155  3m05s] train negclip/coco/seed0   (method=negclip, dataset=coco, seed=0)
for each finished job, plus Snakemake's own error blocks and "Nothing to be done" as they come.
"""

from __future__ import annotations

import re
import sys
import time

JOB = re.compile(r"^(?:local)?rule (\S+):$")
FIELD = re.compile(r"^\s+(jobid|wildcards): (.*)$")
FINISHED = re.compile(r"^Finished jobid: (\d+)")
TOTAL = re.compile(r"^total\s+(\d+)$")
ERROR_START = re.compile(r"^(Error in rule|RuleException|MissingInputException|WorkflowError|"
                         r"Exiting because|Error:|.*Exception in|IncompleteFilesException)")


def main() -> None:
    started = time.monotonic()
    jobs: dict[str, tuple[str, str]] = {}
    rule, done, total, in_error = "", 0, "?", False
    with open(sys.argv[1], "a", encoding="utf-8") as full:
        for line in sys.stdin:
            full.write(line)
            full.flush()
            text = line.rstrip("\n")
            if match := TOTAL.match(text):
                total = match[1] if total == "?" else total
            if match := JOB.match(text):
                rule, jobid, wildcards = match[1], "", ""
            elif (match := FIELD.match(text)) and rule:
                if match[1] == "jobid":
                    jobid = match[2]
                    jobs[jobid] = (rule, "")
                elif jobid:
                    jobs[jobid] = (rule, match[2])
            elif match := FINISHED.match(text):
                done += 1
                name, wildcards = jobs.get(match[1], (text.split("Rule: ")[-1].rstrip(")"), ""))
                minutes, seconds = divmod(int(time.monotonic() - started), 60)
                print(f"[{done:>4}/{total} {minutes:>3}m{seconds:02d}s] {name}"
                      + (f"  ({wildcards})" if wildcards else ""), flush=True)
            if ERROR_START.match(text):
                in_error = True
            if in_error:
                print(text, flush=True)
                in_error = text.strip() != ""
            elif "Nothing to be done" in text:
                print(text, flush=True)


if __name__ == "__main__":
    main()
