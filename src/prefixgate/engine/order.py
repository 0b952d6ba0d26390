"""How an upstream's chat template renders a conversation, per channel: learned from the
upstream (or its configured template), not assumed (the facts: :mod:`.rendering`), and
kept by the gateway's :class:`RenderOrders`.

A channel's ``render_order`` is ``tools_first``, ``system_first`` or ``auto`` (the
default). For ``auto`` the gateway asks the upstream's ``POST /tokenize`` (vLLM
and the simulated upstream) for the probe conversations of :func:`.rendering.probes`:
where the tools go, whether a later ``role: system`` message stays in place or moves to
the head, and whether an assistant's reasoning is still rendered once a new user turn
follows. A channel that names its engine's ``chat_template`` is read from that template
instead (rendered here, no round trip). The learned rendering places the segments (their
order and token offsets), the prefix router's blocks and the prompt estimates, and turns
on the protection of later system messages (``hygiene/system_in_place.py``); until it is
learned, or when the upstream has no ``/tokenize``, ``tools_first`` is used, the rest is
``unknown``, and that is said.

What is learned is the gateway's (``gateway.render_orders``, one :class:`RenderOrders`
each): every configuration generation it builds (``live.py``) shares it, so a reload
keeps what was learned of the channels it does not move, and two gateways in one
process learn theirs apart.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace

import msgspec

from prefixgate.engine.counting import tokenize_url
from prefixgate.engine.rendering import ASSUMED, Rendering, first_difference, from_renderings
from prefixgate.engine.rendering import probes as _probes

log = logging.getLogger("prefixgate")

FALLBACK = "tools_first"
RETRY_S = 30.0  # after a failed attempt (doubling up to REFRESH_S)
REFRESH_S = 600.0  # after a learned one (the upstream may have been restarted with another model)
MODELS_S = 60.0  # how often a learned upstream's /models is checked for another model


@dataclass(frozen=True, slots=True)
class Learned:
    order: str  # tools_first | system_first
    source: str  # how it is known: "configured", "tokenize", "assumed (...)"


def order_from_tokens(base: list, system_changed: list, tools_changed: list) -> str | None:
    """The order the three prompts' tokens show, or None when they do not tell (a template
    that renders no tools, or changes that start at the same token)."""
    s = first_difference(base, system_changed)
    t = first_difference(base, tools_changed)
    if s is None or t is None or s == t:
        return None
    return "system_first" if s < t else "tools_first"


class RenderOrders:
    """What each channel's chat template was learned to do, from its engine's
    ``/tokenize`` or its configured template: owned by the gateway, so a reload keeps it
    (the channels it did not move), and each gateway learns its own."""

    def __init__(self) -> None:
        self._learned: dict[tuple[str, str], Rendering] = {}  # (channel, base_url) -> learned
        self._from_templates: dict[str, Rendering] = {}  # a template's path -> its rendering
        self._models: dict[tuple[str, str], tuple | None] = {}  # model ids seen when learned
        self._told: set[tuple[str, str]] = set()  # failures logged (once, not every retry)

    def render_order(self, channel) -> str:
        """The order the channel's upstream renders tools and system in."""
        return self.rendering_of(channel).tools

    def order_of(self, channel) -> Learned:
        """The channel's render order and how it is known."""
        if channel.render_order != "auto":
            return Learned(channel.render_order, "configured")
        got = self.rendering_of(channel)
        return Learned(got.tools, got.source)

    def rendering_of(self, channel) -> Rendering:
        """Everything known of how the channel's upstream renders a conversation: its
        configured template's rendering, else what its ``/tokenize`` showed, else the
        assumption; a configured ``render_order`` wins for the tools."""
        got = None
        if getattr(channel, "chat_template", None):
            got = self._template_rendering(channel.chat_template)
        if got is None:
            got = self._learned.get((channel.name, channel.base_url), ASSUMED)
        if channel.render_order != "auto" and got.tools != channel.render_order:
            got = replace(got, tools=channel.render_order)
        return got

    def _template_rendering(self, path: str) -> Rendering | None:
        """The rendering of a configured template (read once; None: it cannot be rendered)."""
        got = self._from_templates.get(path)
        if got is None:
            from prefixgate.cache.render import JinjaChatTemplate, RenderError, vllm_messages

            try:
                template = JinjaChatTemplate.from_file(path)
            except RenderError as exc:
                log.warning("chat template %s: %s", path, exc)
                return None

            def render(body: dict) -> str | None:
                try:
                    messages, tools = vllm_messages(body["messages"]), body.get("tools")
                    return template.render(messages, tools, body["add_generation_prompt"])
                except RenderError:
                    return None  # a template that refuses the probe tells nothing of it

            got = self._from_templates[path] = from_renderings(
                {name: render(body) for name, body in _probes().items()}, "configured template"
            )
        return got

    async def learn(self, channel, transport) -> Rendering | None:
        """Ask the channel's upstream (``openai`` channels) how it renders the probe
        conversations; remember and return what they show (None: the upstream did not tell
        where the tools go, its ``/tokenize`` missing or refusing)."""
        from prefixgate.engine.channel import post_for_json
        from prefixgate.events.tokens import tokenize_messages

        model = channel.upstream_model(channel.models[0]) if channel.models else None
        url = tokenize_url(channel.urls()[0])

        async def ask(body: dict) -> list | BaseException:
            body = {**body, "messages": tokenize_messages(body["messages"])}
            if model is not None:
                body = {"model": model, **body}
            failed: BaseException | None = None
            for _ in range(2):  # once more: a loaded engine may drop one of the round's requests
                try:
                    doc = await post_for_json(transport, channel, url, msgspec.json.encode(body))
                    return doc["tokens"]
                except Exception as exc:  # noqa: BLE001 - an upstream without /tokenize tells nothing
                    failed = exc
            return failed

        probes = _probes()
        answers = await asyncio.gather(*(ask(body) for body in probes.values()))
        got: dict[str, list | None] = {}
        for name, tokens in zip(probes, answers, strict=True):
            if isinstance(tokens, BaseException) and name.startswith("tools."):
                self._not_learned(
                    channel, f"render order not learned ({tokens}); assuming {FALLBACK}"
                )
                return None
            # None: a template that refuses a probe (a later system message, say)
            got[name] = tokens if isinstance(tokens, list) else None
        source = "tokenize"
        if order_from_tokens(got["tools.base"], got["tools.system"], got["tools.tool"]) is None:
            self._not_learned(
                channel, f"/tokenize does not show where the tools go; assuming {FALLBACK}"
            )
            source = f"tokenize (the tools' place not shown: {FALLBACK} assumed)"
        rendering = from_renderings(got, source)
        key = (channel.name, channel.base_url)
        if self._learned.get(key) != rendering:
            log.info(
                "channel %s: the upstream renders the tools %s, later system messages %s, "
                "past reasoning %s (learned from /tokenize)",
                channel.name,
                rendering.tools,
                rendering.system,
                rendering.reasoning,
            )
        self._learned[key] = rendering
        return rendering

    def _not_learned(self, channel, why: str) -> None:
        key = (channel.name, channel.base_url)
        log.log(
            logging.DEBUG if key in self._told else logging.INFO,
            "channel %s: %s",
            channel.name,
            why,
        )
        self._told.add(key)

    async def start(self, channels, transport, first_wait: float = 2.0) -> asyncio.Task | None:
        """Learn the rendering of every ``openai`` channel without a configured template: the
        first round now (waiting at most ``first_wait`` seconds, so the first requests are
        placed in the learned order; a slower upstream's round goes on, not cancelled, and
        counts as soon as it ends), then a task that asks again every few minutes, and sooner
        while a channel is not learned."""
        # a configured render_order says where the tools go, not the rest: asked all the same
        auto = [ch for ch in channels if ch.kind == "openai" and not ch.chat_template]
        if not auto:
            return None
        first = asyncio.ensure_future(asyncio.gather(*(self.learn(ch, transport) for ch in auto)))
        await asyncio.wait({first}, timeout=first_wait)
        return asyncio.get_running_loop().create_task(self._again(auto, transport, first))

    async def learn_all(self, channels, transport) -> None:
        """Learn the rendering of the channels among ``channels`` that learn it from the engine
        once (a reload added or moved them); the periodic task of :meth:`start` does not know
        them."""
        auto = [ch for ch in channels if ch.kind == "openai" and not ch.chat_template]
        await asyncio.gather(*(self.learn(ch, transport) for ch in auto))

    async def _again(self, auto, transport, first: asyncio.Future | None = None) -> None:
        if first is not None:
            try:
                await first
            except asyncio.CancelledError:
                first.cancel()
                raise
        await asyncio.gather(*(self._note_models(ch, transport) for ch in auto))
        retry = RETRY_S
        waited = 0.0
        while True:
            learned = all(self._learned.get((ch.name, ch.base_url)) is not None for ch in auto)
            if not learned:
                await asyncio.sleep(retry)
                retry = min(retry * 2, REFRESH_S)
                await asyncio.gather(*(self.learn(ch, transport) for ch in auto))
                continue
            retry = RETRY_S
            await asyncio.sleep(MODELS_S)
            waited += MODELS_S
            due = waited >= REFRESH_S
            waited = 0.0 if due else waited
            await asyncio.gather(*(self._check(ch, transport, due) for ch in auto))

    async def _note_models(self, channel, transport) -> None:
        """The models a learned upstream serves (one that did not tell is not asked)."""
        key = (channel.name, channel.base_url)
        if key in self._learned:
            self._models[key] = await _model_ids(channel, transport)

    async def _check(self, channel, transport, due: bool) -> None:
        """Learn the channel again when its upstream serves other models now (restarted with
        another model, so maybe another template), or every ``REFRESH_S``."""
        key = (channel.name, channel.base_url)
        ids = await _model_ids(channel, transport)
        if due or (ids is not None and ids != self._models.get(key)):
            if ids != self._models.get(key):
                log.info("channel %s: the upstream's models changed; its rendering is re-learned",
                         channel.name)  # fmt: skip
            await self.learn(channel, transport)
            self._models[key] = ids

    def renderings(self, channels) -> list[dict]:
        """What is known of each ``openai`` channel's template, and whether the gateway keeps
        later system messages in place for it (``/healthz`` details, the Upstream page)."""
        from prefixgate.hygiene import keeps_system_in_place

        return [
            {
                "channel": ch.name,
                **self.rendering_of(ch).as_dict(),
                "system_in_place": keeps_system_in_place(ch, self),
            }
            for ch in channels
            if ch.kind == "openai"
        ]


async def _model_ids(channel, transport) -> tuple | None:
    """The ids of the upstream's ``/models`` (None: it did not answer)."""
    try:
        doc = await transport.get_json(
            channel.urls()[0] + "/models", timeouts=channel.timeouts, tls=channel.tls
        )
        return tuple(sorted(str(m.get("id")) for m in doc["data"]))
    except Exception:  # noqa: BLE001 - checked again at the next round
        return None
