"""What a public demo's server takes in: a request that is not an upload carries at most BODY_BYTES (gradio reads any
body into memory, and a 400 MB JSON body would be read whole, and copied into its log, by anyone), and uploads are
taken here in gradio's place: one file per request, in a folder of its own (gradio shares one folder between
identical uploads, so the first visitor's upload event took the other's file away), counted against its network
address's share of the disk as the bytes arrive (studio.files.Files.take_share), and cut, with what it wrote
removed, when it stalls or its sender leaves.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
from pathlib import Path

from gradio_client.utils import strip_invalid_filename_characters
from python_multipart.multipart import parse_options_header
from starlette.datastructures import QueryParams
from starlette.formparsers import MultiPartException
from starlette.requests import Request

from gradio.route_utils import GradioMultiPartParser, GradioUploadFile
from gradio.routes import file_upload_statuses

from ...errors import BusyError
from ...public import Policy
from ...studio.files import Files
from .answers import TooLarge, forwarded_for, headers_of, read_body, refuse, replay
from .routes import UPLOAD_PROGRESS, UPLOAD_ROUTE, route_path

# An event's inputs: the largest a page sends, a page load with its kept draft (studio.draft.KEPT_DRAFT_BYTES), is a
# quarter of it.
BODY_BYTES = 512 * 2**10
FILES_PER_UPLOAD = 1  # what the page's one upload field sends (gradio takes up to 1,000 in a request)
UPLOAD_IDLE_S = 30  # an upload that sends nothing for this long is cut...
UPLOAD_S = 600  # ...and so is one that has not ended after this long (20 MB at 35 KB/s)
UPLOAD_ID_CHARS = 64  # an upload's name for its progress (the page's are 11 characters)


class UploadCut(MultiPartException):
    """Raised into gradio's upload parser to end an upload part way: it is the parser's own error, so the parser
    deletes what it wrote of the file."""


class ShareSpent(UploadCut):
    """The address's share ran out part way through an upload (its sentence is the answer)."""


class Stalled(UploadCut):
    """The upload sent nothing for a while, or went on too long (its sentence is the answer)."""


class RequestLimits:
    """ASGI middleware of a public demo: the body limit, and uploads (see the module). A refusal is HTTP 400, 408,
    413 or 429 with one sentence."""

    def __init__(self, app, files: Files, body_bytes: int = BODY_BYTES, *, policy: Policy) -> None:
        if policy.limits is None:
            raise TypeError("Only a public demo's server limits its requests: its policy has limits.")
        self.app, self.files, self.policy, self.body_bytes = app, files, policy, body_bytes
        self.upload_mb = policy.limits.upload_mb

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            if scope["type"] == "http" and UPLOAD_PROGRESS.fullmatch(route_path(scope)):
                return await _progress(scope, receive, send, self.app)
            return await self.app(scope, receive, send)
        headers = headers_of(scope)
        declared = int(headers["content-length"]) if headers.get("content-length", "").isdigit() else None
        if UPLOAD_ROUTE.fullmatch(route_path(scope)):
            address = self.policy.network_address(forwarded_for(scope), (scope.get("client") or (None,))[0])
            return await self._upload(scope, receive, send, address or "unknown", declared or 0)
        if declared is not None and declared > self.body_bytes:
            return await refuse(send, 413, self._too_large())
        try:  # read here, to its limit, whatever the request declared
            body = await read_body(receive, self.body_bytes)
        except TooLarge:
            return await refuse(send, 413, self._too_large())
        if body is None:  # the client left before sending it all
            return None
        return await self.app(scope, replay(body, receive), send)

    async def _upload(self, scope, receive, send, address: str, declared: int) -> None:
        """Take an upload in gradio's place while its address's share lasts: its declared length and its one file
        are counted first, then every byte beyond it as it arrives."""
        try:
            self.files.take_share(declared, FILES_PER_UPLOAD, address)
        except BusyError as spent:
            return await refuse(send, 429, str(spent))
        counted, received, deadline = declared, 0, asyncio.get_running_loop().time() + UPLOAD_S

        async def counting_receive():
            nonlocal counted, received
            wait = min(UPLOAD_IDLE_S, deadline - asyncio.get_running_loop().time())
            try:
                message = await asyncio.wait_for(receive(), max(0.0, wait))
            except TimeoutError:
                raise Stalled(f"An upload to this public demo sends something every {UPLOAD_IDLE_S} s and ends "
                              f"within {UPLOAD_S // 60} minutes; send it again.") from None
            if message["type"] == "http.disconnect":
                raise UploadCut("The upload was abandoned part way.")
            received += len(message.get("body", b""))
            if received > counted:
                try:
                    self.files.take_share(received - counted, 0, address)
                except BusyError as spent:
                    raise ShareSpent(str(spent)) from None
                counted = received
            return message

        folder = self.files.arrivals / secrets.token_hex(16)
        folder.mkdir(parents=True)
        try:
            paths = await _take_files(Request(scope, counting_receive), folder, self.upload_mb)
        except MultiPartException as exc:
            shutil.rmtree(folder, ignore_errors=True)
            if isinstance(exc, ShareSpent | Stalled):
                return await refuse(send, 429 if isinstance(exc, ShareSpent) else 408, exc.message)
            if isinstance(exc, UploadCut):
                return None  # nobody is listening
            return await refuse(send, 413 if "maximum allowed size" in exc.message else 400, exc.message)
        except BaseException:  # the disk is full, the server is stopping: nothing of it stays
            shutil.rmtree(folder, ignore_errors=True)
            raise
        scope["app"].get_blocks().upload_file_set.update(paths)  # what gradio's own upload route records
        body = json.dumps(paths).encode("utf-8")
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def _too_large(self) -> str:
        return (f"This public demo takes requests of at most {self.body_bytes / 2**10:g} KB (no setting needs more); "
                "send less.")


