"""The files the app hands out and takes in: downloads, uploads, and the paths it shows.

On your own machine they are simply paths. In a public demo they are where visitors could reach each other's
things or the server's, so each upload moves into its visitor's own folder, a download is a copy in a folder of its
own, and no path shown names a folder of the server's (the app's, the runs folder, a visitor's key): a run's path
is shown from the runs folder on, a data source by its name (shown_source), and what comes back is resolved on the
server (real_source).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import shutil
import tempfile
import threading
from pathlib import Path

from ..config import Draft
from ..data import bundled_datasets, is_bundled
from ..errors import BusyError, ConfigError
from ..public import LIFT, SHARE_WINDOW_S, Allowance, Policy, RequestPolicy

UPLOADS_KEPT = 3  # a visitor's newest uploads in a public demo; an older one goes when a new one arrives
UPLOADS_SHOWN = "uploads"  # a visitor's upload as a public demo shows it: uploads/<its file name>


class Files:
    """Downloads, uploads and shown paths for the app serving ``runs_dir`` under ``policy``. In a public demo each
    network address has a share of the disk (``Limits.disk_mb`` and ``Limits.disk_files`` per SHARE_WINDOW_S): an
    upload, an export and a copy of a run's file each count against it before it is written."""

    policy = RequestPolicy()  # asked by the visitor of the request being served

    def __init__(self, runs_dir: Path, *, policy: Policy) -> None:
        self.runs_dir = runs_dir
        self.policy = policy
        self.cache_dir = Path(tempfile.gettempdir())  # the web server's cache (serve_from)
        self._bytes, self._files = Allowance(SHARE_WINDOW_S), Allowance(SHARE_WINDOW_S)
        self._share_lock = threading.Lock()
        self._secret = secrets.token_bytes(32)  # download_name's

    @property
    def public(self) -> bool:
        return self.policy.public

    def serve_from(self, cache_dir: str | Path) -> None:
        """The web server hands out the files of ``cache_dir`` as they are: downloads are made there, so none is
        copied again on its way out, and a public demo's uploads arrive there (``arrivals``)."""
        self.cache_dir = Path(cache_dir)

    @property
    def downloads_dir(self) -> Path:
        """Where files made to be downloaded go (exports, copies of a run's files), each in a folder of its own; a
        public demo removes them after an hour."""
        folder = self.cache_dir / "dragon-downloads"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    @property
    def arrivals(self) -> Path:
        """Where a public demo's uploads arrive, each in a folder of its own, until an upload event moves it into its
        visitor's folder (keep_upload); what nobody claims goes after an hour. On your own machine, the web server's
        cache, where gradio puts them."""
        return self.cache_dir / "dragon-uploads" if self.public else self.cache_dir

    def take_share(self, size: int, files: int, address: str | None = None) -> None:
        """Count ``size`` bytes and ``files`` files that the server is about to write for a network address
        (``address``, else the asking visitor's) against its share of the disk; BusyError, counting nothing, when
        that would pass it. Nothing outside public mode, or for the operator and the demo's owner."""
        who = self.policy.visitor
        address = address if address is not None else who.address
        limits = self.policy.limits
        if limits is None or not address or (address == who.address and who.owns_everything):
            return
        most_bytes = limits.disk_mb * 2**20
        with self._share_lock:
            if self._files.spent(address) + files > limits.disk_files:
                spent, wait = f"{limits.disk_files} files", self._files.minutes_to_wait(address)
            elif self._bytes.spent(address) + size > most_bytes:
                spent, wait = f"{limits.disk_mb:g} MB", self._bytes.minutes_to_wait(address)
            else:
                self._files.take(address, files, limits.disk_files)
                self._bytes.take(address, size, most_bytes)
                return
        raise BusyError(f"Uploads and downloads from your network address have reached this public demo's share of "
                        f"{spent} per {SHARE_WINDOW_S // 60} minutes; try again in {wait} minutes ({LIFT} without "
                        "limits).")

    def refuse_beyond_share(self, size: int, what: str) -> None:
        """In a public demo whose runs lie on another disk than its downloads (a Space's persistent storage), where
        a run's file is handed out as a copy counted against the visitor's share: refuse up front, in a sentence, a
        download of about ``size`` bytes that no share could hold, before minutes of work that would end refused."""
        limits = self.policy.limits
        if limits is None or self.policy.visitor.owns_everything or size <= limits.disk_mb * 2**20:
            return
        if same_disk(self.runs_dir, self.downloads_dir):
            return  # handed out as a link: it costs the disk nothing more
        raise BusyError(f"{what} would be about {size / 2**20:,.0f} MB, more than this public demo hands one visitor "
                        f"({limits.disk_mb:g} MB per {SHARE_WINDOW_S // 60} minutes); {LIFT} to take it with you.")

    def new_download(self, name: str) -> Path:
        """Where to write one new download named ``name``: in a folder of its own, counted as a file against the
        visitor's share. The folder's name cannot be guessed: the server hands out its cache to anyone who names a
        file in it."""
        self.take_share(0, 1)
        folder = self.downloads_dir / secrets.token_hex(16)
        folder.mkdir()
        return folder / name

    def download_name(self, what: str) -> str:
        """The name of a download's folder that stands for ``what`` (the same for the same ``what``, while the app
        runs), which nobody can work out from ``what``."""
        return hmac.new(self._secret, what.encode("utf-8"), hashlib.sha256).hexdigest()[:32]

    def handed_out(self, path: Path) -> str:
        """A file of a run to hand to its owner's browser: the file itself where the runs folder is served (your
        own machine); in a public demo, where it is not, a link to it (or a copy, counted against the visitor's
        share) in a new folder of the server's cache, which the server then hands to that browser alone."""
        if not self.public:
            return str(path)
        target = self.new_download(Path(path).name)
        try:
            os.link(path, target)  # no copy of a large model where the folders share a disk
        except OSError:
            try:
                self.take_share(Path(path).stat().st_size, 0)
            except BusyError:
                target.parent.rmdir()
                raise
            shutil.copy2(path, target)
        return str(target)

    def keep_upload(self, uploaded: str | Path) -> str:
        """The data source an upload becomes. In a public demo the file moves out of the web server's cache (which
        it serves to anyone who knows a file's address) into the visitor's own folder, which nothing serves and
        only that visitor's runs may read (Policy.is_own_upload); elsewhere it stays where it arrived.

        ``uploaded`` must lie where uploads arrive (``arrivals``): an event can be sent with any path."""
        uploaded = Path(uploaded).resolve()
        folder = self.arrivals.resolve()
        if not uploaded.is_file() or not uploaded.is_relative_to(folder):
            raise ConfigError("That file was not uploaded here; upload it again.")
        if not self.public:
            return str(uploaded)
        own = self.policy.own_uploads_dir()
        if own is None:
            raise ConfigError("This page could not be told apart from other visitors' pages; reload it and upload "
                              "the file again.")
        if own.is_dir():  # a visitor keeps their newest uploads only: the disk is everyone's
            earlier = sorted(own.iterdir(), key=lambda folder: folder.stat().st_mtime)
            for folder in earlier[:max(0, len(earlier) - (UPLOADS_KEPT - 1))]:
                shutil.rmtree(folder, ignore_errors=True)
        target = own / secrets.token_hex(8) / uploaded.name
        target.parent.mkdir(parents=True)
        shutil.move(uploaded, target)
        if uploaded.parent != folder:  # each upload arrives in a folder of its own
            shutil.rmtree(uploaded.parent, ignore_errors=True)
        return str(target)

    def discard_upload(self, source: str) -> None:
        """Remove an upload kept in a public demo that turned out unreadable: it is no use, and takes room."""
        path = Path(source)
        policy = self.policy
        if self.public and policy.is_own_upload(path.resolve()) and path.parent.parent == policy.own_uploads_dir():
            shutil.rmtree(path.parent, ignore_errors=True)

    def shown_path(self, path: Path) -> str:
        """A path of the runs folder as the app shows it: whole on your own machine; in a public demo from the runs
        folder on, since where the server keeps its files is nobody's business."""
        if not self.public:
            return str(path)
        return str(Path(path).resolve().relative_to(self.runs_dir)) if Path(path).resolve().is_relative_to(
            self.runs_dir) else Path(path).name


