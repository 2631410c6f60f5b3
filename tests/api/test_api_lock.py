"""requirements.lock (the Docker image's packages) is complete and pinned: every line one
version with a SHA-256, every dependency of pyproject.toml (and the build tools the
Dockerfile uses) in it at a version its specifier allows, and the Dockerfile installs it
with --require-hashes before the project with --no-deps."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]


def _lock() -> dict[str, str]:
    text = (REPO / "requirements.lock").read_text()
    entries = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\\n    --hash=sha256:([0-9a-f]{64})$",
                         text, flags=re.M)
    names = [line for line in text.splitlines() if line and not line.startswith(("#", " "))]
    assert len(entries) == len(names), "every package pinned with == and one sha256"
    return {canonicalize_name(n): v for n, v, _ in entries}


def test_lock_satisfies_pyproject() -> None:
    pinned = _lock()
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    build = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    for spec in [*deps, *build]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req.name} is not in requirements.lock"
        assert req.specifier.contains(pinned[name], prereleases=True), (spec, pinned[name])
        for extra in req.extras:  # psycopg[binary] -> psycopg-binary
            assert canonicalize_name(f"{req.name}-{extra}") in pinned, spec


def test_dockerfile_installs_the_lock() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert "pip install --require-hashes --no-deps -r requirements.lock" in text
    assert "pip install --no-deps --no-build-isolation ." in text
    assert not re.search(r"pip install (?!--require-hashes|--no-deps)", text)
