"""The deployment files parse, and say what the drivers need.

``docker-compose.yml``, ``deploy/Dockerfile``, the systemd units and every
JSON/YAML policy under ``deploy/`` are read and checked against the code they
deploy: console scripts come from ``pyproject.toml``, the conformance
service's shell is run with a stub ``lnk-store-check``, the GCS IAM condition
is evaluated on sample resources, and the units go through
``systemd-analyze verify`` where it is installed. Nothing here needs Docker.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest itself depends on tomli there
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"
ONE_COMMAND = "docker compose up --abort-on-container-exit --exit-code-from conformance"

S3_OBJECT_ACTIONS = {"s3:GetObject", "s3:PutObject", "s3:DeleteObject"}
S3_ACTIONS = S3_OBJECT_ACTIONS | {"s3:ListBucket"}
GCS_PERMISSIONS = {"storage.objects.get", "storage.objects.create", "storage.objects.delete", "storage.objects.list"}
HARDENING = {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes"}


# --------------------------------------------------------------------------
# helpers


def pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def console_scripts() -> dict[str, str]:
    return dict(pyproject()["project"]["scripts"])


def as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def image_default(image: str) -> str:
    """``${VAR:-default}`` -> default (Compose interpolation); a plain image as it is."""
    m = re.fullmatch(r"\$\{[A-Z_][A-Z0-9_]*:-([^}]+)\}", image)
    return m.group(1) if m else image


def compose_unescape(text: str) -> str:
    """A Compose string as the container sees it: ``$$`` is ``$``; a lone ``$`` is refused."""
    lone = re.sub(r"\$\$", "", text)
    assert "$" not in lone, f"a lone $ in {text!r}: Compose would interpolate it from the host; write $$"
    return text.replace("$$", "$")


def flag_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1:]
    return None


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A systemd unit: section -> key -> every value given (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}: {line!r} before any [Section]"
        key, eq, value = line.partition("=")
        assert eq, f"{path.name}: {line!r} is not KEY=VALUE"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def parse_env_file(path: Path) -> dict[str, str]:
    """An EnvironmentFile: KEY=VALUE lines and comments only."""
    env: dict[str, str] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", line), f"{path.name}:{n}: {line!r} is not KEY=VALUE"
        key, _, value = line.partition("=")
        env[key] = value
    return env


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        line = pending + stripped
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


# --------------------------------------------------------------------------
# docker-compose.yml


@pytest.fixture(scope="module")
def compose() -> dict:
    with open(COMPOSE) as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def services(compose: dict) -> dict:
    return compose["services"]


def test_compose_has_the_five_services(services):
    assert set(services) == {"minio", "minio-init", "fake-gcs", "fake-gcs-init", "conformance"}


def test_compose_says_its_one_command_at_the_top():
    head = COMPOSE.read_text().split("services:", 1)[0]
    assert ONE_COMMAND in head


def test_emulators_are_pinned_and_agree_with_the_container_tests(services):
    conftest = (ROOT / "tests" / "containers" / "conftest.py").read_text()
    for name, repo in (("minio", "minio/minio"), ("fake-gcs", "fsouza/fake-gcs-server")):
        image = image_default(services[name]["image"])
        name_part, _, tag = image.partition(":")
        assert name_part == repo and tag and tag != "latest", image
        assert f'"{image}"' in conftest, f"tests/containers/conftest.py does not pin {image}"
    assert image_default(services["fake-gcs-init"]["image"]) == image_default(services["fake-gcs"]["image"])


def test_every_compose_image_and_the_dockerfile_base_are_pinned(services):
    """A moving tag (``latest``, or none) changes what the suite runs against without a commit."""
    for name, service in services.items():
        if "image" not in service:
            continue
        image = image_default(service["image"])
        _, _, tag = image.partition(":")
        assert tag and not tag.startswith("latest"), f"{name}: {image} is not pinned to a version"
    bases = [args for op, args in dockerfile_instructions(DEPLOY / "Dockerfile") if op == "FROM"]
    assert bases and all(re.search(r"@sha256:[0-9a-f]{64}\b", b) for b in bases), bases


def _healthcheck(service: dict) -> list[str]:
    check = service.get("healthcheck") or {}
    test = check.get("test")
    assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, check
    assert int(check.get("retries", 0)) >= 3, check
    assert check.get("interval"), check
    return test[1:]


def test_minio_serves_data_and_has_a_healthcheck(services):
    minio = services["minio"]
    command = as_list(minio["command"])
    assert command[:2] == ["server", "/data"], command
    probe = " ".join(_healthcheck(minio))
    assert probe == "mc ready local" or "/minio/health/live" in probe, probe
    assert minio["environment"]["MINIO_ROOT_USER"] and len(minio["environment"]["MINIO_ROOT_PASSWORD"]) >= 8


def fake_gcs_port(services: dict) -> str:
    return flag_value([str(a) for a in services["fake-gcs"]["command"]], "-port") or "4443"


def minio_port(services: dict) -> str:
    address = flag_value(as_list(services["minio"]["command"]), "--address") or ":9000"
    return address.rsplit(":", 1)[1]


def test_fake_gcs_flags_and_healthcheck(services):
    argv = [str(a) for a in services["fake-gcs"]["command"]]
    assert flag_value(argv, "-scheme") == "http"
    assert flag_value(argv, "-backend") == "memory", "the filesystem backend keeps no generations"
    assert flag_value(argv, "-port") == "4443"
    assert flag_value(argv, "-public-host")
    probe = " ".join(_healthcheck(services["fake-gcs"]))
    assert re.search(rf"http://(127\.0\.0\.1|localhost):{fake_gcs_port(services)}/", probe), probe


def s3_bucket_made(services: dict) -> str:
    """The bucket minio-init makes, after checking it talks to the minio service as root."""
    init = services["minio-init"]
    assert image_default(init["image"]).startswith("minio/mc")
    assert init["depends_on"]["minio"]["condition"] == "service_healthy"
    env = services["minio"]["environment"]
    assert init["environment"]["MC_HOST_local"] == (
        f"http://{env['MINIO_ROOT_USER']}:{env['MINIO_ROOT_PASSWORD']}@minio:{minio_port(services)}")
    command = as_list(init["command"])
    assert command[0] == "mb" and "--ignore-existing" in command, command
    target = command[-1]
    assert target.startswith("local/"), command
    return target[len("local/"):]


def gcs_bucket_made(services: dict) -> str:
    """The bucket fake-gcs-init POSTs, unless it exists (checked first, with the same name)."""
    init = services["fake-gcs-init"]
    assert init["depends_on"]["fake-gcs"]["condition"] == "service_healthy"
    assert init["entrypoint"] == ["/bin/sh", "-c"]
    script = compose_unescape(as_list(init["command"])[0])
    base = f"http://fake-gcs:{fake_gcs_port(services)}/storage/v1/b"
    posted = re.search(r"--post-data '([^']*)'", script)
    assert posted, script
    bucket = json.loads(posted.group(1))["name"]
    assert f"'{base}?project=" in script, script
    assert script.index(f"{base}/{bucket}") < script.index("--post-data"), "must look before it POSTs"
    return bucket


def test_init_services_make_buckets_and_do_not_abort_the_run(services):
    assert re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", s3_bucket_made(services))
    assert re.fullmatch(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]", gcs_bucket_made(services))
    # --abort-on-container-exit would stop everything when an init service exits 0.
    assert services["minio-init"]["attach"] is False
    assert services["fake-gcs-init"]["attach"] is False


def test_conformance_is_built_from_the_deploy_dockerfile_and_waits_for_its_emulators(services):
    conf = services["conformance"]
    assert conf["build"]["context"] == "."
    assert (ROOT / conf["build"]["dockerfile"]).resolve() == (DEPLOY / "Dockerfile").resolve()
    assert conf["depends_on"] == {
        "minio": {"condition": "service_healthy"},
        "minio-init": {"condition": "service_completed_successfully"},
        "fake-gcs": {"condition": "service_healthy"},
        "fake-gcs-init": {"condition": "service_completed_successfully"},
    }
    assert conf.get("attach", True) is not False


STUB = """#!{python}
import json, os, sys
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
failing = sys.argv[1] == os.environ.get("STUB_FAIL")
print("12 passed, 1 failed" if failing else "13 passed, 0 failed")
sys.exit(1 if failing else 0)
"""


def run_conformance_command(services: dict, tmp_path: Path, fail: str = "") -> tuple[int, list[tuple[str, dict]]]:
    """Run the conformance service's command with a stub lnk-store-check; (exit, [(program, env)])."""
    argv = [compose_unescape(str(a)) for a in as_list(services["conformance"]["command"])]
    stub_dir = tmp_path / "bin"
    stub_dir.mkdir(exist_ok=True)
    stub = stub_dir / "lnk-store-check"
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / f"calls-{fail or 'none'}.log"
    env = {**os.environ, "PATH": f"{stub_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "STUB_LOG": str(log), "STUB_FAIL": fail}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    calls = []
    for line in log.read_text().splitlines() if log.exists() else []:
        args = json.loads(line)
        program, settings, i = None, {}, 0
        while i < len(args):
            if args[i] == "--env":
                key, eq, value = args[i + 1].partition("=")
                assert eq, args
                settings[key] = value
                i += 2
            else:
                assert program is None, f"two programs in {args}"
                program = args[i]
                i += 1
        calls.append((program, settings))
    return done.returncode, calls


def test_conformance_runs_both_drivers_against_the_emulators(services, tmp_path):
    code, calls = run_conformance_command(services, tmp_path)
    assert code == 0
    assert [program for program, _ in calls] == ["lnk-bucket-store", "lnk-gcs"]
    assert {"lnk-bucket-store", "lnk-gcs"} <= set(console_scripts())

    s3 = calls[0][1]
    assert re.fullmatch(rf"s3://{re.escape(s3_bucket_made(services))}(/[^/]+)*", s3["LNK_BUCKET_URL"])
    assert s3["AWS_ENDPOINT_URL_S3"] == f"http://minio:{minio_port(services)}"
    assert s3["AWS_ACCESS_KEY_ID"] == services["minio"]["environment"]["MINIO_ROOT_USER"]
    assert s3["AWS_SECRET_ACCESS_KEY"] == services["minio"]["environment"]["MINIO_ROOT_PASSWORD"]
    assert s3["AWS_DEFAULT_REGION"], "boto3 reads AWS_DEFAULT_REGION (not AWS_REGION)"

    gcs = calls[1][1]
    assert re.fullmatch(rf"gs://{re.escape(gcs_bucket_made(services))}(/[^/]+)*", gcs["LNK_GCS_URL"])
    assert gcs["STORAGE_EMULATOR_HOST"] == f"http://fake-gcs:{fake_gcs_port(services)}"

    usage = program_help("lnk-store-check")  # the real CLI takes PROGRAM and --env KEY=VALUE
    assert usage.returncode == 0 and re.search(r"--env\b", usage.stdout) and "PROGRAM" in usage.stdout, usage


@pytest.mark.parametrize("failing", ["lnk-bucket-store", "lnk-gcs"])
def test_conformance_fails_when_either_driver_fails_and_still_runs_both(services, tmp_path, failing):
    code, calls = run_conformance_command(services, tmp_path, fail=failing)
    assert code != 0
    assert [program for program, _ in calls] == ["lnk-bucket-store", "lnk-gcs"]


# --------------------------------------------------------------------------
# JSON and YAML under deploy/


def test_every_json_file_under_deploy_parses():
    files = sorted(DEPLOY.rglob("*.json"))
    assert len(files) >= 5, files
    for path in files:
        with open(path) as f:
            json.load(f)


def load(path: str) -> Any:
    with open(DEPLOY / path) as f:
        return yaml.safe_load(f) if path.endswith((".yaml", ".yml")) else json.load(f)


def check_s3_grants(statements: list[dict]) -> None:
    """Allow statements grant exactly what the driver needs, limited to PREFIX/."""
    allowed = [s for s in statements if s["Effect"] == "Allow"]
    actions: set[str] = set()
    for s in allowed:
        acts = set(as_list(s["Action"]))
        assert not any("*" in a for a in acts), acts
        assert "NotAction" not in s and "NotResource" not in s, s
        actions |= acts
        resources = as_list(s["Resource"])
        if acts <= S3_OBJECT_ACTIONS:
            assert resources == ["arn:aws:s3:::BUCKET/PREFIX/*"], s
        else:
            assert acts == {"s3:ListBucket"}, f"list and object actions mixed in one statement: {s}"
            assert resources == ["arn:aws:s3:::BUCKET"], s
            assert s["Condition"] == {"StringLike": {"s3:prefix": ["PREFIX/*"]}}, s
        if "Principal" in s:
            assert s["Principal"] != "*" and s["Principal"] != {"AWS": "*"}, s
    assert actions == S3_ACTIONS


def test_s3_iam_policy_grants_exactly_the_conditional_write_actions_under_the_prefix():
    policy = load("s3/iam-policy.json")
    assert policy["Version"] == "2012-10-17"
    assert all(s["Effect"] == "Allow" for s in policy["Statement"])
    check_s3_grants(policy["Statement"])


def test_s3_bucket_policy_grants_the_same_to_one_principal_and_denies_plain_http():
    policy = load("s3/bucket-policy.json")
    assert policy["Version"] == "2012-10-17"
    check_s3_grants(policy["Statement"])
    denies = [s for s in policy["Statement"] if s["Effect"] == "Deny"]
    assert any(s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport") == "false" for s in denies)


def test_s3_lifecycle_never_expires_current_objects():
    rules = load("s3/lifecycle.json")["Rules"]
    assert all(r["Status"] == "Enabled" and r["ID"] for r in rules)
    for r in rules:
        assert "Transitions" not in r and "Transition" not in r, "a transition would make objects slow or unreadable"
        expiration = r.get("Expiration")
        if expiration is not None:
            assert set(expiration) == {"ExpiredObjectDeleteMarker"}, f"expires current objects: {r}"
    assert any(r.get("AbortIncompleteMultipartUpload", {}).get("DaysAfterInitiation", 0) >= 1 for r in rules)
    assert any(r.get("NoncurrentVersionExpiration", {}).get("NoncurrentDays", 0) >= 1 for r in rules)


def test_gcs_lifecycle_deletes_only_noncurrent_versions():
    rules = load("gcs/lifecycle.json")["lifecycle"]["rule"]
    kinds = [r["action"]["type"] for r in rules]
    assert set(kinds) <= {"Delete", "AbortIncompleteMultipartUpload"}, kinds
    deletes = [r for r in rules if r["action"]["type"] == "Delete"]
    assert deletes
    for r in deletes:
        assert r["condition"].get("isLive") is False, f"would delete live objects: {r}"
        assert r["condition"].get("daysSinceNoncurrentTime", 0) >= 1 or r["condition"].get("numNewerVersions")
    assert any(
        r["condition"].get("age", 0) >= 1 for r in rules if r["action"]["type"] == "AbortIncompleteMultipartUpload"
    )


def test_gcs_role_has_exactly_the_object_permissions():
    role = load("gcs/iam-role.yaml")
    assert role["title"] and role["stage"] == "GA"
    assert set(role["includedPermissions"]) == GCS_PERMISSIONS
    assert len(role["includedPermissions"]) == len(GCS_PERMISSIONS)
    assert "storage.objects.delete" in (DEPLOY / "gcs/iam-role.yaml").read_text().split("includedPermissions")[0]


def eval_cel(expression: str, resource_type: str, name: str, list_prefix: str = "") -> bool:
    """Evaluate the condition's small CEL subset (==, &&, ||, startsWith, parentheses,
    api.getAttribute of the list prefix) in Python."""
    assert re.fullmatch(r'[\sA-Za-z_.()"/=|&:,-]+', expression), expression
    py = expression.replace("&&", " and ").replace("||", " or ").replace(".startsWith(", ".startswith(")

    class Resource:
        pass

    class Api:
        @staticmethod
        def getAttribute(attribute: str, default: str) -> str:  # noqa: N802 - CEL's name
            assert attribute == "storage.googleapis.com/objectListPrefix", attribute
            return list_prefix if resource_type.endswith("/Bucket") else default

    res = Resource()
    res.type, res.name = resource_type, name  # type: ignore[attr-defined]
    return bool(eval(py, {"__builtins__": {}}, {"resource": res, "api": Api}))  # noqa: S307 - our own file, checked above


def test_gcs_condition_limits_objects_and_listing_to_the_prefix():
    cond = load("gcs/iam-binding-condition.json")
    assert cond["title"] and cond["expression"]
    assert len(cond["title"]) <= 100
    expr = cond["expression"]
    obj, bucket = "storage.googleapis.com/Object", "storage.googleapis.com/Bucket"
    assert eval_cel(expr, obj, "projects/_/buckets/BUCKET/objects/PREFIX/a/o/i/mark")
    assert eval_cel(expr, obj, "projects/_/buckets/BUCKET/objects/PREFIX/_due/1")
    assert not eval_cel(expr, obj, "projects/_/buckets/BUCKET/objects/PREFIXX/a")
    assert not eval_cel(expr, obj, "projects/_/buckets/BUCKET/objects/other/a")
    assert not eval_cel(expr, obj, "projects/_/buckets/OTHER/objects/PREFIX/a")
    # list is checked on the bucket, with the listing's prefix as an attribute
    assert eval_cel(expr, bucket, "projects/_/buckets/BUCKET", list_prefix="PREFIX/")
    assert eval_cel(expr, bucket, "projects/_/buckets/BUCKET", list_prefix="PREFIX/_due/")
    assert not eval_cel(expr, bucket, "projects/_/buckets/BUCKET", list_prefix=""), "the whole bucket is not listed"
    assert not eval_cel(expr, bucket, "projects/_/buckets/BUCKET", list_prefix="PREFIXX/")
    assert not eval_cel(expr, bucket, "projects/_/buckets/BUCKET", list_prefix="other/")
    assert not eval_cel(expr, bucket, "projects/_/buckets/OTHER", list_prefix="PREFIX/")


# --------------------------------------------------------------------------
# Dockerfile


def test_dockerfile_installs_with_pip_install_dot_as_a_non_root_user():
    steps = dockerfile_instructions(DEPLOY / "Dockerfile")
    assert steps[0][0] == "FROM" and steps[0][1].startswith("python:3.11-slim@sha256:")
    runs = [args for op, args in steps if op == "RUN"]
    installs = [r for r in runs if re.search(r"\bpip install\b", r)]
    assert len(installs) == 1, installs
    assert re.search(r"\bpip install \.(\s|$)", installs[0]), installs[0]
    assert not re.search(r"pip install (-e|--editable)\b", installs[0]) and ".[" not in installs[0]

    copied = " ".join(args for op, args in steps if op == "COPY")
    meta = pyproject()["project"]
    for needed in ("pyproject.toml", meta["readme"], "cloudstore"):
        assert re.search(rf"(^|\s){re.escape(needed)}(\s|$)", copied), f"{needed} is not copied: {copied}"
    assert steps.index(("RUN", installs[0])) > max(i for i, (op, _) in enumerate(steps) if op == "COPY")

    users = [args for op, args in steps if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert max(i for i, (op, _) in enumerate(steps) if op == "USER") > steps.index(("RUN", installs[0]))
    assert not [op for op, _ in steps if op == "ENTRYPOINT"]
    cmd = [args for op, args in steps if op == "CMD"]
    assert len(cmd) == 1 and json.loads(cmd[0]) == ["lnk-store-bridge", "--help"]
    assert "lnk-store-bridge" in console_scripts()


# --------------------------------------------------------------------------
# systemd

UNITS = {"lnk-store-bridge.service": "lnk-store-bridge", "lnk-cloud-scheduler.service": "lnk-cloud-scheduler"}
ENV_EXAMPLE = DEPLOY / "systemd" / "cloudstore.env.example"


def exec_start(unit: dict) -> list[str]:
    values = unit["Service"]["ExecStart"]
    assert len(values) == 1, values
    return shlex.split(values[0])


@pytest.mark.parametrize("unit_name, script", sorted(UNITS.items()))
def test_unit_runs_its_console_script_hardened(unit_name, script):
    unit = parse_unit(DEPLOY / "systemd" / unit_name)
    argv = exec_start(unit)
    assert argv[0].startswith("/"), "systemd wants an absolute path"
    assert os.path.basename(argv[0]) == script and script in console_scripts()

    service = unit["Service"]
    assert service["Restart"] == ["on-failure"]
    for key, value in HARDENING.items():
        assert service.get(key) == [value], (key, service.get(key))
    writable = " ".join(service.get("ReadWritePaths", [])).split()
    assert writable and all(p.lstrip("-").startswith("/") for p in writable)
    assert service.get("User") and service["User"] != ["root"]
    assert service["EnvironmentFile"] == ["/etc/cloudstore/cloudstore.env"]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]

    defined = parse_env_file(ENV_EXAMPLE)
    for var in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", service["ExecStart"][0]):
        assert var in defined, f"{unit_name} uses ${var}, which cloudstore.env.example does not set"


def writable_paths(unit: dict) -> list[str]:
    return " ".join(unit["Service"].get("ReadWritePaths", [])).split()


def test_bridge_unit_can_write_its_harness_folder():
    unit = parse_unit(DEPLOY / "systemd" / "lnk-store-bridge.service")
    harness = flag_value(exec_start(unit), "--harness")
    assert harness and harness in [p.lstrip("-") for p in writable_paths(unit)]
    assert flag_value(exec_start(unit), "--driver")


def readme_steps() -> list[str]:
    """The shell lines of deploy/README.md's systemd steps (its first indented block there)."""
    text = (DEPLOY / "README.md").read_text()
    section = text[text.index("## systemd\n"):]
    lines = section.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("    "))
    block = []
    for line in lines[first:]:
        if not line.startswith("    "):
            break
        block.append(line.strip())
    return block


@pytest.mark.parametrize("unit_name", sorted(UNITS))
def test_a_folder_in_read_write_paths_exists_or_may_be_missing(unit_name):
    """Issue 29, item 1: systemd fails a unit whose ReadWritePaths= folder is missing (226/NAMESPACE).

    Every entry is either made by the README's steps (``useradd --create-home``
    for the home folder, ``install -d``) or carries the ``-`` prefix."""
    steps = readme_steps()
    made = set()
    for line in steps:
        argv = shlex.split(line.split("#", 1)[0]) if line else []
        if argv[:1] == ["useradd"] and ({"-m", "--create-home"} & set(argv)):
            made.add(flag_value(argv, "--home-dir") or flag_value(argv, "-d"))
        if argv[:2] == ["install", "-d"]:
            made.update(a for a in argv[2:] if a.startswith("/"))
    for path in writable_paths(parse_unit(DEPLOY / "systemd" / unit_name)):
        assert path.startswith("-") or path in made, f"{unit_name}: ReadWritePaths={path} may not exist"
    harness = flag_value(exec_start(parse_unit(DEPLOY / "systemd" / "lnk-store-bridge.service")), "--harness")
    assert harness in made, "the steps do not make the bridge's --harness folder"


EXAMPLES = {"bridge-agents.json": "LNK_BRIDGE_CONFIG", "scheduler.json": "LNK_SCHEDULER_CONFIG"}


def test_the_steps_install_every_file_the_units_read():
    """Issue 29, item 2: both config files ship, and the steps put them where cloudstore.env says."""
    env = parse_env_file(ENV_EXAMPLE)
    steps = " ".join(readme_steps())
    for name, setting in EXAMPLES.items():
        assert (DEPLOY / "systemd" / name).is_file()
        assert f"deploy/systemd/{name} {env[setting]}" in steps, f"the steps do not install {name} at {env[setting]}"
    assert "deploy/systemd/cloudstore.env.example /etc/cloudstore/cloudstore.env" in steps
    for unit_name in UNITS:
        assert unit_name in steps or "deploy/systemd/*.service" in steps


def test_example_bridge_config_passes_the_bridges_schema():
    from cloudstore.bridge.cli import config_agents

    agents = config_agents(str(DEPLOY / "systemd" / "bridge-agents.json"))
    assert agents
    harness = flag_value(exec_start(parse_unit(DEPLOY / "systemd" / "lnk-store-bridge.service")), "--harness")
    steps = readme_steps()
    for agent in agents:  # its key and folder are under the harness folder, made by the steps
        for path in (agent["key_file"], agent["folder"]):
            assert path.startswith(harness + "/"), path
        assert any(agent["key_file"] in line for line in steps), f"the steps make no {agent['key_file']}"
        assert any(line.startswith("install -d") and agent["folder"] in line for line in steps)


def test_example_scheduler_config_passes_the_schedulers_checks(tmp_path):
    """Through the runner's own loader (schema and start-up checks); only the fire program is stubbed."""
    from cloudstore.scheduling.config import load

    raw = json.loads((DEPLOY / "systemd" / "scheduler.json").read_text())
    stub = tmp_path / "fire-job"
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    assert isinstance(raw["fire"], list)
    raw["fire"] = [str(stub)] + raw["fire"][1:]
    copy = tmp_path / "scheduler.json"
    copy.write_text(json.dumps(raw))
    driver = parse_env_file(ENV_EXAMPLE)["LNK_STORE_DRIVER"]
    settings = load(["--config", str(copy), "--driver", driver])
    assert settings.agents and settings.fire_timeout == raw["fire_timeout"]


def test_both_units_share_one_wake_folder_named_in_the_env_file():
    """Issue 29, item 3: PrivateTmp= gives each unit its own /tmp, so the default /tmp/lnk-wake never
    joined the bridge's drivers to the runners. One RuntimeDirectory under /run, in both units and in
    LNK_WAKE_DIR, kept while either unit runs."""
    env = parse_env_file(ENV_EXAMPLE)
    folders = set()
    for unit_name in UNITS:
        service = parse_unit(DEPLOY / "systemd" / unit_name)["Service"]
        assert len(service.get("RuntimeDirectory", [])) == 1, unit_name
        folders.add(service["RuntimeDirectory"][0])
        assert service.get("RuntimeDirectoryPreserve") == ["yes"], f"{unit_name}: a stop would remove it"
        mode = int(service.get("RuntimeDirectoryMode", ["0755"])[0], 8)
        assert not mode & 0o022, "a runner refuses a wake folder others may write in unless sticky"
        assert service["User"] == parse_unit(DEPLOY / "systemd" / "lnk-store-bridge.service")["Service"]["User"]
    assert len(folders) == 1
    assert env.get("LNK_WAKE_DIR") == "/run/" + folders.pop()


def test_stop_reaches_the_main_process_only_and_waits_out_a_fire():
    """Issue 29, item 4: KillMode=mixed (a fire under way is finished, not SIGTERMed with its runner),
    and the scheduler's TimeoutStopSec covers the example's fire_timeout, the grace to SIGKILL and a finish."""
    from cloudstore.scheduling.fire import GRACE

    for unit_name in UNITS:
        assert parse_unit(DEPLOY / "systemd" / unit_name)["Service"].get("KillMode") == ["mixed"], unit_name
    service = parse_unit(DEPLOY / "systemd" / "lnk-cloud-scheduler.service")["Service"]
    timeout = service["TimeoutStopSec"][0]
    assert timeout.endswith("s") and timeout[:-1].isdigit(), timeout
    fire_timeout = json.loads((DEPLOY / "systemd" / "scheduler.json").read_text())["fire_timeout"]
    assert int(timeout[:-1]) >= fire_timeout + GRACE + 10
    assert f"fire_timeout ({fire_timeout} s" in (DEPLOY / "systemd" / "lnk-cloud-scheduler.service").read_text()


def test_deploy_readme_cost_is_the_schedulers():
    """Issue 29, item 5: the scheduler lists the due index once a poll_interval for all agents;
    deploy/README once said it read each agent's job_mark every 0.25 s."""
    text = (DEPLOY / "README.md").read_text()
    assert "job_mark" not in text and "mark_interval" not in text and "350,000" not in text
    readme = (ROOT / "README.md").read_text()
    assert "$0.30 to $0.36 a day per runner" in readme and "$0.30 to $0.36 a day per runner" in text
    assert "every `poll_interval` (2 s)" in text


def program_help(script: str) -> subprocess.CompletedProcess:
    """``SCRIPT --help`` through the entry point pyproject declares (installed or not)."""
    module, _, func = console_scripts()[script].partition(":")
    code = f"import sys; sys.argv = [{script!r}, '--help']; from {module} import {func} as m; sys.exit(m())"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)


