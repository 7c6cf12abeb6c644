"""The naming rules of `promtool check metrics` (client_golang's promlint), over an exposition parsed by
prometheus_client's own parser. promtool ships as a Go binary, not on PyPI, so its rules are applied
here: help text, `_total` only and always on counters, base units, no abbreviated units, no type in the
name, no ':' or camelCase, histogram/summary suffixes and labels reserved."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

BASE_UNITS = {"amperes", "bytes", "celsius", "grams", "joules", "kelvin", "meters", "metres", "seconds", "volts"}
NON_BASE_UNITS = {
    "minutes": "seconds",
    "hours": "seconds",
    "days": "seconds",
    "weeks": "seconds",
    "kelvins": "kelvin",
    "fahrenheit": "celsius",
    "rankine": "celsius",
    "inches": "meters",
    "yards": "meters",
    "miles": "meters",
    "bits": "bytes",
    "calories": "joules",
    "pounds": "grams",
    "ounces": "grams",
}
UNIT_PREFIXES = (
    "pico",
    "nano",
    "micro",
    "milli",
    "centi",
    "deci",
    "deca",
    "hecto",
    "kilo",
    "kibi",
    "mega",
    "mibi",
    "giga",
    "gibi",
    "tera",
    "tebi",
    "peta",
    "pebi",
)
ABBREVIATIONS = ("s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m", "h", "d")
TYPES = ("counter", "gauge", "summary", "histogram", "gaugehistogram", "info", "stateset")
_CAMEL = re.compile(r"[a-z][A-Z]")


def _unit(name: str) -> tuple[str, str] | None:
    for token in name.split("_"):
        units = {**{u: u for u in BASE_UNITS}, **NON_BASE_UNITS}
        if token in units:
            return token, units[token]
        for prefix in UNIT_PREFIXES:
            if token.startswith(prefix) and token[len(prefix) :] in units:
                return token, units[token[len(prefix) :]]
    return None


def lint(exposition: str) -> list[str]:
    """Problems as `name: what`, empty when promtool would accept the exposition."""
    problems: list[str] = []
    for family in text_string_to_metric_families(exposition):
        kind = family.type
        # the parser drops a counter's `_total` from the family name: the samples keep it
        names = {s.name for s in family.samples} or {family.name}
        exposed = next(iter(sorted(names))) if kind != "counter" else f"{family.name}_total"
        say = problems.append
        if not family.documentation.strip():
            say(f"{exposed}: no help text")
        if kind == "counter" and not all(n.endswith(("_total", "_created")) for n in names):
            say(f"{exposed}: counter metrics should have '_total' suffix")
        if kind not in ("counter", "unknown") and exposed.endswith("_total"):
            say(f"{exposed}: non-counter metrics should not have '_total' suffix")
        unit = _unit(exposed)
        if unit is not None and unit[0] != unit[1]:
            say(f"{exposed}: use base unit {unit[1]!r} instead of {unit[0]!r}")
        lower = exposed.lower()
        for t in TYPES:
            if f"_{t}_" in lower or lower.endswith(f"_{t}"):
                say(f"{exposed}: metric name should not include type {t!r}")
        if ":" in exposed:
            say(f"{exposed}: metric names should not contain ':'")
        if _CAMEL.search(exposed) or any(_CAMEL.search(label) for s in family.samples for label in s.labels):
            say(f"{exposed}: names should be snake_case, not camelCase")
        for a in ABBREVIATIONS:
            if f"_{a}_" in lower or lower.endswith(f"_{a}"):
                say(f"{exposed}: metric names should not contain abbreviated units")
        if kind not in ("histogram", "unknown") and exposed.endswith("_bucket"):
            say(f"{exposed}: non-histogram metrics should not have '_bucket' suffix")
        if kind not in ("histogram", "summary", "unknown") and exposed.endswith(("_count", "_sum")):
            say(f"{exposed}: only histograms and summaries end in _count or _sum")
        labels = {label for s in family.samples for label in s.labels}
        if kind != "histogram" and "le" in labels:
            say(f"{exposed}: non-histogram metrics should not have 'le' label")
        if kind != "summary" and "quantile" in labels:
            say(f"{exposed}: non-summary metrics should not have 'quantile' label")
    return problems
