"""A Prometheus text page (exposition format 0.0.4) from (family, labels, value) readings, families in order."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

Reading = tuple[str, Mapping[str, str], float]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_page(readings: Iterable[Reading], helps: Mapping[str, str], kinds: Mapping[str, str]) -> bytes:
    """One `# HELP`/`# TYPE` pair per family, then its series in reading order (a family's readings together)."""
    families: dict[str, list[str]] = {}
    for family, labels, value in readings:
        text = ",".join(f'{name}="{_escape(str(v))}"' for name, v in labels.items())
        families.setdefault(family, []).append(f"{family}{{{text}}} {value!r}")
    out: list[str] = []
    for family, lines in families.items():
        out.append(f"# HELP {family} {helps.get(family, family)}")
        out.append(f"# TYPE {family} {kinds.get(family, 'gauge')}")
        out += lines
    return ("\n".join(out) + "\n").encode() if out else b""
