"""What the guards send in gradio's place: a refusal in one sentence, and a request's body read already."""

from __future__ import annotations

import json
import math


async def refuse(send, status: int, sentence: str) -> None:
    """Answer HTTP ``status`` with ``{"detail": sentence}``, as gradio words its own refusals."""
    body = json.dumps({"detail": sentence}).encode("utf-8")
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class TooLarge(Exception):
    """A request's body went on past the most the reader would take."""


async def read_body(receive, most: float = math.inf) -> bytes | None:
    """The request's body, read whatever it declared; None if the client left before sending it all, TooLarge as
    soon as it passes ``most`` bytes."""
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        more = message.get("more_body", False)
        if size > most:
            raise TooLarge
    return b"".join(chunks)


def replay(body: bytes, receive):
    """A receive() that first gives the body read already, then whatever the connection sends next."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def headers_of(scope) -> dict[str, str]:
    """A request's headers, by lower-case name (the last of a repeated one)."""
    return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}


def forwarded_for(scope) -> str:
    """A request's X-Forwarded-For, its repeated headers joined in order, as one list of hops (public.Policy reads
    it from the right: a proxy that adds a header of its own rather than to the client's is read the same)."""
    return ", ".join(value.decode("latin-1") for name, value in scope["headers"] if name.lower() == b"x-forwarded-for")