def same_disk(one: Path, other: Path) -> bool:
    """Whether two folders lie on one file system, where a file of one can be linked into the other."""
    return os.stat(one).st_dev == os.stat(other).st_dev


def shown_source(source: str, *, policy: Policy) -> str:
    """A data source as the app shows it: a bundled dataset by its file name (where the package is installed says
    nothing, and a screenshot would carry the machine's folders); in a public demo an upload as uploads/<its name>,
    since where the server keeps its files (and the visitor key that names an upload's folder) is nobody's business.
    Other text (a path on your own machine, a Hub id, what a visitor typed) is shown as it is."""
    if not source:
        return source
    if is_bundled(source):
        return Path(source).name
    if not policy.public:
        return source
    path = Path(os.path.normpath(source))
    if path.is_absolute() and policy.uploads_dir and path.is_relative_to(policy.uploads_dir):
        return f"{UPLOADS_SHOWN}/{path.name}"
    return source


def real_source(shown: str, *, policy: Policy) -> str:
    """The data source that a shown one stands for (shown_source's inverse, for what a page or an API client sends
    back): a bundled dataset's file name is that dataset, uploads/<name> the visitor's newest upload of that name.
    Any other text is left as it is, for the data loader to judge (data.locate); on your own machine that includes a
    file of a bundled dataset's name in the folder the app runs in."""
    if not shown:
        return shown
    text = shown.strip()
    bundled = {path.name: path for path in bundled_datasets()}
    if text in bundled and (policy.public or not Path(text).is_file()):
        return str(bundled[text])
    if not policy.public:
        return shown
    folder, _, name = text.partition("/")
    own = policy.own_uploads_dir()
    if folder != UPLOADS_SHOWN or own is None or not own.is_dir() or name in ("", ".", "..") or "/" in name:
        return shown
    kept = [upload / name for upload in own.iterdir() if (upload / name).is_file()]
    return str(max(kept, key=lambda path: path.stat().st_mtime)) if kept else shown


def shown_draft(draft: Draft, *, policy: Policy) -> dict:
    """A draft as it leaves the server (the HTTP API's /recipe, the copy a browser keeps): its data source as
    shown_source shows it."""
    return _with_source(draft, shown_source, policy=policy)


def real_draft(draft: Draft, *, policy: Policy) -> dict:
    """A draft as it comes back (a browser's kept copy): its data source as the file it stands for (real_source)."""
    return _with_source(draft, real_source, policy=policy)


def _with_source(draft, change, *, policy: Policy):
    data = draft.get("data") if isinstance(draft, dict) else None
    if not isinstance(data, dict) or not isinstance(data.get("source"), str):
        return draft
    source = change(data["source"], policy=policy)
    return draft if source == data["source"] else {**draft, "data": {**data, "source": source}}
