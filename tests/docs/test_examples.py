"""Every command and code block of the README and the docs pages runs as written, or is checked against what it names.

Run for real, against ``python -m service`` on the shipped models (the ``server`` fixture) from a
folder holding ``shoe.png`` (``workdir``), with ``http://127.0.0.1:8000`` / ``localhost:8000``
pointed at that server (and ``127.0.0.1:8001`` at its gRPC server):

- every ``python`` block, in a fresh interpreter;
- every ``curl``, ``cp`` and ``attnserve-client`` line of a ``bash`` block, in order, in one bash
  script per block (``set -euo pipefail``; curl fails on an HTTP error status).

Checked against what they name, because they build images, train for hours or need hardware:
every other line of a ``bash`` block, and every inline command (`` `make ...` ``,
`` `python -m ...` ``) of the prose: ``make`` targets and variables exist in the Makefile;
``python -m`` modules exist and take every ``--option`` used (their ``--help`` lists it); paths,
pip extras, Dockerfile stages and build arguments, Compose profiles and services, and Kubernetes
objects exist. A command of any other kind fails the test until a check for it is added here.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from tests.docs.markdown import DOCS, Block, blocks, code_spans, commands, documents, inline_code, section, table_rows
from tests.service.service_testing import ROOT

DOC_URL, DOC_HOST = "http://127.0.0.1:8000", ("127.0.0.1:8000", "localhost:8000")
DOC_GRPC = ("127.0.0.1:8001", "localhost:8001")
LANGUAGES = {"bash", "python", "json", "text"}  # every block says what it is; bash and python are run or checked
LIVE = ("curl", "cp", "attnserve-client")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
INLINE_COMMAND = re.compile(r"^(?:make |(?:\.venv/bin/)?python3? -m )")

ALL_BLOCKS = [block for path in documents() for block in blocks(path)]
PYTHON_BLOCKS = [b for b in ALL_BLOCKS if b.lang == "python"]
SHELL_BLOCKS = [b for b in ALL_BLOCKS if b.lang == "bash"]


def is_live(line: str) -> bool:
    """A line run against the service: a command that talks to it, or a variable set from one (``ID=$(curl ...)``)."""
    if re.match(r"^[A-Za-z_]\w*=\$\(", line):
        return True
    return line.split()[0] in LIVE


def live_lines(block: Block) -> list[str]:
    return [line for line in commands(block.code) if is_live(line)]


def static_lines() -> list[tuple[str, str]]:
    """(where, command) of every command that is checked rather than run."""
    found = [(b.id, line) for b in SHELL_BLOCKS for line in commands(b.code) if not is_live(line)]
    for path in documents():
        found += [(str(path.relative_to(ROOT)), span) for span in inline_code(path) if INLINE_COMMAND.match(span)]
    return found


def at_server(text: str, server) -> str:
    """``text`` with the docs' addresses (HTTP on 8000, gRPC on 8001) pointed at ``server``."""
    text = text.replace(DOC_URL, server.url)
    for host in DOC_HOST:
        text = text.replace(host, server.url.removeprefix("http://"))
    for host in DOC_GRPC:
        text = text.replace(host, server.grpc)
    return text


# ---- run for real ----------------------------------------------------------------------------------


