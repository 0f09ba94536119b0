"""Print the Markdown table of docs/replay.md (section "Coverage") from the census that `make
test-flashinfer` keeps (tests/flashinfer_real/reference_census.json): how FlashInfer's
trace templates and traced APIs can be checked against their references on the CPU.

Usage: python tools/reference_table.py [CENSUS]
"""

import json
import os
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
CENSUS = os.path.join(HERE, "..", "tests", "flashinfer_real", "reference_census.json")

# (category, test on the recorded outcome), first match wins
CATEGORIES = [
    ("checked end to end on CPU", lambda r: r == "end to end"),
    ("no `init` (no inputs to record)", lambda r: r == "no init"),
    ("template without `reference`", lambda r: r == "no reference"),
    ("not attached to any API", lambda r: r == "not attached to any API"),
    ("`init` needs CUDA or fails on CPU", lambda r: r.startswith("init fails")),
    ("reference fails on CPU on the init's inputs", lambda r: r.startswith("reference fails")),
    (
        "returns nothing (writes in place; a recording holds its inputs only)",
        lambda r: "returned nothing" in r,
    ),
    ("random outputs without a property check", lambda r: "random outputs" in r),
    (
        "recorded by its bare method name (class not named `*Wrapper*`)",
        lambda r: "is not implemented by the installed flashinfer" in r,
    ),
    ("other", lambda r: True),
]


def category(reason):
    return next(name for name, test in CATEGORIES if test(reason))


def main(path):
    with open(path) as f:
        census = json.load(f)
    outcomes, apis = census["outcomes"], census.get("apis", {})
    by_category = Counter(category(r) for r in outcomes.values())
    print(f"| {census['templates']} trace templates | count |")
    print("|---|---|")
    for name, _ in CATEGORIES:
        if by_category[name]:
            print(f"| {name} | {by_category[name]} |")
    traced = {a for a in apis.values() if a}
    best = {}
    for label, api in apis.items():
        if api:
            ok = outcomes[label] == "end to end"
            best[api] = best.get(api, False) or ok
    print()
    print(f"| {len(traced)} traced APIs | count |")
    print("|---|---|")
    print(f"| with a template checked end to end on CPU | {sum(best.values())} |")
    print(f"| none of whose templates is | {len(best) - sum(best.values())} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else CENSUS)
