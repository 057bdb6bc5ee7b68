#!/usr/bin/env python3
"""Syntax-checks the PromQL of a Grafana dashboard (contrib/grafana/memtide.json) with
`promtool check rules`.

Every panel target's `expr` (rows' nested panels included) and the metric selector of
every query variable's `label_values(SELECTOR, LABEL)` become recording rules in a
temporary rules file, after Grafana's variables are replaced by values PromQL accepts:
the interval variables ($__rate_interval, $__interval, $__range, ...) by a duration, the
numeric ones ($__interval_ms, $__range_s, ...) by a number, and the dashboard's own
variables ($vm, ${instance}, ${instance:regex}, [[vm]]) by a regex (".+"), which
fits where they stand: inside a label matcher's quotes. A variable of neither
kind, or an expression left empty, is an error. promtool then parses every expression
and names the rule of any that does not parse.

    scripts/check-dashboard.py [DASHBOARD.json ...]   # default: contrib/grafana/memtide.json
    PROMTOOL=/path/to/promtool scripts/check-dashboard.py

Needs promtool on the PATH (scripts/test.sh unpacks it into target/tools/usr/bin).
Exits non-zero on any failure; prints how many expressions were checked.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

DURATIONS = {"__rate_interval", "__interval", "__range", "__auto_interval"}
NUMBERS = {"__interval_ms", "__range_s", "__range_ms", "__from", "__to"}
# $name, ${name}, ${name:format}, [[name]], [[name:format]]
VARIABLE = re.compile(
    r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\]"
)


def panels(items):
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def substitute(expr, variables, where):
    def value(match):
        name = match.group(1) or match.group(2) or match.group(3)
        # Interval variables ($__auto_interval_NAME included).
        if name in DURATIONS or name.startswith("__auto_interval"):
            return "5m"
        if name in NUMBERS:
            return "300"
        if name in variables:
            # Not ".*": a selector of matchers that all match the empty string is
            # refused ("at least one non-empty matcher"), and Grafana sends values.
            return ".+"
        raise ValueError(f"{where}: unknown variable ${name} in {expr!r}")

    return VARIABLE.sub(value, expr)


def expressions(path):
    """(where, PromQL) for every query of the dashboard at `path`."""
    with open(path) as f:
        dashboard = json.load(f)
    templating = dashboard.get("templating", {}).get("list", [])
    variables = {v["name"] for v in templating}
    out = []
    for panel in panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if "expr" not in target:
                continue
            where = f"panel {panel.get('title', panel.get('id'))!r} target {target.get('refId', '?')}"
            if not target["expr"].strip():
                raise ValueError(f"{where}: empty expr")
            out.append((where, substitute(target["expr"], variables, where)))
    for v in templating:
        if v.get("type") != "query":
            continue
        query = v.get("query")
        query = query.get("query", "") if isinstance(query, dict) else query or ""
        where = f"variable ${v['name']}"
        m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", query, re.S)
        if m:
            out.append((where, substitute(m.group(1), variables, where)))
        elif re.fullmatch(r"\s*label_values\(\s*\w+\s*\)\s*", query):
            continue  # a label name alone: no PromQL
        else:
            raise ValueError(f"{where}: query {query!r} is not label_values(SELECTOR, LABEL)")
    return out


def main(paths):
    promtool = os.environ.get("PROMTOOL", "promtool")
    for path in paths:
        try:
            exprs = expressions(path)
        except (OSError, ValueError, KeyError) as e:
            print(f"check-dashboard: {path}: {e}", file=sys.stderr)
            return 1
        if not exprs:
            print(f"check-dashboard: {path}: no PromQL expressions found", file=sys.stderr)
            return 1
        lines = ["groups:", "  - name: dashboard", "    rules:"]
        for i, (where, expr) in enumerate(exprs):
            lines.append(f"      # {path}: {where}")
            lines.append(f"      - record: dashboard:expr_{i}")
            lines.append(f"        expr: {json.dumps(expr)}")
        with tempfile.NamedTemporaryFile("w", suffix=".yml", prefix="dashboard-") as rules:
            rules.write("\n".join(lines) + "\n")
            rules.flush()
            result = subprocess.run(
                [promtool, "check", "rules", rules.name], capture_output=True, text=True
            )
            if result.returncode != 0:
                print(result.stdout + result.stderr, file=sys.stderr)
                # Say which query each failing rule is.
                failed = {int(n) for n in re.findall(r"dashboard:expr_(\d+)", result.stdout + result.stderr)}
                for i in sorted(failed):
                    where, expr = exprs[i]
                    print(f"  dashboard:expr_{i} is {where}: {expr}", file=sys.stderr)
                print(f"check-dashboard: {path}: promtool check rules failed (above)", file=sys.stderr)
                return 1
        print(f"check-dashboard: {path}: {len(exprs)} PromQL expressions parse (promtool check rules)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["contrib/grafana/memtide.json"]))
