"""The files the app hands out and takes in: downloads, uploads, and the paths it shows.

On your own machine they are simply paths. In a public demo they are where visitors could reach each other's
things or the server's, so each upload moves into its visitor's own folder, a download is a copy in a folder of its
own, and a path is shown from the runs folder on.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path

from ..errors import ConfigError
from ..public import is_own_upload, own_uploads_dir

UPLOADS_KEPT = 3  # a visitor's newest uploads in a public demo; an older one goes when a new one arrives


class Files:
    """Downloads, uploads and shown paths for the app serving ``runs_dir``, in a public demo when ``public``."""

    def __init__(self, runs_dir: Path, public: bool) -> None:
        self.runs_dir = runs_dir
        self.public = public

    @property
    def downloads_dir(self) -> Path:
        """Where files made to be downloaded go (configs, exports, copies of a run's files), each in a folder of
        its own; a public demo removes them after an hour."""
        folder = Path(tempfile.gettempdir()) / "dragon-downloads"
        folder.mkdir(exist_ok=True)
        return folder

    def new_folder(self) -> Path:
        """A new, empty folder for one download."""
        return Path(tempfile.mkdtemp(dir=self.downloads_dir))

    def handed_out(self, path: Path) -> str:
        """A file of a run to hand to its owner's browser: the file itself where the runs folder is served (your
        own machine); in a public demo, where it is not, a link to it (or a copy) in a new temporary folder, which
        the server then hands to that browser alone."""
        if not self.public:
            return str(path)
        target = self.new_folder() / Path(path).name
        try:
            os.link(path, target)  # no copy of a large model where the folders share a disk
        except OSError:
            shutil.copy2(path, target)
        return str(target)

    def keep_upload(self, uploaded: str | Path, upload_folder: str | Path) -> str:
        """The data source an upload becomes. In a public demo the file moves out of gradio's upload folder (which
        gradio serves to anyone who knows a file's address) into the visitor's own folder, which nothing serves
        and only that visitor's runs may read (public.is_own_upload); elsewhere it stays where gradio put it.

        ``uploaded`` must lie in ``upload_folder``: an event can be sent with any path."""
        uploaded = Path(uploaded).resolve()
        folder = Path(upload_folder).resolve()
        if not uploaded.is_file() or not uploaded.is_relative_to(folder):
            raise ConfigError("That file was not uploaded here; upload it again.")
        if not self.public:
            return str(uploaded)
        own = own_uploads_dir()
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
        if uploaded.parent != folder:  # gradio keeps each upload in a folder of its own
            shutil.rmtree(uploaded.parent, ignore_errors=True)
        return str(target)

    def discard_upload(self, source: str) -> None:
        """Remove an upload kept in a public demo that turned out unreadable: it is no use, and takes room."""
        path = Path(source)
        if self.public and is_own_upload(path.resolve()) and path.parent.parent == own_uploads_dir():
            shutil.rmtree(path.parent, ignore_errors=True)

    def shown_path(self, path: Path) -> str:
        """A path of the runs folder as the app shows it: whole on your own machine; in a public demo from the runs
        folder on, since where the server keeps its files is nobody's business."""
        if not self.public:
            return str(path)
        return str(Path(path).resolve().relative_to(self.runs_dir)) if Path(path).resolve().is_relative_to(
            self.runs_dir) else Path(path).name