@pytest.mark.parametrize("unit_name, script", sorted(UNITS.items()))
def test_unit_flags_are_ones_the_program_takes(unit_name, script):
    done = program_help(script)
    assert done.returncode == 0, done.stderr
    flags = [
        a.split("=", 1)[0] for a in exec_start(parse_unit(DEPLOY / "systemd" / unit_name))[1:] if a.startswith("--")
    ]
    for flag in flags:
        assert re.search(rf"(^|[\s,\[]){re.escape(flag)}\b", done.stdout), f"{script} --help does not list {flag}"


def test_env_example_names_a_driver_and_both_settings():
    text = ENV_EXAMPLE.read_text()
    env = parse_env_file(ENV_EXAMPLE)
    assert env["LNK_STORE_DRIVER"] in {"lnk-gcs", "lnk-bucket-store"} & set(console_scripts())
    assert "LNK_GCS_URL=gs://" in text and "LNK_BUCKET_URL=s3://" in text
    assert "export " not in text


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_units_pass_systemd_analyze_verify(tmp_path):
    """Every key and value as systemd reads them; only the install path is swapped for stubs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    units = []
    for unit_name, script in UNITS.items():
        stub = bin_dir / script
        stub.write_text("#!/bin/sh\n")
        stub.chmod(0o755)
        text = (DEPLOY / "systemd" / unit_name).read_text()
        assert "/opt/cloudstore/bin/" in text
        (tmp_path / unit_name).write_text(text.replace("/opt/cloudstore/bin/", f"{bin_dir}/"))
        units.append(str(tmp_path / unit_name))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", *units], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr


# --------------------------------------------------------------------------
# deploy/README.md


def test_deploy_readme_covers_every_file_and_provider():
    text = (DEPLOY / "README.md").read_text()
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.name != "README.md"):
        assert str(path.relative_to(DEPLOY)) in text, f"deploy/README.md does not mention {path.relative_to(DEPLOY)}"
    for needed in (
        "docker-compose.yml",
        ONE_COMMAND,
        "AWS_ENDPOINT_URL_S3",
        ".r2.cloudflarestorage.com",
        "AWS_DEFAULT_REGION=auto",
        "MinIO",
        "ifGenerationMatch",
        "If-None-Match",
        "If-Match",
        "once a second",
    ):
        assert needed in text, needed


# --------------------------------------------------------------------------
# Kubernetes (issue 29, item 6): deploy/k8s/, validated offline against the schema
# kubernetes-validate ships for a pinned Kubernetes version.

K8S = DEPLOY / "k8s"
K8S_VERSION = "1.31.0"  # a version whose schema the pinned kubernetes-validate ships (no network needed)


def k8s_documents() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        with open(path) as f:
            docs += [(path.name, d) for d in yaml.safe_load_all(f) if d is not None]
    return docs


def k8s_object(kind: str) -> dict:
    found = [d for _, d in k8s_documents() if d["kind"] == kind]
    assert len(found) == 1, (kind, len(found))
    return found[0]


def pod_spec() -> dict:
    return k8s_object("Deployment")["spec"]["template"]["spec"]


def container(name: str) -> dict:
    found = [c for c in pod_spec()["containers"] if c["name"] == name]
    assert len(found) == 1, name
    return found[0]


def k8s_config() -> dict[str, str]:
    return k8s_object("ConfigMap")["data"]


def container_argv(c: dict) -> list[str]:
    """The program and flags a container runs: ``sh -ec SCRIPT``'s final ``exec`` line, or its command;
    ``$VAR``/``"$VAR"`` (shell) and ``$(VAR)`` (Kubernetes) replaced from the ConfigMap."""
    argv = list(c.get("command", [])) + list(c.get("args", []))
    if argv[:2] == ["/bin/sh", "-ec"]:
        assert len(argv) == 3, argv
        last = [line for line in argv[2].strip().splitlines() if line.strip()][-1]
        assert last.startswith("exec "), f"the script must exec the program (signals reach it): {last!r}"
        argv = shlex.split(last)[1:]
    env = k8s_config()

    def sub(arg: str) -> str:
        return re.sub(r"\$\(([A-Z_][A-Z0-9_]*)\)|\$([A-Z_][A-Z0-9_]*)", lambda m: env[m.group(1) or m.group(2)], arg)

    return [sub(a) for a in argv]


def test_k8s_manifests_pass_the_kubernetes_schema_strictly():
    """Every object under deploy/k8s against the pinned version's OpenAPI schema, unknown keys refused."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = k8s_documents()
    assert {d["kind"] for _, d in docs} >= {"ConfigMap", "Deployment"}, docs
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{name}: {doc['kind']}: {exc.message}") from None
    broken = json.loads(json.dumps(k8s_object("Deployment")))
    broken["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):  # the validator does refuse a typo
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_k8s_validator_is_in_the_test_extra():
    assert any(re.match(r"kubernetes-validate\b", r) for r in pyproject()["project"]["optional-dependencies"]["test"])


def test_k8s_containers_run_the_projects_programs_with_flags_they_take():
    from cloudstore.bridge.cli import _parser as bridge_parser
    from cloudstore.scheduling.config import parser as scheduler_parser

    programs = {"bridge": ("lnk-store-bridge", bridge_parser), "scheduler": ("lnk-cloud-scheduler", scheduler_parser)}
    for name, (script, parser) in programs.items():
        argv = container_argv(container(name))
        assert argv[0] == script and script in console_scripts(), argv
        parser().parse_args(argv[1:])  # exits (SystemExit) on a flag the program does not take
        assert container(name)["image"].split(":")[0] == "cloudstore"


def test_k8s_pod_is_non_root_read_only_with_resources_and_the_images_user():
    steps = dockerfile_instructions(DEPLOY / "Dockerfile")
    uid, _, gid = [args for op, args in steps if op == "USER"][-1].partition(":")
    pod = pod_spec()["securityContext"]
    assert pod["runAsNonRoot"] is True and str(pod["runAsUser"]) == uid and str(pod["runAsGroup"]) == gid
    assert pod["seccompProfile"]["type"] == "RuntimeDefault"
    for c in pod_spec()["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
        assert c["resources"]["limits"]["memory"]
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert "/tmp" in mounts, f"{c['name']}: a read-only root leaves no /tmp (the metrics exporter's folder)"


def test_k8s_probes_ask_the_metrics_port_each_program_listens_on():
    for name in ("bridge", "scheduler"):
        c = container(name)
        argv = container_argv(c)
        listen = flag_value(argv, "--metrics-port")
        if listen is None:  # the scheduler's is in its config file
            assert flag_value(argv, "--config") == "/etc/cloudstore/scheduler.json"
            listen = json.loads(k8s_config()["scheduler.json"])["metrics_port"]
        host, _, port = str(listen).rpartition(":")
        assert host == "0.0.0.0", f"{name}: the kubelet probes the pod's address, not 127.0.0.1"
        # Issue 46, item 1: every probe asked GET /metrics, which answered 200 while every call failed.
        # Alive (startup, liveness) is the loop; ready is the store answering (runtime.health).
        paths = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
        for kind, path in paths.items():
            assert kind in c, (name, kind)
            assert c[kind]["httpGet"] == {"path": path, "port": int(port)}, (name, kind, c[kind])
        assert int(port) in [p["containerPort"] for p in c["ports"]]
    from cloudstore.runtime.health import LIVE_PATH, READY_PATH
    from cloudstore.runtime.metrics.http import ACCEPT_RATE, LISTEN_BACKLOG

    assert (LIVE_PATH, READY_PATH) == ("/healthz", "/readyz"), "the paths the programs answer"
    # The default 1 s is shorter than a probe may wait behind a flood of idle connections: a full
    # listen backlog, accepted at the exporter's accept rate.
    assert k8s_probe_timeout() >= LISTEN_BACKLOG / ACCEPT_RATE + 1


def k8s_probe_timeout() -> float:
    """The probes' timeoutSeconds, the same for every probe of deployment.yaml (the health tests use it)."""
    found = {c[kind]["timeoutSeconds"] for c in pod_spec()["containers"]
             for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert len(found) == 1, found
    return float(found.pop())


def test_units_are_notify_with_a_watchdog_and_do_not_restart_a_config_error():
    """Issue 46, item 1: Type=simple was "started" at fork, and a config error (exit 2) restarted five times."""
    for unit_name in UNITS:
        service = parse_unit(DEPLOY / "systemd" / unit_name)["Service"]
        assert service["Type"] == ["notify"], unit_name
        assert service["NotifyAccess"] == ["main"], unit_name  # the drivers and fire commands do not speak for it
        assert service["WatchdogSec"] and service["WatchdogSec"][0] not in ("0", "infinity"), unit_name
        assert "2" in service["RestartPreventExitStatus"][0].split(), unit_name
        assert service["Restart"] == ["on-failure"], unit_name
    from cloudstore.runtime.sd_notify import NOTIFY_SOCKET  # what the programs read: systemd's own name

    assert NOTIFY_SOCKET == "NOTIFY_SOCKET"


def test_k8s_socket_and_wake_folder_are_on_shared_empty_dirs():
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}

    def mount_of(c: dict, path: str) -> str:
        found = [m for m in c["volumeMounts"] if path == m["mountPath"] or path.startswith(m["mountPath"] + "/")]
        assert found, (c["name"], path)
        best = max(found, key=lambda m: len(m["mountPath"]))
        assert "emptyDir" in volumes[best["name"]], (c["name"], path, best)
        return best["name"]

    bridge, scheduler = container("bridge"), container("scheduler")
    harness = flag_value(container_argv(bridge), "--harness")
    assert harness and mount_of(bridge, harness) == mount_of(scheduler, harness)
    wake = k8s_config()["LNK_WAKE_DIR"]
    assert mount_of(bridge, wake) == mount_of(scheduler, wake)
    assert wake not in {m["mountPath"] for c in (bridge, scheduler) for m in c["volumeMounts"]}, (
        "an emptyDir's own folder is world-writable and not sticky: the runners refuse it; "
        "the wake folder is one they make inside it")
    for c in (bridge, scheduler):
        assert {"configMapRef": {"name": k8s_object("ConfigMap")["metadata"]["name"]}} in c["envFrom"]


def test_k8s_secrets_are_files_never_environment_variables():
    secrets = {v["name"] for v in pod_spec()["volumes"] if "secret" in v}
    assert secrets, "no Secret volume"
    for c in pod_spec()["containers"]:
        for var in c.get("env", []):
            assert "secretKeyRef" not in var.get("valueFrom", {}), (c["name"], var)
        assert not [e for e in c.get("envFrom", []) if "secretRef" in e], c["name"]
    config = k8s_config()
    assert not any(k.startswith(("AWS_ACCESS", "AWS_SECRET")) for k in config), "credentials in the ConfigMap"
    aws_mount = [m["mountPath"] for m in container("scheduler")["volumeMounts"] if m["name"] in secrets]
    assert any(config["AWS_SHARED_CREDENTIALS_FILE"].startswith(p + "/") for p in aws_mount)


def test_k8s_bridge_keys_are_copied_where_the_bridge_accepts_them(tmp_path):
    """A Secret volume's file is root's (unreadable by uid 10001) or, with fsGroup, mode 0440: the bridge
    refuses both. The bridge's script copies each key with mode 0600 into a folder of its own under a
    sticky root-owned tmpfs (/dev/shm); the config's key files are there."""
    agents = json.loads(k8s_config()["bridge-agents.json"])["agents"]
    script = container("bridge")["args"][0]
    assert "install -d -m 0700 /dev/shm/lnk-keys" in script
    assert 'install -m 0600 "$key" /dev/shm/lnk-keys/' in script
    keys_mount = [m["mountPath"] for m in container("bridge")["volumeMounts"] if m["name"] == "keys"]
    assert keys_mount and f"for key in {keys_mount[0]}/*.key" in script
    harness = flag_value(container_argv(container("bridge")), "--harness")
    for agent in agents:
        assert os.path.dirname(agent["key_file"]) == "/dev/shm/lnk-keys", agent
        assert agent["folder"].startswith(f"{harness}/"), agent
    # What the copy makes, the bridge's own check accepts (here, in a private folder of the same shape).
    from cloudstore.bridge.proof import read_key_file

    source = tmp_path / "secret" / "AGENT.key"
    source.parent.mkdir()
    key_hex = __import__("secrets").token_hex(32)
    source.write_text(key_hex + "\n")
    source.chmod(0o440)  # as fsGroup leaves a Secret's file
    copy_script = script.replace("/dev/shm/lnk-keys", str(tmp_path / "lnk-keys"))
    copy_script = copy_script.replace(keys_mount[0], str(source.parent)).replace("/srv/lnk-harness", str(tmp_path))
    copy_lines = "\n".join(line for line in copy_script.splitlines() if not line.strip().startswith("exec "))
    (tmp_path).chmod(0o755)
    subprocess.run(["/bin/sh", "-ec", copy_lines], check=True, timeout=30)
    copied = tmp_path / "lnk-keys" / "AGENT.key"
    assert stat.S_IMODE(copied.stat().st_mode) == 0o600
    with pytest.raises(Exception, match="group or others"):
        read_key_file(source)
    folder_ok = all(not os.stat(p).st_mode & 0o022 or os.stat(p).st_mode & stat.S_ISVTX
                    for p in [str(tmp_path), *[str(q) for q in tmp_path.parents]])
    if folder_ok:
        assert read_key_file(copied) == bytes.fromhex(key_hex)


def test_k8s_example_configs_pass_the_programs_own_checks(tmp_path):
    from cloudstore.bridge.cli import CONFIG
    from cloudstore.scheduling.config import load as load_scheduler

    CONFIG.check(json.loads(k8s_config()["bridge-agents.json"]), "bridge-agents.json")
    raw = json.loads(k8s_config()["scheduler.json"])
    stub = tmp_path / "fire-job"
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    raw["fire"] = [str(stub)] + raw["fire"][1:]
    copy = tmp_path / "scheduler.json"
    copy.write_text(json.dumps(raw))
    argv = container_argv(container("scheduler"))
    settings = load_scheduler([*(a if a != "/etc/cloudstore/scheduler.json" else str(copy) for a in argv[1:])])
    assert settings.agents and settings.driver == k8s_config()["LNK_STORE_DRIVER"]
    grace = pod_spec()["terminationGracePeriodSeconds"]
    from cloudstore.scheduling.fire import GRACE

    assert grace >= raw["fire_timeout"] + GRACE + 10, "SIGKILL would come before a fire under way could finish"


def test_dockerfile_copies_what_exists_and_runs_a_program_the_project_installs():
    steps = dockerfile_instructions(DEPLOY / "Dockerfile")
    for op, args in steps:
        if op == "COPY":
            *sources, _dest = args.split()
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
    cmd = json.loads([args for op, args in steps if op == "CMD"][-1])
    assert cmd[0] in console_scripts()
    ignore = [line.strip() for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    for source in ("pyproject.toml", "README.md", "cloudstore"):
        assert source not in ignore and f"/{source}" not in ignore
