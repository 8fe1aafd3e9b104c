"""The first run on a fresh Linux host, for real: Docker creates a missing bind-mount folder as root; compose's
`init` (root with only the chown capabilities) hands it to the image's user; without init, prepare says which
path and which chown in one line instead of a traceback. Needs a Docker engine; no GPU, no model download.
(The same code paths run engine-less in tests/unit/test_entrypoint.py.)"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.container

INIT_CAPS = ["CHOWN", "FOWNER", "DAC_OVERRIDE"]


@pytest.fixture
def fresh_host_folder():
    """A parent folder; the models folder inside it does not exist yet, as on a newcomer's machine."""
    parent = Path(tempfile.mkdtemp(prefix="hq-first-run-"))
    yield parent / "models"
    # Files inside now belong to uid 1000 (or root): remove them from a container if we cannot.
    shutil.rmtree(parent, ignore_errors=True)


def run(image: str, command: list[str], models: Path, **kwargs) -> tuple[int, str]:
    import docker

    client = docker.from_env()
    container = client.containers.run(image, command, detach=True,
                                      volumes={str(models): {"bind": "/models", "mode": "rw"}},
                                      environment={"HYPERQWEN_MODELS_HOST": "./models", "HF_HUB_OFFLINE": "1"},
                                      security_opt=["no-new-privileges:true"], **kwargs)
    try:
        status = container.wait(timeout=300)
        return int(status["StatusCode"]), container.logs().decode("utf-8", "replace")
    finally:
        container.remove(force=True)


def test_init_creates_and_owns_the_folder_docker_created_as_root(image: str, fresh_host_folder: Path) -> None:
    code, output = run(image, ["init"], fresh_host_folder, user="0:0", cap_drop=["ALL"], cap_add=INIT_CAPS)
    assert code == 0, output
    st = fresh_host_folder.stat()
    assert (st.st_uid, st.st_gid) == (1000, 1000)
    key = fresh_host_folder / "api_key.txt"
    assert key.stat().st_uid == 1000 and (key.stat().st_mode & 0o777) == 0o600
    assert "Traceback" not in output and "created an API key in ./models/api_key.txt" in output


def test_prepare_without_init_is_one_line_with_the_chown(image: str, fresh_host_folder: Path) -> None:
    if os.geteuid() == 0:
        fresh_host_folder.mkdir()  # as the Docker daemon would: root-owned
    else:
        pytest.skip("needs the folder to be root-owned; run as root, or let Docker create it")
    code, output = run(image, ["prepare"], fresh_host_folder, user="1000:1000", cap_drop=["ALL"])
    assert code == 1 and "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.startswith("hyperqwen:")]
    assert lines == [lines[0]] and "sudo chown -R 1000:1000 ./models" in lines[0], output
