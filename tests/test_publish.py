"""Publishing to the Hub. The Hub cannot be reached here, so the upload is checked at huggingface_hub's boundary
(HfApi.create_repo and create_commit record what they were given); the folder, the card and the adapter config
that would be uploaded are real, and "no network" is a real connection to a closed port."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import HfApi, ModelCard
from huggingface_hub.errors import HfHubHTTPError

from dragon_ui import public
from dragon_ui.cli import main
from dragon_ui.config import DEFAULT_MODEL_ID
from dragon_ui.engine import publish as hub
from dragon_ui.errors import ConfigError
from dragon_ui.public import Visitor, visiting
from dragon_ui.ui import compare_tab
from dragon_ui.studio.backend import Studio
from dragon_ui.public import LAPTOP

REPO = "someone/arith-grpo"


class FakeHub:
    """HfApi's two calls, recorded; ``refuse`` makes create_repo answer with that HTTP status."""

    def __init__(self, monkeypatch):
        self.repos, self.commits, self.refuse = [], [], None
        hub_self = self

        def create_repo(api, repo_id, **kwargs):
            hub_self.repos.append({"repo_id": repo_id, "token": api.token, **kwargs})
            if hub_self.refuse:
                response = httpx2.Response(hub_self.refuse, request=httpx2.Request("POST", "https://huggingface.co"))
                raise HfHubHTTPError(f"{hub_self.refuse} Client Error", response=response)
            return f"https://huggingface.co/{repo_id}"

        def create_commit(api, repo_id, operations, **kwargs):
            files = {op.path_in_repo: open(op.path_or_fileobj, "rb").read() for op in operations}
            hub_self.commits.append({"repo_id": repo_id, "files": files, **kwargs})

        monkeypatch.setattr(HfApi, "create_repo", create_repo)
        monkeypatch.setattr(HfApi, "create_commit", create_commit)


@pytest.fixture
def fake_hub(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return FakeHub(monkeypatch)


@pytest.fixture
def hub_run(finished_run):
    """The finished tiny run, its config naming the default model by Hub id (as a run from the offline copy does)."""
    config = json.loads(finished_run.config_path.read_text())
    config["model"]["id"] = DEFAULT_MODEL_ID
    finished_run.config_path.write_text(json.dumps(config))
    return finished_run


def test_the_adapter_goes_up_in_one_commit_with_its_card_and_a_config_that_names_the_hub_model(fake_hub, hub_run):
    published = hub.publish(hub_run, REPO, private=True, token="hf_mine", policy=LAPTOP)
    assert fake_hub.repos == [{"repo_id": REPO, "token": "hf_mine", "private": True, "repo_type": "model",
                               "exist_ok": False}]
    [commit] = fake_hub.commits
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md", "reward_curve.png",
            "tokenizer.json"} <= set(commit["files"])
    assert not {"optimizer.pt", "trainer_state.json"} & set(commit["files"])
    assert json.loads(commit["files"]["adapter_config.json"])["base_model_name_or_path"] == DEFAULT_MODEL_ID
    card = ModelCard(commit["files"]["README.md"].decode())
    assert card.data.base_model == DEFAULT_MODEL_ID and card.data.library_name == "peft"
    assert f"PeftModel.from_pretrained(base, {REPO!r})" in card.text
    assert commit["commit_message"] == f"LoRA adapter from Dragon GRPO Studio run {hub_run.id}"
    assert published.url == f"https://huggingface.co/{REPO}" and "README.md" in published.files


def test_the_merged_model_goes_up_as_a_transformers_model(fake_hub, finished_run):
    hub.publish(finished_run, REPO, merged=True, token="hf_mine", update=True, policy=LAPTOP)
    [commit] = fake_hub.commits
    assert {"config.json", "model.safetensors", "README.md", "reward_curve.png"} <= set(commit["files"])
    assert not any(name.startswith("adapter_") or name == "dragon_merge.json" for name in commit["files"])
    card = ModelCard(commit["files"]["README.md"].decode())
    assert card.data.library_name == "transformers" and f"from_pretrained({REPO!r})" in card.text
    assert fake_hub.repos[0]["exist_ok"] is True


