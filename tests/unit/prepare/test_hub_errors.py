"""Hub failures through huggingface_hub's real client code (no mocks of the library).

- No network: HF_ENDPOINT points at a closed 127.0.0.1 port, so the real connection fails.
- Missing repo, gated repo, wrong token, missing revision: the fake hub (tests/support/fakehub.py) answers the
  metadata call with the status and X-Error-Code headers the real hub sends; huggingface_hub turns them
  into its own exception classes, which prepare maps to messages naming the knob to change.
"""

import json
import socket

import pytest

from hyperqwen.prepare.errors import SourceError
from hyperqwen.prepare.options import PrepareOptions
from hyperqwen.prepare.pipeline import prepare
from hyperqwen.prepare.source import COMPLETE_MARKER
from support.fakehub import FakeHub

TOKEN = "hf_FAKE_token_never_printed_0123456789"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the block ends: nothing listens there


def _options(tmp_path, endpoint, **overrides) -> PrepareOptions:
    values = dict(
        output_dir=tmp_path / "models" / "m",
        models_dir=tmp_path / "models",
        repo_id="org/model",
        revision="main",
        token=TOKEN,
        hf_endpoint=endpoint,
        show_progress=False,
    )
    values.update(overrides)
    return PrepareOptions(**values)


@pytest.fixture
def fake_hub():
    """The shared fake hub; each test sets the error it answers every request with."""
    with FakeHub({}) as hub:
        yield hub


def _message(exc_info) -> str:
    text = str(exc_info.value)
    assert TOKEN not in text  # never print the token
    return text


def test_no_network(tmp_path):
    options = _options(tmp_path, f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(SourceError) as info:
        prepare(options)
    text = _message(info)
    assert "cannot reach the Hugging Face hub" in text and "MODEL_SOURCE_DIR" in text and "org/model" in text
    assert not options.output_dir.exists()


def test_no_network_but_an_earlier_verified_download_is_used(tmp_path, pristine_source):
    import shutil

    options = _options(tmp_path, f"http://127.0.0.1:{_closed_port()}")
    shutil.copytree(pristine_source, options.source_download_dir)
    (options.source_download_dir / COMPLETE_MARKER).write_text(
        json.dumps({"repo": "org/model", "revision": "main", "commit": "a" * 40, "files": {}})
    )
    result = prepare(options)
    assert result.changed and (options.output_dir / "config.json").is_file()


def test_offline_without_a_download(tmp_path):
    options = _options(tmp_path, "http://127.0.0.1:9", offline=True)
    with pytest.raises(SourceError) as info:
        prepare(options)
    text = _message(info)
    assert "HF_HUB_OFFLINE" in text and "MODEL_SOURCE_DIR" in text


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (
            404,
            {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"},
            ["MODEL_REPO='org/model' was not found", "HF_TOKEN"],
        ),
        (
            403,
            {"X-Error-Code": "GatedRepo", "X-Error-Message": "Access to model org/model is restricted"},
            ["is gated", "accept the model's terms", "HF_TOKEN"],
        ),
        (
            401,
            {"X-Error-Message": "Invalid credentials in Authorization header"},
            ["rejected HF_TOKEN", "as invalid", "settings/tokens"],
        ),
        (
            404,
            {"X-Error-Code": "RevisionNotFound", "X-Error-Message": "Invalid rev id: nope"},
            ["MODEL_REVISION='main' does not exist"],
        ),
        (500, {}, ["HTTP 500", "retry later"]),
    ],
    ids=["missing-repo", "gated-repo", "wrong-token", "missing-revision", "server-error"],
)
def test_fake_hub_error_answers_map_to_clear_messages(tmp_path, fake_hub, status, headers, expected):
    fake_hub.fail_every_request(status, headers)
    options = _options(tmp_path, fake_hub.endpoint)
    with pytest.raises(SourceError) as info:
        prepare(options)
    text = _message(info)
    for part in expected:
        assert part in text, text
    assert not options.output_dir.exists()
