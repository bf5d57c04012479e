"""The Dockerfiles, read as Docker would build them: stages, copied paths, installs, runtime settings.

Each test checks one thing a build or a container start would trip on, in milliseconds and without
root; test_containers.py builds and runs the images for real.
"""

from __future__ import annotations

import http.server
import re
import shlex
import subprocess
import sys
import threading

import pytest

from tests.deploy.parsing import (
    ROOT,
    attnserve_env,
    copy_parts,
    dockerignore_rules,
    exec_form,
    ignored,
    load_pyproject,
    parse_dockerfile,
    route_paths,
    settings_fields,
    settings_from,
    substitute,
)

RUNTIME_TARGETS = {"cpu": "build-cpu", "gpu": "build-gpu"}  # target -> the stage that installs its venv


TRAIN_DOCKERFILE = ROOT / "deploy" / "train.Dockerfile"


@pytest.fixture(scope="module")
def dockerfile():
    return parse_dockerfile()


@pytest.fixture(scope="module")
def train_dockerfile():
    return parse_dockerfile(TRAIN_DOCKERFILE)


@pytest.fixture(scope="module")
def pyproject():
    return load_pyproject()


def test_stages_and_default_target(dockerfile):
    names = dockerfile.names
    assert len(names) == len(set(names)), f"duplicate stage names: {names}"
    assert {"models-shipped", "models", "cpu", "gpu"} <= set(names)
    assert names[-1] == "gpu", "the last stage is what `docker build` builds without --target"
    # the model stage is chosen by the MODELS_IMAGE build argument, and its default names a stage
    models = dockerfile.stage("models")
    assert models.base == dockerfile.args["MODELS_IMAGE"] == "models-shipped"


def needed(dockerfile, target: str) -> set[str]:
    """The stages ``target`` depends on (its base and COPY --from sources, transitively), itself included."""
    out, todo = set(), [target]
    while todo:
        stage = dockerfile.stage(todo.pop())
        out.add(stage.name)
        sources = [stage.base] + [copy_parts(i)[0].get("from", "") for i in stage.all("COPY")]
        todo += [s for s in sources if s in dockerfile.names and s not in out]
    return out


def test_every_stage_is_needed_by_a_runtime_target(dockerfile):
    """The legacy builder (Docker without BuildKit, Compose v1) builds every stage before its target:
    a stage no runtime target needs, such as training, would run on every build."""
    assert needed(dockerfile, "cpu") | needed(dockerfile, "gpu") == set(dockerfile.names)
    # `--target cpu` builds what comes before cpu: nothing of the gpu target
    assert dockerfile.names.index("cpu") < min(dockerfile.names.index(n) for n in ("build-gpu", "gpu"))


def test_every_base_is_an_earlier_stage_or_a_pinned_image(dockerfile, train_dockerfile):
    for file in (dockerfile, train_dockerfile):
        for i, stage in enumerate(file.stages):
            earlier = file.names[:i]
            if stage.base in earlier or stage.base == "scratch":
                continue
            assert "$" not in stage.base, f"{stage.name}: unresolved base {stage.base}"
            assert re.fullmatch(r"[\w./-]+:[\w.-]+", stage.base), f"{stage.name}: base {stage.base} has no tag"
            assert stage.base not in file.names, f"{stage.name}: stage {stage.base} is defined later"


def test_base_images(dockerfile, train_dockerfile, pyproject):
    cuda = dockerfile.args["CUDA_IMAGE"]
    assert cuda.startswith("nvidia/cuda:") and "cudnn" in cuda and "runtime" in cuda, cuda
    assert dockerfile.stage("gpu").base == dockerfile.stage("build-gpu").base == cuda
    python = dockerfile.args["PYTHON_IMAGE"]
    assert dockerfile.stage("cpu").base == dockerfile.stage("build-cpu").base == python
    # the training stage fetches its data with apt (Debian packages): a Debian base, the cpu image's
    assert train_dockerfile.stage("models-trained").base == python and "bookworm" in python
    m = re.search(r"python:(\d+)\.(\d+)", python)
    required = re.search(r">=\s*(\d+)\.(\d+)", pyproject["project"]["requires-python"])
    assert (int(m[1]), int(m[2])) >= (int(required[1]), int(required[2]))