@pytest.mark.parametrize("status, sentence", [
    (401, "did not accept this token"),
    (403, "may not write to 'someone'"),
    (409, "someone/arith-grpo already exists on the Hub; choose another name, or tick Update"),
    (500, "refused the upload to someone/arith-grpo (HTTP 500)"),
])
def test_each_refusal_of_the_hub_is_one_sentence(fake_hub, hub_run, status, sentence):
    fake_hub.refuse = status
    with pytest.raises(hub.PublishError, match=sentence.replace("(", r"\(").replace(")", r"\)")):
        hub.publish(hub_run, REPO, token="hf_mine", policy=LAPTOP)
    assert fake_hub.commits == []


def test_no_network_and_offline_mode_are_sentences_not_tracebacks(hub_run, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # as the tests run: the library refuses at once
    with pytest.raises(hub.PublishError, match="set to work offline"):
        hub.publish(hub_run, REPO, token="hf_mine", policy=LAPTOP)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: a real refusal
    with pytest.raises(hub.PublishError, match="cannot be reached from this machine"):
        hub.publish(hub_run, REPO, token="hf_mine", policy=LAPTOP)


@pytest.mark.parametrize("repo_id, problem", [
    ("arith-grpo", "give it as your-user-name/model-name"),
    ("a/b/c", "give it as your-user-name/model-name"),
    ("someone/arith--grpo", "is not valid on the Hub"),
    ("someone/arith grpo", "is not valid on the Hub"),
    ("", "give it as your-user-name/model-name"),
])
def test_a_bad_repo_name_is_refused_before_anything_is_uploaded(fake_hub, hub_run, repo_id, problem):
    with pytest.raises(ConfigError, match=problem):
        hub.publish(hub_run, repo_id, token="hf_mine", policy=LAPTOP)
    assert fake_hub.repos == []


def test_without_a_token_it_says_how_to_get_one(fake_hub, hub_run, monkeypatch):
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    with pytest.raises(ConfigError, match="No Hugging Face token: paste one .*hf auth login"):
        hub.publish(hub_run, REPO, policy=LAPTOP)
    monkeypatch.setattr("huggingface_hub.get_token", lambda: "hf_logged_in")
    hub.publish(hub_run, REPO, policy=LAPTOP)
    assert fake_hub.repos[-1]["token"] == "hf_logged_in"


def test_a_public_demo_uploads_only_with_the_visitors_own_token(fake_hub, hub_run, monkeypatch):
    monkeypatch.setenv(public.PUBLIC_ENV, "1")
    monkeypatch.setenv("HF_TOKEN", "hf_the_spaces_own")
    monkeypatch.setattr("huggingface_hub.get_token", lambda: "hf_the_spaces_own")
    with pytest.raises(ConfigError, match="never uploads with the Space's token"):
        hub.publish(hub_run, REPO, policy=public.Policy.from_env(Path("runs")))
    hub.publish(hub_run, REPO, token="hf_visitors", policy=public.Policy.from_env(Path("runs")))
    assert [repo["token"] for repo in fake_hub.repos] == ["hf_visitors"]


def test_the_compare_tab_publishes_the_visitors_own_run_only(fake_hub, hub_run, studio, monkeypatch):
    monkeypatch.setenv(public.PUBLIC_ENV, "1")
    studio = Studio(runs_dir=studio.runs_dir, policy=public.Policy.from_env(studio.runs_dir))  # as the app would start
    hub_run.update_status(owner="alice")
    kind = next(iter(compare_tab.PUBLISH_KINDS))
    with visiting(Visitor(key="bob")):
        said = compare_tab.publish(studio, hub_run.id, REPO, kind, False, False, "hf_bob")
    assert said.startswith("❌") and "belongs to another visitor" in said and fake_hub.repos == []
    with visiting(Visitor(key="alice")):
        said = compare_tab.publish(studio, hub_run.id, REPO, kind, False, False, "")
        assert "Paste your own Hugging Face token" in said
        said = compare_tab.publish(studio, hub_run.id, REPO, kind, True, False, "hf_alice")
    assert said.startswith("✅") and f"[{REPO}](https://huggingface.co/{REPO})" in said
    assert fake_hub.repos[-1]["private"] is True


def test_the_push_command(fake_hub, finished_run, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    assert main(["push", str(finished_run.path), "--repo", REPO, "--merged", "--private"]) == 0
    assert f"https://huggingface.co/{REPO}" in capsys.readouterr().out
    assert fake_hub.repos[-1] == {"repo_id": REPO, "token": "hf_from_env", "private": True, "repo_type": "model",
                                  "exist_ok": False}
    fake_hub.refuse = 409
    assert main(["push", str(finished_run.path), "--repo", REPO]) == 2
    assert "already exists on the Hub" in capsys.readouterr().err
