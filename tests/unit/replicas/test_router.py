"""`hyperqwen router`: the vllm-router command line (parsed by vllm-router's own parser) and the gate's rules."""

from __future__ import annotations

import argparse

import pytest

from hyperqwen.replicas.router import allowed, key_ok, parse_worker_urls, router_argv, run


def test_router_argv_parses_with_vllm_routers_own_parser():
    launch = pytest.importorskip("vllm_router.launch_router", reason="vllm-router is not installed")
    argv = router_argv(["http://replica-0:18020", "http://replica-1:18020"], policy="cache_aware", port=18028,
                       prometheus_port=18029)
    args = launch.parse_router_args(argv[1:])
    assert args.worker_urls == ["http://replica-0:18020", "http://replica-1:18020"]
    assert (args.host, args.port, args.policy) == ("127.0.0.1", 18028, "cache_aware")
    assert (args.health_check_interval_secs, args.health_failure_threshold) == (5, 2)
    assert args.prometheus_host == "127.0.0.1"


@pytest.mark.parametrize("policy", ["cache_aware", "consistent_hash", "round_robin", "power_of_two"])
def test_every_router_policy_knob_value_is_a_vllm_router_policy(policy):
    launch = pytest.importorskip("vllm_router.launch_router", reason="vllm-router is not installed")
    from hyperqwen.config.knobs import KNOBS_BY_NAME

    assert policy in KNOBS_BY_NAME["ROUTER_POLICY"].choices
    assert launch.parse_router_args(router_argv(["http://a:1"], policy=policy, port=1, prometheus_port=2)[1:])


def test_worker_urls_commas_or_spaces():
    urls, problems = parse_worker_urls("http://10.0.0.2:18020, http://10.0.0.3:18020/ http://h:1", "ROUTER_WORKERS")
    assert problems == [] and urls == ["http://10.0.0.2:18020", "http://10.0.0.3:18020", "http://h:1"]


@pytest.mark.parametrize("raw", ["", "10.0.0.2:18020", "http://h:1/v1", "ftp://h:1", "http://h:1,http://h:1"])
def test_bad_worker_urls_are_refused_naming_the_knob(raw):
    _, problems = parse_worker_urls(raw, "ROUTER_WORKERS")
    assert problems and all(p.knob == "ROUTER_WORKERS" for p in problems)


def test_key_check_bearer_or_x_api_key():
    key = "k" * 32
    assert key_ok({"Authorization": f"Bearer {key}"}, key)
    assert key_ok({"Authorization": f"bearer {key}"}, key)
    assert key_ok({"x-api-key": key}, key)
    assert not key_ok({}, key)
    assert not key_ok({"Authorization": f"Bearer {key}x"}, key)
    assert not key_ok({"Authorization": key}, key)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/responses",
                                  "/v1/responses/resp_1", "/v1/messages", "/v1/messages/count_tokens", "/health"])
def test_inference_routes_pass(path):
    assert allowed(path)


@pytest.mark.parametrize("path", ["/add_worker", "/remove_worker", "/list_workers", "/flush_cache", "/get_loads",
                                  "/workers/http://x", "/metrics", "/tokenize", "/invocations", "/v1/chat/completionsX",
                                  "/scheduling/diagnostics", "/"])
def test_admin_and_other_routes_are_blocked(path):
    assert not allowed(path)


def test_router_refuses_exposure_without_a_key(tmp_path, capsys):
    args = argparse.Namespace(print=True, env_file=None, set=None)
    environ = {"ROUTER_WORKERS": "http://10.0.0.2:18020", "BIND": "0.0.0.0", "MODELS_DIR": str(tmp_path)}
    assert run(args, environ) == 2
    assert "BIND=0.0.0.0" in capsys.readouterr().err


def test_router_without_replicas_says_how_to_get_them(tmp_path, capsys):
    args = argparse.Namespace(print=True, env_file=None, set=None)
    assert run(args, {"MODELS_DIR": str(tmp_path)}) == 2
    assert "hyperqwen replicas" in capsys.readouterr().err
