"""Publish a run's trained weights to the Hugging Face Hub: the adapter (loads with peft on the Hub model it names)
or the merged full model, each with its model card, in one commit through ``huggingface_hub``.

Every way it can fail is one sentence: no token, no network, a name that is taken or not valid, a token that may
not write there. In a public demo only the visitor's own token is used, never the Space's (policy in this module,
so the app, the API and the CLI all get it).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, DragonError
from ..public import Policy
from ..runstore import RunDir
from . import weights
from .model_card import CARD_FILE, write_model_card

TOKEN_HELP = "create one with write access at https://huggingface.co/settings/tokens"


class PublishError(DragonError):
    """The Hub refused the upload or could not be reached; the message says which and what to do."""


@dataclass(frozen=True)
class Published:
    url: str
    repo_id: str
    files: list[str]
    merged: bool


def publish(run: RunDir, repo_id: str, merged: bool = False, private: bool = False, token: str | None = None,
            update: bool = False, *, policy: Policy) -> Published:
    """Upload the run's newest adapter (or, with ``merged``, the merged full model) to ``repo_id``. The repo is
    created; one that exists already is refused unless ``update`` (a new commit on top of it)."""
    from huggingface_hub import CommitOperationAdd, HfApi

    repo_id = check_repo_id(repo_id)
    token = _token(token, policy=policy)
    api = HfApi(token=token)
    with tempfile.TemporaryDirectory(prefix="dragon-publish-") as staging:
        if merged:
            folder = weights.merge_model(run)
            write_model_card(run, Path(staging), merged=True, repo_id=repo_id)  # its snippets name the repo
            files = {path.relative_to(folder).as_posix(): path for path in weights.model_files(folder)
                     if path.name not in {CARD_FILE, weights.MERGE_MARKER}}
            files.update({path.name: path for path in Path(staging).iterdir()})
        else:
            files = {path.name: path for path in weights.export_adapter(run, weights.adapter_weights(run),
                                                                        Path(staging), repo_id=repo_id)}
        what = "merged model" if merged else "LoRA adapter"
        with _in_words(repo_id):
            url = api.create_repo(repo_id, private=private, repo_type="model", exist_ok=update)
            api.create_commit(repo_id, [CommitOperationAdd(name, str(path)) for name, path in sorted(files.items())],
                              commit_message=f"{what} from Dragon GRPO Studio run {run.id}", repo_type="model")
    return Published(url=str(url), repo_id=repo_id, files=sorted(files), merged=merged)


def check_repo_id(repo_id: str) -> str:
    """``owner/name`` as the Hub accepts it, or a sentence saying what is wrong with it."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    repo_id = (repo_id or "").strip()
    if repo_id.count("/") != 1:
        raise ConfigError(f"Repo name {repo_id!r}: give it as your-user-name/model-name (or organisation/model-name).")
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise ConfigError(f"Repo name {repo_id!r} is not valid on the Hub: use letters, digits, '-', '_' and '.', "
                          "at most 96 characters, and no '--' or '..'.") from None
    return repo_id


def _token(token: str | None, *, policy: Policy) -> str:
    """The token to upload with: the one given, else (not in a public demo) the one this machine is logged in with."""
    from huggingface_hub import get_token

    token = (token or "").strip()
    if token:
        return token
    if policy.public:
        raise ConfigError(f"Paste your own Hugging Face token to publish ({TOKEN_HELP}): this public demo never "
                          "uploads with the Space's token.")
    found = get_token()
    if not found:
        raise ConfigError(f"No Hugging Face token: paste one ({TOKEN_HELP}), or log this machine in with "
                          "`hf auth login`.")
    return found


@contextlib.contextmanager
def _in_words(repo_id: str) -> Iterator[None]:
    """Turn what huggingface_hub raises into one sentence about the cause."""
    from huggingface_hub.errors import HfHubHTTPError, HTTPError, OfflineModeIsEnabled

    try:
        yield
    except OfflineModeIsEnabled:
        raise PublishError("Publishing needs the Hugging Face Hub, but this machine is set to work offline "
                           "(HF_HUB_OFFLINE); unset it and try again.") from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        sentences = {
            401: f"The Hub did not accept this token (mistyped, expired or revoked); {TOKEN_HELP}.",
            403: f"This token may not write to {repo_id.split('/')[0]!r}: use a token with write access to that "
                 "account or organisation (a fine-grained token needs it named).",
            409: f"{repo_id} already exists on the Hub; choose another name, or tick Update to add a new version "
                 "to it.",
        }
        raise PublishError(sentences.get(status, f"The Hub refused the upload to {repo_id} "
                                                 f"(HTTP {status}): {str(exc).splitlines()[0]}")) from None
    except HTTPError:
        raise PublishError("The Hugging Face Hub cannot be reached from this machine (no network, or a proxy "
                           "in the way); the trained weights stay here: zip or merge them to carry them.") from None
