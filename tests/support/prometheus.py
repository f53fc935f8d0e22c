"""A strict reader of the Prometheus text exposition format (0.0.4), for tests of /metrics.

prometheus_client is not a dependency of the project, so the tests read /metrics with this: every sample must
belong to a family declared once by ``# TYPE`` before its samples (``_bucket``/``_sum``/``_count`` for a
histogram), label sets are well formed and never repeat within a name, counters are not negative, and every
histogram's buckets rise with ``le``, are cumulative and end in ``+Inf`` equal to its ``_count``. Any breach
raises ``ExpositionError`` naming the line.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count", "")}


class ExpositionError(AssertionError):
    pass


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)


@dataclass
class Family:
    name: str
    type: str
    help: str = ""
    samples: list[Sample] = field(default_factory=list)


def _labels(text: str, pos: int, line_no: int) -> tuple[tuple[tuple[str, str], ...], int]:
    assert text[pos] == "{"
    pos += 1
    out: list[tuple[str, str]] = []
    while True:
        if text[pos] == "}":
            return tuple(out), pos + 1
        m = _LABEL_NAME.match(text, pos)
        if m is None:
            raise ExpositionError(f"line {line_no}: bad label name at {text[pos:]!r}")
        name = m.group()
        pos = m.end()
        if text[pos : pos + 2] != '="':
            raise ExpositionError(f'line {line_no}: expected =" after label {name}')
        pos += 2
        value: list[str] = []
        while True:
            if pos >= len(text):
                raise ExpositionError(f"line {line_no}: unterminated label value")
            ch = text[pos]
            if ch == "\\":
                nxt = text[pos + 1 : pos + 2]
                if nxt not in ("\\", '"', "n"):
                    raise ExpositionError(f"line {line_no}: bad escape \\{nxt}")
                value.append("\n" if nxt == "n" else nxt)
                pos += 2
            elif ch == '"':
                pos += 1
                break
            elif ch == "\n":
                raise ExpositionError(f"line {line_no}: newline in a label value")
            else:
                value.append(ch)
                pos += 1
        if name in dict(out):
            raise ExpositionError(f"line {line_no}: label {name} twice")
        out.append((name, "".join(value)))
        if text[pos] == ",":
            pos += 1
        elif text[pos] != "}":
            raise ExpositionError(f"line {line_no}: expected , or }} after label {name}")


def _value(text: str, line_no: int) -> float:
    if text in ("+Inf", "Inf"):
        return math.inf
    if text == "-Inf":
        return -math.inf
    if text == "NaN":
        return math.nan
    try:
        return float(text)
    except ValueError:
        raise ExpositionError(f"line {line_no}: bad value {text!r}") from None


def parse_exposition(text: str) -> dict[str, Family]:
    """Every family in ``text`` by name, checked as the module docstring says."""
    if text and not text.endswith("\n"):
        raise ExpositionError("the exposition must end with a newline")
    families: dict[str, Family] = {}
    helps: dict[str, str] = {}
    current: Family | None = None
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for line_no, line in enumerate(text.split("\n")[:-1], start=1):
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] == "HELP":
                if parts[2] in helps:
                    raise ExpositionError(f"line {line_no}: HELP for {parts[2]} twice")
                helps[parts[2]] = parts[3] if len(parts) > 3 else ""
            elif len(parts) >= 3 and parts[1] == "TYPE":
                if len(parts) != 4 or parts[3] not in _TYPES:
                    raise ExpositionError(f"line {line_no}: bad TYPE line {line!r}")
                name = parts[2]
                if name in families:
                    raise ExpositionError(f"line {line_no}: family {name} declared twice")
                current = families[name] = Family(name, parts[3])
            continue
        m = _NAME.match(line)
        if m is None:
            raise ExpositionError(f"line {line_no}: expected a metric name in {line!r}")
        name, pos = m.group(), m.end()
        labels: tuple[tuple[str, str], ...] = ()
        if pos < len(line) and line[pos] == "{":
            labels, pos = _labels(line, pos, line_no)
        rest = line[pos:]
        if not rest.startswith(" ") or len(rest.split()) not in (1, 2):
            raise ExpositionError(f"line {line_no}: expected ' value [timestamp]' in {line!r}")
        value = _value(rest.split()[0], line_no)
        if current is None:
            raise ExpositionError(f"line {line_no}: sample {name} before any TYPE line")
        suffixes = _SUFFIXES.get(current.type, ("",))
        if not any(name == current.name + s for s in suffixes):
            raise ExpositionError(f"line {line_no}: sample {name} is not of family {current.name}")
        if (name, labels) in seen:
            raise ExpositionError(f"line {line_no}: sample {name}{dict(labels)} twice")
        seen.add((name, labels))
        if current.type == "counter" and not value >= 0:
            raise ExpositionError(f"line {line_no}: counter {name} is {value}")
        current.samples.append(Sample(name, labels, value))
    for name, family in families.items():
        family.help = helps.get(name, "")
        if family.type == "histogram":
            _check_histogram(family)
    return families


def _check_histogram(family: Family) -> None:
    series: dict[tuple[tuple[str, str], ...], dict[str, object]] = {}
    for s in family.samples:
        key = tuple(kv for kv in s.labels if kv[0] != "le")
        entry = series.setdefault(key, {"buckets": []})
        if s.name.endswith("_bucket"):
            le = s.label_dict.get("le")
            if le is None:
                raise ExpositionError(f"{family.name}: a bucket without le")
            entry["buckets"].append((_value(le, 0), s.value))  # type: ignore[union-attr]
        else:
            entry[s.name[len(family.name) + 1 :]] = s.value
    for key, entry in series.items():
        buckets: list[tuple[float, float]] = entry["buckets"]  # type: ignore[assignment]
        if "sum" not in entry or "count" not in entry:
            raise ExpositionError(f"{family.name}{dict(key)}: _sum or _count missing")
        les = [le for le, _ in buckets]
        if les != sorted(les) or len(set(les)) != len(les) or not les or les[-1] != math.inf:
            raise ExpositionError(f"{family.name}{dict(key)}: buckets out of order or no +Inf: {les}")
        counts = [c for _, c in buckets]
        if any(b < a for a, b in itertools.pairwise(counts)):
            raise ExpositionError(f"{family.name}{dict(key)}: buckets not cumulative: {counts}")
        if counts[-1] != entry["count"]:
            raise ExpositionError(
                f"{family.name}{dict(key)}: +Inf bucket {counts[-1]} != _count {entry['count']}"
            )


def value(families: dict[str, Family], name: str, suffix: str = "", **labels: str) -> float:
    """The one sample of family ``name`` (``suffix``: ``_count``, ``_sum``) whose labels include ``labels``."""
    family = families.get(name)
    if family is None:
        raise KeyError(f"no family {name} in the exposition")
    found = [
        s
        for s in family.samples
        if s.name == name + suffix and all(s.label_dict.get(k) == v for k, v in labels.items())
    ]
    if len(found) != 1:
        raise KeyError(f"{len(found)} samples of {name}{suffix} match {labels}: {family.samples[:6]}")
    return found[0].value


def values(
    families: dict[str, Family], name: str, suffix: str = ""
) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of ``name`` + ``suffix`` by label set."""
    family = families.get(name)
    if family is None:
        raise KeyError(f"no family {name} in the exposition")
    return {s.labels: s.value for s in family.samples if s.name == name + suffix}
