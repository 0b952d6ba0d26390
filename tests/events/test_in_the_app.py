"""The app's lifespan starts the engines' event subscribers and stops them."""

from __future__ import annotations

import asyncio

from prefixgate.config import parse_config
from prefixgate.events import BlockStored
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from tests.conftest import ListRecorder

from .streams import REPLICA, bound_publisher, wait_until


def test_the_lifespan_runs_the_hub() -> None:
    pub = bound_publisher(topic="kv-events")
    port = pub.endpoint.rsplit(":", 1)[1]
    channel = {
        "name": "local",
        "base_url": REPLICA,
        "kv_events": {"endpoint": f"tcp://*:{port}", "topic": "kv-events"},
    }
    app = create_app(parse_config({"channels": [channel], "store": None}), recorder=ListRecorder())
    hub = app.state.events
    assert hub is not None and not hub.status("local", REPLICA).connected
    try:
        with ServerThread(app):
            assert pub.wait_for_subscribers(1, 30)  # the lifespan started the subscriber
            pub.publish([BlockStored([1], None, list(range(16)), 16, medium="GPU")])
            st = hub.status("local", REPLICA)
            asyncio.run(wait_until(lambda: st.batches == 1, "the batch in the app's index"))
            assert hub.statuses()[0]["blocks"] == {"GPU": 1}
        assert hub._ctx is None  # stopped with the app: its subscription is withdrawn
        asyncio.run(wait_until(lambda: pub.subscriptions == 0, "the subscriber gone"))
        assert not st.connected
    finally:
        pub.close()


def test_no_hub_without_kv_events() -> None:
    config = parse_config({"channels": [{"name": "c", "base_url": REPLICA}], "store": None})
    assert create_app(config, recorder=ListRecorder()).state.events is None
