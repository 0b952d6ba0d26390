"""A channel's own TLS settings: its CA bundle, its client certificate (mutual TLS), used by
the request path, the model listing and the health probes alike (one transport)."""

from __future__ import annotations

import shutil
import socket
import ssl
import threading
import time

import anthropic
import httpx
import pytest
import uvicorn

from prefixgate.config import parse_config
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from tests.certs import self_signed
from tests.conftest import ListRecorder
from tests.fakes import Reply, ScriptedUpstream

MSG = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("pki")
    return {
        "server": self_signed(d, "server", "127.0.0.1"),
        "client": self_signed(d, "client", "gw"),
    }


@pytest.fixture(scope="module")
def mtls_upstream(pki):
    """The scripted upstream over https, asking every client for a certificate signed by
    the client's own (self-signed) one."""
    fake = ScriptedUpstream()
    fake.script = lambda body: Reply(text="over tls")
    fake.model_ids = ["qwen-over-tls"]
    server_cert, server_key = pki["server"]
    client_cert, _ = pki["client"]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        fake.app,
        ssl_certfile=str(server_cert),
        ssl_keyfile=str(server_key),
        ssl_ca_certs=str(client_cert),
        ssl_cert_reqs=ssl.CERT_REQUIRED,
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "upstream did not start"
        time.sleep(0.01)
    fake.url = f"https://127.0.0.1:{port}/v1"
    yield fake
    server.should_exit = True
    thread.join(10)
    sock.close()


def _gateway(base_url: str, tls: dict | None, **channel):
    ch = {"name": "tls", "base_url": base_url, **channel}
    if tls is not None:
        ch["tls"] = tls
    app = create_app(parse_config({"channels": [ch], "store": None}), recorder=ListRecorder())
    return ServerThread(app).start(), app.state.gateway


def test_a_channel_with_its_ca_bundle_and_client_certificate_is_served(pki, mtls_upstream):
    client_cert, client_key = pki["client"]
    tls = {
        "ca_bundle": str(pki["server"][0]),
        "client_cert": str(client_cert),
        "client_key": str(client_key),
    }
    srv, _ = _gateway(mtls_upstream.url, tls)
    try:
        with anthropic.Anthropic(base_url=srv.url, api_key="k", max_retries=0) as client:
            msg = client.messages.create(**MSG)
        assert msg.content[0].text == "over tls"
        # The model list of a channel that serves any model comes over the same TLS.
        models = httpx.get(srv.url + "/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["qwen-over-tls"]
    finally:
        srv.stop()


@pytest.mark.parametrize(
    "which, expect",
    [("no_ca", "CERTIFICATE_VERIFY_FAILED"), ("no_client_cert", "")],
)
def test_without_the_channels_tls_settings_the_upstream_is_refused(
    pki, mtls_upstream, which, expect
):
    client_cert, client_key = pki["client"]
    tls = {"ca_bundle": str(pki["server"][0])}
    if which == "no_ca":
        tls = {"client_cert": str(client_cert), "client_key": str(client_key)}
    srv, _ = _gateway(mtls_upstream.url, tls)
    try:
        r = httpx.post(srv.url + "/v1/messages", json=MSG)
        assert r.status_code == 502
        assert expect in r.json()["error"]["message"]
    finally:
        srv.stop()


def test_health_probes_use_the_channels_tls(pki, mtls_upstream):
    import asyncio

    client_cert, client_key = pki["client"]
    good = {
        "ca_bundle": str(pki["server"][0]),
        "client_cert": str(client_cert),
        "client_key": str(client_key),
    }
    for tls, healthy in ((good, True), ({"ca_bundle": str(pki["server"][0])}, False)):
        config = parse_config(
            {
                "channels": [
                    {
                        "name": "tls",
                        "base_url": mtls_upstream.url,
                        "tls": tls,
                        "health": {"interval": 60, "path": "/v1/models"},
                    }
                ],
                "store": None,
            }
        )
        gateway = create_app(config).state.gateway

        async def check(gateway=gateway):
            try:
                return await gateway.router.health.check_all()
            finally:
                await gateway.upstream.aclose()

        assert asyncio.run(check()) == {mtls_upstream.url: healthy}


def test_a_tls_setting_naming_a_missing_file_is_a_config_error(tmp_path):
    from prefixgate.config import ConfigError

    with pytest.raises((ConfigError, ValueError), match="no such file"):
        parse_config(
            {
                "channels": [
                    {
                        "name": "x",
                        "base_url": "https://127.0.0.1:1/v1",
                        "tls": {"ca_bundle": str(tmp_path / "missing.pem")},
                    }
                ],
                "store": None,
            }
        )