@pytest.mark.parametrize("path", [ROOT / "Dockerfile", TRAIN_DOCKERFILE], ids=lambda p: p.name)
def test_copied_paths_exist_and_are_in_the_build_context(path):
    dockerfile = parse_dockerfile(path)
    rules = dockerignore_rules()
    copies = 0
    for i, stage in enumerate(dockerfile.stages):
        for instr in stage.all("COPY") + stage.all("ADD"):
            assert instr.cmd == "COPY", f"Dockerfile:{instr.line}: use COPY"
            flags, sources, _ = copy_parts(instr)
            if "from" in flags:
                assert flags["from"] in dockerfile.names[:i], (
                    f"Dockerfile:{instr.line}: no earlier stage {flags['from']}"
                )
                continue
            for src in sources:
                copies += 1
                assert (ROOT / src).exists(), f"Dockerfile:{instr.line}: {src} does not exist"
                assert not ignored(src, rules), f"Dockerfile:{instr.line}: {src} is excluded by .dockerignore"
                if (ROOT / src).is_dir():  # a directory arrives with its (tracked) content, not empty
                    files = [p for p in (ROOT / src).rglob("*.py") if "__pycache__" not in p.parts]
                    assert not files or not all(ignored(str(p.relative_to(ROOT)), rules) for p in files)
    assert copies >= 6


def test_dockerignore_keeps_bulk_and_local_state_out():
    rules = dockerignore_rules()
    for path in [
        ".git/config",
        ".venv/bin/python",
        "data/translation/train.tsv",
        "checkpoints/vit-default/best.pt",
        "tests/conftest.py",
        "service/http/__pycache__/app.cpython-311.pyc",
        "attnserve.egg-info/PKG-INFO",
    ]:
        assert ignored(path, rules), f"{path} would be sent to the Docker daemon"
    for path in [
        "models/vit/1/model.onnx",
        "models/translator/3/tokenizer.model",
        "models/translator/3/weights.bin",
        "service/http/app.py",
        "deploy/gpu_check.py",
        "pyproject.toml",
    ]:
        assert not ignored(path, rules), f"{path} is needed by the build"


def test_dockerignore_matcher_follows_docker_semantics():
    from tests.deploy.parsing import _pattern_regex

    assert not ignored("a/b", [])
    rules = [(False, _pattern_regex("*")), (True, _pattern_regex("keep")), (False, _pattern_regex("**/*.pyc"))]
    assert ignored("other/file", rules) and not ignored("keep/x.py", rules) and ignored("keep/x.pyc", rules)
    assert ignored("keep/sub/x.pyc", rules) and not ignored("keep/sub/x.py", rules)


def pip_installs(stage):
    """The requirement arguments of every `pip install` run in ``stage``."""
    out = []
    for instr in stage.all("RUN"):
        lexer = shlex.shlex(instr.args, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        commands, words = [], []
        for token in [*lexer, ";"]:
            if token in {";", "&&", "||", "|"}:
                commands, words = [*commands, words], []
            else:
                words.append(token)
        for words in commands:
            if "pip" in " ".join(words[:3]) and "install" in words:
                out.append([w for w in words[words.index("install") + 1 :] if not w.startswith("-")])
                assert "-r" not in words and "--requirement" not in words, f"Dockerfile:{instr.line}: requirements file"
    return out


def test_runtime_installs_come_from_the_pyproject_extras(dockerfile, pyproject):
    extras = pyproject["project"]["optional-dependencies"]
    for target, build in RUNTIME_TARGETS.items():
        installs = pip_installs(dockerfile.stage(build))
        assert len(installs) == 1, f"{build}: expected one pip install, got {installs}"
        (spec,) = installs[0]
        m = re.fullmatch(r"(\.|/src)\[([\w,-]+)\]", spec)
        assert m, f"{build} installs {spec!r}, not the project with its extras"
        assert m[2].split(",") == [target], f"{build} installs extras {m[2]}"
        assert set(m[2].split(",")) <= set(extras)
        assert not any("torch" in dep for e in m[2].split(",") for dep in extras[e]), "torch in a runtime image"
        # the project can only be installed where pyproject.toml and its readme were copied first
        copied = {src for i in dockerfile.stage(build).all("COPY") for src in copy_parts(i)[1]}
        assert {"pyproject.toml", pyproject["project"]["readme"], "service"} <= copied
        assert dockerfile.stage(target).all("COPY")[0].args.startswith(f"--from={build} /opt/venv")


def test_training_stage_rebuilds_the_models_with_make(train_dockerfile, pyproject):
    stage = train_dockerfile.stage("models-trained")
    (run,) = [i.args for i in stage.all("RUN") if "make models" in i.args]
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z-]+):", makefile, re.MULTILINE))
    assert {"models", "install-dev", "data", "corpus"} <= targets
    for var in re.findall(r"\b([A-Z_]+)=", run.split("make models", 1)[1]):  # make variables it overrides
        assert re.search(rf"^{var}\s*[:?]?=", makefile, re.MULTILINE), f"the Makefile has no variable {var}"
    assert "MODELS=/models" in run  # exported where the runtime stages copy from
    # install-dev installs the `train` extra (torch) from pyproject, with the CPU wheel index the stage sets
    assert (
        re.search(r"-e '\.\[cpu,train,export,test\]'", makefile)
        and "train" in pyproject["project"]["optional-dependencies"]
    )
    assert "TORCH_INDEX_URL" in run
    copied = {src for i in stage.all("COPY") for src in copy_parts(i)[1]}
    assert {"model", "export", "service", "Makefile", "pyproject.toml"} <= copied
    # the image it makes holds /models only, at the path the runtime stages copy from (MODELS_IMAGE)
    last = train_dockerfile.stages[-1]
    assert last.base == "scratch" and [copy_parts(i) for i in last.instructions] == [
        ({"from": "models-trained"}, ["/models"], "/models")
    ]
    assert "--build-arg MODELS_IMAGE=" in TRAIN_DOCKERFILE.read_text()