async def _progress(scope, receive, send, app) -> None:
    """gradio's upload progress, asked for by an upload's name: a name is at most UPLOAD_ID_CHARS long, and gradio's
    note of one it never tracked (which it keeps forever, for any name anyone asks about) goes once answered."""
    upload_id = QueryParams(scope.get("query_string", b"")).get("upload_id") or ""
    if len(upload_id) > UPLOAD_ID_CHARS:
        return await refuse(send, 400, f"An upload's name has at most {UPLOAD_ID_CHARS} characters.")
    try:
        return await app(scope, receive, send)
    finally:
        if upload_id not in file_upload_statuses._statuses:
            file_upload_statuses._signals.pop(upload_id, None)


async def _take_files(request: Request, folder: Path, most_mb: float) -> list[str]:
    """The files of an upload request, as gradio's upload route parses them (its own parser, its progress for the
    page), each saved in ``folder`` under its own name; MultiPartException for a request that is not one."""
    content_type, _ = parse_options_header(request.headers.get("content-type") or "")
    if content_type != b"multipart/form-data":
        raise MultiPartException("An upload is sent as multipart/form-data.")
    upload_id = request.query_params.get("upload_id")
    if upload_id and len(upload_id) > UPLOAD_ID_CHARS:
        raise MultiPartException(f"An upload's name has at most {UPLOAD_ID_CHARS} characters.")
    progress = None
    if upload_id:
        progress = file_upload_statuses
        progress.track(upload_id)
    parser = GradioMultiPartParser(request.headers, request.stream(), max_files=FILES_PER_UPLOAD, max_fields=4,
                                   upload_dir=folder, max_file_size=int(most_mb * 2**20), upload_id=upload_id,
                                   upload_progress=progress)
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        if "Too many files" in exc.message:
            raise MultiPartException(f"An upload to this public demo carries {FILES_PER_UPLOAD} file; send each "
                                     "file on its own.") from None
        raise
    paths = []
    for upload in form.getlist("files"):
        if not isinstance(upload, GradioUploadFile):
            continue
        name = strip_invalid_filename_characters(Path(upload.filename or "").name)
        target = folder / (name if name.strip(".") else "upload")
        upload.file.close()
        os.replace(upload.file.name, target)
        paths.append(str(target))
    for left in folder.iterdir():  # a file sent under another name than the page's
        if str(left) not in paths:
            left.unlink()
    return paths
