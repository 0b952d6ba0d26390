"""Why did my cache miss: the per-request diagnostics both vendors define, answered by the
gateway in the client's own protocol, with what only the engines' events can add.

- :mod:`.request`: what the client asked (Anthropic's ``diagnostics``, OpenAI's
  ``prompt_cache_options.comparison_response_id``, the chat header), checked, and the
  digests of the request's prompt-affecting parameters;
- :mod:`.compare`: the comparison of two requests' recorded segments in the engine's
  order (pure; no text is kept or read);
- :mod:`.verdict`: the comparison's outcome as each vendor's standard object, and the
  namespaced extension (``prefixgate_diagnostics``) beside it;
- :mod:`.lookup`: the earlier request, by the id its answer carried: this worker's
  memory, else the store (every worker and gateway on it; across restarts), only the
  same owner's.

``docs/diagnostics.md`` describes the protocols and what each answer means.
"""
