"""Fail when a CPU test skipped: the only skips allowed on CI's GPU-less machine are the GPU tests' (and the
optional frameworks', torch and JAX, which CI does not install). Reads pytest's JUnit XML."""
from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET

ALLOWED = re.compile(r"gpu test:|GPU|could not import '(torch|jax)'|torch has no CUDA")


def main(path: str) -> int:
    bad = []
    total = 0
    for case in ET.parse(path).getroot().iter("testcase"):
        for skip in case.findall("skipped"):
            total += 1
            # A module skipped at collection reports "collection skipped" as its message and the reason as text.
            msg = f"{skip.get('message', '')} {skip.text or ''}"
            if not ALLOWED.search(msg):
                bad.append(f"{case.get('classname')}::{case.get('name')}: {msg}")
    if bad:
        print(f"{len(bad)} CPU tests skipped (CI must run them all):", *bad, sep="\n  ", file=sys.stderr)
        return 1
    print(f"skips: {total}, all GPU-only")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