@pytest.mark.parametrize("target", sorted(RUNTIME_TARGETS))
def test_runtime_stage_runs_the_service_as_a_user(dockerfile, target, monkeypatch):
    stage = dockerfile.stage(target)
    user = stage.all("USER")[-1].args.split(":")[0]
    assert user not in {"root", "0"}
    useradd = " ".join(i.args for i in stage.all("RUN") if "useradd" in i.args)
    assert re.search(rf"--uid {user}\b", useradd), f"USER {user} is not created in {target}"
    assert exec_form(stage.all("CMD")[-1].args) == ["python", "-m", "service"]
    workdir = stage.all("WORKDIR")[-1].args
    env = stage.env()
    assert workdir in env["PYTHONPATH"].split(":")
    copied = [copy_parts(i) for i in stage.all("COPY")]
    assert ({}, ["service"], "service") in copied and (ROOT / "service" / "__main__.py").is_file()
    # the models come from the `models` stage, to where the service looks for them
    assert ({"from": "models"}, ["/models"], env["ATTNSERVE_MODEL_REPOSITORY"]) in copied
    # every ATTNSERVE_* variable is a setting (extra=forbid would stop the service) with a valid value
    assert {k.removeprefix("ATTNSERVE_").lower() for k in attnserve_env(env)} <= settings_fields()
    settings = settings_from(attnserve_env(env), monkeypatch)
    assert settings.host == "0.0.0.0"
    assert [str(settings.port), str(settings.grpc_port)] == stage.all("EXPOSE")[-1].args.split()
    assert substitute("${PATH}", env).startswith("/opt/venv/bin:")


def healthcheck(stage) -> list[str]:
    (hc,) = stage.all("HEALTHCHECK")
    return exec_form(hc.args.split(" CMD ", 1)[1])


@pytest.mark.parametrize("target", sorted(RUNTIME_TARGETS))
def test_healthcheck_probes_readiness(dockerfile, target):
    command = healthcheck(dockerfile.stage(target))
    assert command[:2] == ["python", "-c"] and "/readyz" in command[2]
    assert "/readyz" in route_paths()
    hc = dockerfile.stage(target).all("HEALTHCHECK")[0].args
    assert re.search(r"--start-period=\d+s", hc), "warming up the models must not count as unhealthy"


class _Status(http.server.BaseHTTPRequestHandler):
    status = 503

    def do_GET(self):
        code = self.status if self.path == "/readyz" else 404
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("status, healthy", [(200, True), (503, False)])
def test_healthcheck_command_fails_until_ready(dockerfile, status, healthy):
    """Run the image's HEALTHCHECK command against a stand-in answering /readyz with ``status``."""
    handler = type("Handler", (_Status,), {"status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        command = healthcheck(dockerfile.stage("gpu"))
        env = {"ATTNSERVE_PORT": str(server.server_address[1])}
        proc = subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, timeout=30, check=False)
    finally:
        server.shutdown()
    assert (proc.returncode == 0) == healthy, proc.stderr


@pytest.mark.parametrize(
    "base, wheel, ok", [("13.0.1", "13.0", True), ("12.8.0", "13.0", False), ("13.1.1", "12.9", False)]
)
def test_gpu_build_refuses_an_onnxruntime_built_for_another_cuda(dockerfile, tmp_path, base, wheel, ok):
    """The build-gpu guard, run against a stand-in onnxruntime wheel and the base image's CUDA_VERSION."""
    (run,) = [i.args for i in dockerfile.stage("build-gpu").all("RUN") if "CUDA_VERSION" in i.args]
    words = shlex.split(run)
    code = words[words.index("-c") + 1]
    capi = tmp_path / "onnxruntime" / "capi"
    capi.mkdir(parents=True)
    (tmp_path / "onnxruntime" / "__init__.py").write_text("")
    (capi / "__init__.py").write_text("")
    (capi / "build_and_package_info.py").write_text(f"package_name = 'onnxruntime-gpu'\ncuda_version = '{wheel}'\n")
    env = {"PYTHONPATH": str(tmp_path), "CUDA_VERSION": base}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert (proc.returncode == 0) == ok, proc.stderr
    if not ok:
        assert f"built for CUDA {wheel}" in proc.stderr