def test_every_block_says_its_language():
    unknown = [b.id for b in ALL_BLOCKS if b.lang not in LANGUAGES]
    assert unknown == [], f"give these blocks one of {sorted(LANGUAGES)}"


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda b: b.id)
def test_python_blocks_run(block, server, workdir):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "ATTNSERVE_BASE_URL": server.url}
    proc = subprocess.run(
        [sys.executable, "-c", at_server(block.code, server)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip(), "an example that prints nothing shows the reader nothing"


SHELL_PRELUDE = f"""set -euo pipefail
curl() {{ command curl --fail-with-body --show-error "$@"; }}
attnserve-client() {{ {shlex.quote(sys.executable)} -m attnserve_client "$@"; }}
"""


@pytest.mark.parametrize("block", [b for b in SHELL_BLOCKS if live_lines(b)], ids=lambda b: b.id)
def test_shell_commands_run(block, server, workdir):
    script = SHELL_PRELUDE + "\n".join(at_server(line, server) for line in live_lines(block)) + "\n"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "ATTNSERVE_BASE_URL": server.url}
    proc = subprocess.run(
        ["bash", "-c", script], cwd=workdir, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert proc.returncode == 0, f"{script}\n--- stdout\n{proc.stdout[-2000:]}\n--- stderr\n{proc.stderr[-2000:]}"


def test_the_metrics_table_is_the_services(server):
    text = httpx.get(server.url + "/metrics").text
    exposed = set(re.findall(r"^# TYPE (attnserve_\w+) ", text, re.MULTILINE))
    exposed = {m for m in exposed if not m.endswith("_created")}  # prometheus_client's creation time of each series
    rows = table_rows(section(DOCS / "api.md", "## `GET /metrics`"))
    documented = {span for cells in rows for span in code_spans(cells[0])}
    assert sorted(exposed - documented) == [] and sorted(documented - exposed) == []


def test_the_readme_tour_is_run():
    """The README's tour is among the blocks run above: the quick start is what a newcomer tries first."""
    tour = [b for b in SHELL_BLOCKS if b.path.name == "README.md" and b.section == "Two-minute tour"]
    assert tour and any(line.startswith("curl") for line in live_lines(tour[0]))
    assert {b.section for b in PYTHON_BLOCKS if b.path.name == "README.md"} == {"Python client"}


# ---- checked against what they name ----------------------------------------------------------------


@functools.cache
def makefile() -> tuple[set[str], set[str]]:
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", text, re.MULTILINE))
    variables = set(re.findall(r"^([A-Z_]+)\s*[?:]?=", text, re.MULTILINE)) | set(re.findall(r"\$\(([A-Z_]+)\)", text))
    return targets, variables


@functools.cache
def help_text(module: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"python -m {module} --help: {proc.stderr[-1000:]}"
    return proc.stdout


@functools.cache
def dockerfile(path: str = "Dockerfile") -> tuple[set[str], set[str]]:
    text = (ROOT / path).read_text()
    stages = {s.lower() for s in re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", text, re.MULTILINE | re.IGNORECASE)}
    return stages, set(re.findall(r"^ARG\s+([A-Z_]+)", text, re.MULTILINE))


@functools.cache
def compose() -> tuple[set[str], set[str]]:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    return set(services), {p for s in services.values() for p in s.get("profiles", [])}


@functools.cache
def kubernetes_objects() -> set[str]:
    found = set()
    for path in (ROOT / "deploy" / "k8s").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and "kind" in doc:
                found.add(f"{doc['kind'].lower()}/{doc.get('metadata', {}).get('name')}")
    return found


def options(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


def check_make(args: list[str], cwd: Path) -> None:
    targets, variables = makefile()
    for arg in args:
        if ASSIGNMENT.match(arg):
            assert arg.split("=", 1)[0] in variables, f"the Makefile has no variable {arg.split('=', 1)[0]}"
        else:
            assert arg in targets, f"the Makefile has no target {arg!r}"


def check_python(args: list[str], cwd: Path) -> None:
    assert args[:1] == ["-m"], f"only `python -m <module>` commands are documented, not {args}"
    module, rest = args[1], args[2:]
    if module == "pytest":
        values_of = {"-k", "-m"}
        paths = [a for i, a in enumerate(rest) if not a.startswith("-") and (i == 0 or rest[i - 1] not in values_of)]
        assert all((cwd / p).exists() for p in paths), paths
        return
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # a parent package is missing
        spec = None
    assert spec is not None, f"no module {module}"
    missing = [o for o in options(rest) if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", help_text(module))]
    assert missing == [], f"python -m {module} --help lists no {missing}"


def extras_of(pyproject: Path) -> set[str]:
    """The extras a pyproject.toml declares (read by pattern: tomllib needs Python 3.11, the project 3.10)."""
    text = pyproject.read_text()
    table = re.search(r"^\[project\.optional-dependencies\]\n(.*?)(?=^\[|\Z)", text, re.MULTILINE | re.DOTALL)
    return set(re.findall(r"^([\w-]+)\s*=", table.group(1), re.MULTILINE)) if table else set()


def check_pip(args: list[str], cwd: Path) -> None:
    assert args[0] == "install"
    for arg in (a for a in args[1:] if not a.startswith("-")):
        path, _, extras = re.fullmatch(r"([^\[]+)(\[(.*)\])?", arg).groups()
        known = extras_of(cwd / path / "pyproject.toml")
        assert set(filter(None, (extras or "").split(","))) <= known, f"{arg}: extras of {path} are {known}"


def check_docker(args: list[str], cwd: Path) -> None:
    if args[0] == "build":
        file = args[args.index("-f") + 1] if "-f" in args else "Dockerfile"
        assert (cwd / file).is_file(), f"no {file}"
        stages, build_args = dockerfile(file)
        for flag, value in itertools.pairwise(args):
            if flag == "--target":
                assert value in stages, f"the Dockerfile has no stage {value}"
            if flag == "--build-arg":
                assert value.split("=", 1)[0] in build_args, f"the Dockerfile has no ARG {value}"
    elif args[0] == "compose":
        services, profiles = compose()
        rest, i = args[1:], 0
        while rest[i].startswith("-"):
            assert rest[i] != "--profile" or rest[i + 1] in profiles, f"docker-compose.yml has no profile {rest[i + 1]}"
            i += 2 if rest[i] in ("--profile", "-f") else 1
        subcommand, rest = rest[i], rest[i + 1 :]
        assert subcommand in {"up", "down", "run", "stop", "ps", "logs", "config", "build"}, subcommand
        if subcommand == "up":
            named = {a for a in rest if not a.startswith("-")}
            assert named <= services, f"docker-compose.yml has no service {named - services}"
        elif subcommand == "run":
            service, *command = [a for a in rest if a != "--rm"]  # the service, then the command run in it
            assert service in services, f"docker-compose.yml has no service {service}"
            check_command(command, cwd)
    else:
        assert args[0] in {"run", "push"}, f"docker {args[0]}: no check"


def check_kubectl(args: list[str], cwd: Path) -> None:
    assert args[0] in {"apply", "rollout", "port-forward", "get"}, f"kubectl {args[0]}: no check"
    if args[:2] == ["apply", "-k"]:
        assert (cwd / args[2] / "kustomization.yaml").is_file()
    for flag, value in itertools.pairwise(args):
        if flag == "-f":
            assert (cwd / value).is_file(), f"no manifest {value}"
    if args[:2] == ["get", "inferenceservice"]:
        names = {yaml.safe_load(p.read_text())["metadata"]["name"] for p in (ROOT / "deploy" / "kserve").glob("*.yaml")}
        assert args[2] in names, f"deploy/kserve defines no InferenceService {args[2]}"
    for arg in args:
        if re.fullmatch(r"(deployment|service)/[\w-]+", arg):
            assert arg in kubernetes_objects(), f"deploy/k8s defines no {arg}"


def check_helm(args: list[str], cwd: Path) -> None:
    """Charts installed beside the manifests: a ConfigMap a chart is told to use is one deploy/k8s defines."""
    assert args[:2] == ["repo", "add"] or args[0] == "install", f"helm {args[0]}: no check"
    for flag, value in itertools.pairwise(args):
        if flag == "--set" and value.startswith("rules.existing="):
            name = value.split("=", 1)[1]
            assert f"configmap/{name}" in kubernetes_objects(), f"deploy/k8s defines no ConfigMap {name}"


def check_cd(args: list[str], cwd: Path) -> None:
    assert (cwd / args[0]).is_dir()


def check_schemathesis(args: list[str], cwd: Path) -> None:
    """The contract test's tool (test extra): its config file exists and the paths it names are routes."""
    from service.http.routes import ROUTES

    assert (cwd / args[args.index("--config-file") + 1]).is_file()
    paths = {r.path for r in ROUTES}
    for i, arg in enumerate(args):
        if arg in ("--include-path", "--exclude-path"):
            assert args[i + 1] in paths, f"{arg} {args[i + 1]}: no such route"


CHECKS: dict[str, Callable[[list[str], Path], None]] = {
    "make": check_make,
    "python": check_python,
    "python3": check_python,
    ".venv/bin/python": check_python,
    "pip": check_pip,
    "docker": check_docker,
    "kubectl": check_kubectl,
    "helm": check_helm,
    "cd": check_cd,
    "kustomize": lambda args, cwd: None,  # edits deploy/k8s/kustomization.yaml, which check_kubectl reads
    ".venv/bin/ruff": lambda args, cwd: None,  # the linter of the test extra, on the tree
    ".venv/bin/schemathesis": check_schemathesis,
}


def check_command(tokens: list[str], cwd: Path = ROOT) -> None:
    while tokens and ASSIGNMENT.match(tokens[0]):  # VAR=value before the command: the environment
        tokens = tokens[1:]
    assert tokens[0] in CHECKS, f"no check for a `{tokens[0]}` command: add one to {__name__}"
    CHECKS[tokens[0]](tokens[1:], cwd)


@pytest.mark.parametrize(("where", "line"), static_lines(), ids=[f"{w}: {c}" for w, c in static_lines()])
def test_other_commands_name_what_exists(where, line):
    for part in line.split("&&"):
        check_command(shlex.split(part.strip().strip("()"), comments=True))


@pytest.mark.parametrize(
    "line",
    [
        "make no-such-target",
        "make serve NO_SUCH_VARIABLE=1",
        ".venv/bin/python -m export.vit --no-such-option",
        ".venv/bin/python -m no.such.module",
        "docker build --target no-such-stage .",
        "docker compose --profile no-such-profile up -d",
        "pip install './client[no-such-extra]'",
        "kubectl rollout status deployment/no-such-deployment",
        "helm install adapter chart --set rules.existing=no-such-configmap",
        "rm -rf /",
    ],
)
def test_a_wrong_command_is_noticed(line):
    """The static checks can fail: each of these names something that does not exist."""
    with pytest.raises(AssertionError):
        check_command(shlex.split(line, comments=True))


def makefile_python_commands(text: str) -> list[list[str]]:
    """The Makefile's recipe lines running one of our modules (``$(BIN)/python -m model|export|benchmarks...``),
    the variables replaced by their defaults (empty when they have none)."""
    defaults = {k: v.split("#", 1)[0].strip() for k, v in re.findall(r"^([A-Z_]+)\s*\?=(.*)$", text, re.MULTILINE)}
    lines = re.findall(r"^\t.*\$\(BIN\)/python (-m (?:model|export|benchmarks)\..*)$", text, re.MULTILINE)
    return [shlex.split(re.sub(r"\$\(([A-Z_]+)\)", lambda m: defaults.get(m[1], ""), line)) for line in lines]


def test_the_makefiles_commands_take_their_options():
    """A recipe passing an option its module lacks fails only when run (``make export`` once asked
    export.vit for ``--average``): every option of every recipe is in its module's --help."""
    commands = makefile_python_commands((ROOT / "Makefile").read_text())
    assert len(commands) >= 10
    for args in commands:
        check_python(args, ROOT)
    wrong = makefile_python_commands("OPT ?= --average 8# a comment\n\n\t$(BIN)/python -m export.vit $(OPT)\n")
    assert wrong == [["-m", "export.vit", "--average", "8"]]
    with pytest.raises(AssertionError):
        check_python(wrong[0], ROOT)
