"""Readers for the deployment files, shared by the tests: Dockerfile stages, .dockerignore matching,
the service's routes, settings and drain time."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Instruction:
    cmd: str  # upper case: FROM, RUN, COPY, ...
    args: str
    line: int


@dataclass
class Stage:
    name: str
    base: str  # with the global ARG defaults substituted
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, cmd: str) -> list[Instruction]:
        return [i for i in self.instructions if i.cmd == cmd]

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for i in self.all("ENV"):
            for item in shlex.split(i.args):
                key, _, value = item.partition("=")
                out[key] = value
        return out


@dataclass
class Dockerfile:
    args: dict[str, str]  # global ARGs (before the first FROM) and their defaults
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.stages]


def logical_lines(text: str) -> list[tuple[int, str]]:
    """Instructions with their continuation lines joined; comment lines dropped (as Docker does)."""
    out, buf, start = [], "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not buf):
            continue
        if not buf:
            start = n
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        out.append((start, buf + stripped))
        buf = ""
    return out


def substitute(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), value)


def parse_dockerfile(path: Path = ROOT / "Dockerfile") -> Dockerfile:
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line, text in logical_lines(path.read_text()):
        cmd, _, rest = text.partition(" ")
        cmd, rest = cmd.upper(), rest.strip()
        if cmd == "FROM":
            m = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            assert m, f"Dockerfile:{line}: cannot read FROM {rest!r}"
            stages.append(Stage(name=m.group(2) or str(len(stages)), base=substitute(m.group(1), args)))
        elif not stages:
            assert cmd == "ARG", f"Dockerfile:{line}: {cmd} before the first FROM"
            key, _, default = rest.partition("=")
            args[key] = default
        else:
            stages[-1].instructions.append(Instruction(cmd, rest, line))
    return Dockerfile(args, stages)


def copy_parts(instr: Instruction) -> tuple[dict[str, str], list[str], str]:
    """``COPY [--flag=value ...] src... dest`` -> (flags, sources, dest)."""
    words = shlex.split(instr.args)
    flags = dict(w[2:].partition("=")[::2] for w in words if w.startswith("--"))
    paths = [w for w in words if not w.startswith("--")]
    return flags, paths[:-1], paths[-1]


def exec_form(args: str) -> list[str]:
    """The JSON (exec) form of CMD/ENTRYPOINT/HEALTHCHECK CMD, refusing the shell form."""
    import json

    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


# --- .dockerignore, with Docker's semantics: the last matching pattern wins, a pattern matching a
# parent directory matches everything below it, `*` and `?` stop at `/`, `**` crosses it.
def _pattern_regex(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            if pattern.startswith("/", i):
                out, i = out + "/?", i + 1
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def dockerignore_rules(path: Path = ROOT / ".dockerignore") -> list[tuple[bool, re.Pattern]]:
    rules = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((negate, _pattern_regex(pattern)))
    return rules


def ignored(relpath: str, rules) -> bool:
    parts = relpath.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for negate, rx in rules:
        if any(rx.match(p) for p in prefixes):
            excluded = not negate
    return excluded


def parse_haproxy(text: str) -> dict[tuple[str, str], list[list[str]]]:
    """An HAProxy configuration as its sections, ``(keyword, name)`` (``("global", "")``,
    ``("backend", "api-http")``), each a list of its lines split into words, comments dropped."""
    sections: dict[tuple[str, str], list[list[str]]] = {}
    current: list[list[str]] | None = None
    for raw in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if not line.strip():
            continue
        words = shlex.split(line, posix=True)
        if not raw[0].isspace():
            current = sections.setdefault((words[0], words[1] if len(words) > 1 else ""), [])
        else:
            assert current is not None, f"a line outside any section: {raw!r}"
            current.append(words)
    return sections


def load_pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


# --- the service -----------------------------------------------------------------------------------
def route_paths() -> set[str]:
    from service.http.routes import ROUTES

    return {r.path for r in ROUTES}


def settings_fields() -> set[str]:
    """Read at test time: fields added to Settings later are picked up without editing the tests."""
    from service.settings import Settings

    return set(Settings.model_fields)


def settings_from(env: dict[str, str], monkeypatch):
    """Build Settings from exactly these variables (others' ATTNSERVE_* removed), as the service does."""
    from service.settings import Settings

    for key in list(os.environ):
        if key.startswith("ATTNSERVE_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    return Settings()


def attnserve_env(env: dict) -> dict[str, str]:
    """The ATTNSERVE_* variables as the container gets them when the shell sets none: ``${VAR:-default}``
    interpolated as Compose does."""
    return {
        k: re.sub(r"\$\{\w+:-([^}]*)\}", lambda m: m[1], str(v)) for k, v in env.items() if k.startswith("ATTNSERVE_")
    }


def drain_seconds(settings) -> float:
    """How long the service may take to end after SIGTERM with these settings: the drain delay (still
    accepting, /readyz 503), then the drain of HTTP and gRPC together (service/process.py)."""
    return settings.drain_delay_s + settings.drain_timeout_s


def duration_seconds(value: str | int) -> float:
    """``40s``, ``1m30s`` or a number of seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", value)
    assert parts and "".join(a + u for a, u in parts) == value, f"not a duration: {value!r}"
    return sum(float(a) * units[u] for a, u in parts)
