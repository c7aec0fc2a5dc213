"""One JSON of a tests/gpu run (tests/gpu/run.sh calls it): each test's outcome, wall time, skip reason or failure
message and the timings it recorded (``record_timing``, kept as junit properties: they come back from pytest-xdist's
workers too), with the machine it ran on. Standard library only, torch and vllm read if present."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def machine() -> dict:
    info: dict = {"python": sys.version.split()[0]}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception as e:  # no torch: the run skipped everything, and says why
        info["torch"] = f"not importable ({type(e).__name__})"
    try:
        import vllm

        info["vllm"] = vllm.__version__
    except Exception as e:
        info["vllm"] = f"not importable ({type(e).__name__}: {str(e)[:200]})"
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    info["commit"] = commit.stdout.strip() or None
    return info


def tests(junit: Path) -> list[dict]:
    if not junit.is_file():
        return []
    found = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        entry = {"test": f"{case.get('classname')}::{case.get('name')}", "seconds": float(case.get("time") or 0)}
        entry["outcome"] = "passed"
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                entry["outcome"] = "skipped" if kind == "skipped" else "failed"
                entry["message"] = (node.get("message") or node.text or "")[:2000]
        props = case.iter("property")
        timings = {p.get("name"): p.get("value") for p in props if p.get("name", "").startswith("timing:")}
        if timings:
            entry["timings"] = timings
        found.append(entry)
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--junit", type=Path, required=True)
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--exit-code", type=int, required=True)
    p.add_argument("--seconds", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    found = tests(a.junit)
    counts = {k: sum(t["outcome"] == k for t in found) for k in ("passed", "failed", "skipped")}
    log = a.log.read_text(errors="replace") if a.log.is_file() else ""
    result = {
        "exit_code": a.exit_code,
        "timed_out": a.exit_code in (124, 137),
        "wall_s": a.seconds,
        "counts": counts,
        "machine": machine(),
        "tests": found,
        "log_tail": log[-4000:],
    }
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{a.out}: {counts} in {a.seconds} s (exit {a.exit_code})")


if __name__ == "__main__":
    main()
