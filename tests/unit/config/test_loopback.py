"""Loopback is loopback: every spelling the OS resolves to a loopback address is loopback (and named so);
every other spelling needs a key. One decision, settings.is_loopback, made with the OS resolver (getaddrinfo),
which is what the listening socket uses. BIND itself takes what docker compose takes in a port publish, an IP
address: the other loopback spellings (127.1, localhost, ...) are refused as BIND with a line naming 127.0.0.1."""

from __future__ import annotations

import pytest

from hyperqwen.config.settings import SettingsError, describe_bind, is_loopback, resolve_settings
from hyperqwen.launch.command import build_command, check_command

KEY = "sk-test-0123456789abcdef"
LOOPBACK = ["127.0.0.1", "127.1", "127.0.0.2", "0x7f.1", "2130706433", "::1", "::ffff:127.0.0.1", "localhost",
            "LOCALHOST", "[::1]", "127.255.255.254"]
EXPOSED = ["0.0.0.0", "::", "10.0.0.1", "192.168.1.20", "128.0.0.1", "::ffff:10.0.0.1", "[::]",
           "no-such-host.invalid"]


@pytest.mark.parametrize("bind", LOOPBACK)
def test_loopback_spellings_are_loopback(bind):
    assert is_loopback(bind)


@pytest.mark.parametrize("bind", EXPOSED)
def test_other_spellings_are_not(bind):
    assert not is_loopback(bind)


# Loopback, but not an IP address as compose reads one: refused as BIND (test_settings covers the message).
NOT_AN_ADDRESS = ["127.1", "0x7f.1", "2130706433", "localhost", "LOCALHOST"]


@pytest.mark.parametrize("bind", NOT_AN_ADDRESS + ["no-such-host.invalid"])
def test_bind_that_is_not_an_address_is_refused_naming_what_works(bind):
    with pytest.raises(SettingsError, match=r"not an IP address.*127\.0\.0\.1"):
        build_command(resolve_settings({"BIND": bind}, mode="single"), api_key=None)


@pytest.mark.parametrize("bind", [b for b in LOOPBACK if b not in NOT_AN_ADDRESS])
def test_loopback_bind_starts_without_a_key_and_listens_there(bind):
    command = build_command(resolve_settings({"BIND": bind}, mode="single"), api_key=None)
    host = bind.strip("[]")
    assert f"--host={host}" in command.vllm_args  # the spelling the socket resolves, URL brackets removed
    assert check_command(command) == []


@pytest.mark.parametrize("bind", EXPOSED[:-1])
def test_exposed_bind_without_a_key_is_refused_in_one_message(bind):
    with pytest.raises(SettingsError) as caught:
        build_command(resolve_settings({"BIND": bind}, mode="single"), api_key=None)
    (problem,) = caught.value.problems
    assert problem.knob == "BIND" and "exposes the API beyond this machine" in problem.message


def test_a_name_that_does_not_resolve_is_named_so():
    assert "does not resolve" in describe_bind("no-such-host.invalid")


@pytest.mark.parametrize(("bind", "says"), [("127.1", "resolves to 127.0.0.1: loopback"),
                                            ("localhost", "loopback"), ("::ffff:127.0.0.1", "127.0.0.1"),
                                            ("0x7f.1", "resolves to 127.0.0.1: loopback")])
def test_messages_name_a_loopback_spelling_as_loopback(bind, says):
    assert says in describe_bind(bind)


def test_verify_calls_a_loopback_spelling_loopback(tmp_path):
    import io

    from hyperqwen.verify import Report, check_settings

    report = Report(out=io.StringIO())
    check_settings(report, {"BIND": "::ffff:127.0.0.1", "MODELS_DIR": str(tmp_path)})
    (line,) = [line for status, line in report.lines if "api key" in line]
    assert line.startswith("WARN") and "this machine only" in line and "exposes" not in line
