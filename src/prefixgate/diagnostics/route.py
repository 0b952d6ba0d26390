"""``GET /v1/diagnostics/{id}``: what the gateway knows of an earlier answer's cache, after
the answer: its diagnosis (what it was compared with and answered), the engine's figures
and its miss ledger (where each prompt token went, from the engines' KV events or the
cache model), once computed. Only the same owner's answers: any other id is 404."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from prefixgate.diagnostics.verdict import engine_truth, scope
from prefixgate.errors import GatewayError, NotFound
from prefixgate.protocol import openai as openai_proto


async def diagnosis(gateway, request: Request) -> Response:
    from prefixgate.pipeline import error_response

    try:
        principal = gateway.auth.authenticate(request.headers)
        answer_id = request.path_params["id"]
        fingerprints = gateway.fingerprints
        rec, _ = await fingerprints.find(answer_id)
        mine = principal.owner or principal.name
        if rec is None or scope(rec) != mine:
            raise NotFound(f"no answer {answer_id!r} is known here")
        ledger = fingerprints.ledger(rec.request_id) or await fingerprints.stored_ledger(
            rec.request_id
        )
        return JSONResponse(
            {
                "id": answer_id,
                "request_id": rec.request_id,
                "diagnosis": msgspec.to_builtins(rec.diagnosis),
                "engine": engine_truth(rec.prompt_tokens, rec.cached_tokens),
                "ledger": ledger.as_dict() if ledger is not None else None,
            }
        )
    except GatewayError as err:
        return error_response(err, openai_proto.error_bytes)
