"""GGUF export: the file transformers' own GGUF loader reads back answers like the model it came from (tokens, logits,
greedy replies), for a trained tiny Llama run and tiny Qwen2 and Qwen3 models; the Modelfile; refusals; the command
line and the Compare tab's download."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import pytest
import torch
from conftest import handler, strengthen_adapter, turn_public_mode_on

from dragon_ui import public
from dragon_ui.cli import main
from dragon_ui.data import read_jsonl, write_jsonl
from dragon_ui.engine import gguf_export
from dragon_ui.errors import ConfigError, NotYoursError
from dragon_ui.runstore import RunDir

pytestmark = pytest.mark.timeout(300)

# How far the file's logits may be from the float32 model's, as a share of its largest logit. The file's logits must
# equal, to float32's noise, those of the model with its matrices rounded as the file stores them (compare): that
# catches a tensor out of place, such as a query not reordered for llama.cpp's RoPE. These bound the rounding itself.
# f16 keeps 11 significant bits: measured 2.4e-4 to 4.2e-4 on the three tiny models, and the greedy replies stay.
F16_TOLERANCE = 2e-3
# q8_0 stores each block of 32 weights as 8-bit steps of the block's largest: measured 0.56% (Qwen2) and 1.1% (Qwen3)
# on the hidden-size-64 models, where every matrix is q8_0; the tiny Llama run (hidden size 16) has only its 32-wide
# down projections in q8_0 (its other matrices fall back to f16) and moved by 0.03%. Three times the largest leaves
# room for other seeds and library versions.
Q8_0_TOLERANCE = 0.035

CHATML = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a tiny test model.<|im_end|>\n"
          "{% endif %}{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
          "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PROMPTS = ["What is 12 + 30? Reply with just the number.", "What is 7 + 9?", "The answer is"]


def build_chatml_model(target: Path, kind: str, tiny_model_dir: Path) -> Path:
    """A random Qwen2 (with q/k/v biases) or Qwen3 (with q/k norms) of hidden size 64, so every matrix's rows fit
    q8_0's blocks of 32, with a Qwen2 tokenizer over the tiny Llama's vocabulary and a ChatML template that, like
    Qwen2.5's, writes a system message of its own. Built in a second, unlike the tool-calling Qwen2 (which trains
    for over a minute). The Qwen3 keeps transformers' default head size, 128: its GGUF loader reads no other."""
    from tokenizers import AddedToken
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer, Qwen3Config, Qwen3ForCausalLM

    bpe = json.loads((tiny_model_dir / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    tokenizer = Qwen2Tokenizer(vocab=bpe["vocab"], merges=[tuple(merge) for merge in bpe["merges"]],
                               eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.add_tokens([AddedToken(token, special=True) for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")],
                         special_tokens=True)
    tokenizer.chat_template = CHATML
    torch.manual_seed(0)
    shape = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**shape))
        with torch.no_grad():  # biases start at zero: random ones show they are exported
            for layer in model.model.layers:
                for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    projection.bias.normal_(0, 0.02)
    else:
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=128, **shape))
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def chatml_model(request, tiny_model_dir, tmp_path_factory) -> Path:
    return build_chatml_model(tmp_path_factory.mktemp(request.param), request.param, tiny_model_dir)


def read_back(path: Path):
    """(model, tokenizer) as transformers' GGUF loader reads the file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def original(folder: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(folder)


def rounded_like_the_file(model, quant: str):
    """``model`` with each matrix rounded as the file stores it: q8_0 where a row is a whole number of blocks of 32,
    else float16 (norms and biases stay float32)."""
    with torch.no_grad():
        for weights in model.parameters():
            if weights.ndim == 2:
                kind = gguf.GGMLQuantizationType.Q8_0 if quant == "q8_0" and weights.shape[1] % 32 == 0 \
                    else gguf.GGMLQuantizationType.F16
                stored = gguf.quants.quantize(weights.numpy(), kind)
                weights.copy_(torch.from_numpy(gguf.quants.dequantize(stored, kind)))
    return model


def compare(folder: Path, path: Path, quant: str, conversations: list[list[dict]]) -> tuple[float, bool]:
    """(largest logit difference over the largest logit, whether every greedy reply is the same) of the model in
    ``folder`` and the GGUF at ``path``, on each conversation with its chat template, which both tokenizers must
    turn into the same ids. The GGUF's logits must be those of the model rounded as the file stores it: every
    tensor is in its place, Llama's query and key rows in llama.cpp's order."""
    model, tokenizer = original(folder)
    rounded = rounded_like_the_file(original(folder)[0], quant)
    exported, exported_tokenizer = read_back(path)
    worst, largest, same_replies = 0.0, 0.0, True
    for conversation in conversations:
        text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, return_tensors="pt").input_ids
        assert torch.equal(exported_tokenizer(text, return_tensors="pt").input_ids, ids)
        assert exported_tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False) == text
        with torch.inference_mode():
            logits, exported_logits = model(ids).logits, exported(ids).logits
            assert torch.allclose(exported_logits, rounded(ids).logits, atol=1e-5)
            replies = [m.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
                       for m in (model, exported)]
        worst = max(worst, (logits - exported_logits).abs().max().item())
        largest = max(largest, logits.abs().max().item())
        same_replies &= torch.equal(*replies)
    return worst / largest, same_replies


def conversations_of(prompts: list[str]) -> list[list[dict]]:
    return [[{"role": "user", "content": prompt}] for prompt in prompts]


def tensor_types(path: Path) -> dict[str, str]:
    return {tensor.name: tensor.tensor_type.name for tensor in gguf.GGUFReader(path).tensors}


def metadata(path: Path) -> dict:
    return {name: field.contents() for name, field in gguf.GGUFReader(path).fields.items()}


# ---------------------------------------------------------------------------------------------------------------
# A trained run (the tiny Llama with its adapter merged in)


def test_a_trained_run_exports_to_a_gguf_that_answers_like_its_merged_model(finished_run):
    held_out = [row["prompt"] for row in read_jsonl(finished_run.eval_data_path)][:3]
    for quant, tolerance in (("f16", F16_TOLERANCE), ("q8_0", Q8_0_TOLERANCE)):
        export = gguf_export.export_gguf(finished_run, quant)
        assert export.path == finished_run.path / "gguf" / f"{finished_run.id}-{quant}.gguf"
        assert export.size_bytes == export.path.stat().st_size > 0 and export.quant == quant
        difference, same_replies = compare(finished_run.merged_dir, export.path, quant, held_out)
        assert difference < tolerance, (quant, difference)
        assert same_replies or quant == "q8_0"
    types = tensor_types(export.path)
    assert "output.weight" not in types  # tied: llama.cpp uses the embeddings
    # q8_0 where a row is a whole number of blocks of 32 (down projections read 32), f16 elsewhere, norms in f32
    assert (types["blk.0.ffn_down.weight"], types["blk.0.attn_q.weight"], types["token_embd.weight"]) == \
        ("Q8_0", "F16", "F16")
    assert types["blk.0.attn_norm.weight"] == types["output_norm.weight"] == "F32"


def test_the_file_says_what_llama_cpp_needs(finished_run):
    export = gguf_export.export_gguf(finished_run, "f16")
    config = json.loads((finished_run.merged_dir / "config.json").read_text())
    fields = metadata(export.path)
    assert fields["general.architecture"] == "llama" and fields["general.file_type"] == gguf.LlamaFileType.MOSTLY_F16
    assert (fields["llama.context_length"], fields["llama.embedding_length"], fields["llama.block_count"],
            fields["llama.feed_forward_length"], fields["llama.attention.head_count"],
            fields["llama.attention.head_count_kv"], fields["llama.rope.dimension_count"], fields["llama.vocab_size"]) \
        == (512, 16, 2, 32, 2, 1, 8, config["vocab_size"])
    assert fields["llama.rope.freq_base"] == pytest.approx(10000.0)
    assert fields["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.pre"] == "gpt-2"
    assert len(fields["tokenizer.ggml.tokens"]) == config["vocab_size"] and fields["tokenizer.ggml.merges"]
    assert fields["tokenizer.ggml.token_type"][:2] == [gguf.TokenType.CONTROL] * 2  # <pad>, <|end|>
    assert (fields["tokenizer.ggml.eos_token_id"], fields["tokenizer.ggml.padding_token_id"]) == (1, 0)
    assert "tokenizer.ggml.bos_token_id" not in fields and fields["tokenizer.ggml.add_bos_token"] is False
    assert fields["tokenizer.chat_template"].startswith("{% for message in messages %}")


def test_an_export_is_reused_until_the_weights_change(finished_run):
    first = gguf_export.export_gguf(finished_run)
    written = first.path.stat().st_mtime_ns, first.modelfile.stat().st_mtime_ns
    again = gguf_export.export_gguf(finished_run)
    assert again == first and (again.path.stat().st_mtime_ns, again.modelfile.stat().st_mtime_ns) == written

    strengthen_adapter(finished_run)  # new weights: merged and written again
    assert gguf_export.export_gguf(finished_run).path.stat().st_mtime_ns > written[0]


def test_the_modelfile_runs_the_file_in_ollama(finished_run, chatml_model, tmp_path):
    """The tiny Llama's own template is no ChatML: Ollama takes the template stored in the file. A ChatML model
    gets Ollama's ChatML template and the system message its chat template writes, unless the run has its own."""
    export = gguf_export.export_gguf(finished_run)
    lines = export.modelfile.read_text().splitlines()
    assert export.modelfile == export.path.parent / "Modelfile"
    assert f"FROM ./{export.path.name}" in lines and 'PARAMETER stop "<|end|>"' in lines
    assert not any(line.startswith(("TEMPLATE", "SYSTEM")) for line in lines)

    rows = read_jsonl(finished_run.train_data_path)
    write_jsonl(finished_run.train_data_path, [{**row, "prompt": [{"role": "system", "content": "Just the number."},
                                                                   *row["prompt"]]} for row in rows])
    assert 'SYSTEM """Just the number."""' in gguf_export.export_gguf(finished_run).modelfile.read_text()

    path = tmp_path / "chatml-q8_0.gguf"
    gguf_export.write_gguf(chatml_model, path, "q8_0", name="chatml")
    text = gguf_export.write_modelfile(chatml_model, path, "q8_0", None).modelfile.read_text()
    assert text.startswith("# Ollama: ollama create chatml-q8_0 -f Modelfile && ollama run chatml-q8_0\n")
    assert "FROM ./chatml-q8_0.gguf\n" in text and f'TEMPLATE """{gguf_export.CHATML_TEMPLATE}"""' in text
    assert 'SYSTEM """You are a tiny test model."""' in text
    assert 'PARAMETER stop "<|im_start|>"\nPARAMETER stop "<|im_end|>"\n' in text
    own = gguf_export.write_modelfile(chatml_model, path, "q8_0", 'Say """hi""".').modelfile.read_text()
    assert 'SYSTEM """Say "hi"."""' in own and "tiny test model" not in own


# ---------------------------------------------------------------------------------------------------------------
# Qwen2 and Qwen3


def test_qwen_models_export_with_their_biases_and_norms(chatml_model, tmp_path):
    conversations = conversations_of(PROMPTS)
    for quant, tolerance in (("f16", F16_TOLERANCE), ("q8_0", Q8_0_TOLERANCE)):
        path = tmp_path / f"model-{quant}.gguf"
        gguf_export.write_gguf(chatml_model, path, quant, name="model")
        difference, same_replies = compare(chatml_model, path, quant, conversations)
        assert difference < tolerance, (quant, difference)
        assert same_replies or quant == "q8_0"
    types = tensor_types(path)
    arch = json.loads((chatml_model / "config.json").read_text())["model_type"]
    assert metadata(path)["general.architecture"] == arch and metadata(path)["tokenizer.ggml.pre"] == "qwen2"
    assert "output.weight" not in types and types["token_embd.weight"] == types["blk.1.ffn_down.weight"] == "Q8_0"
    own = {"qwen2": ["blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias"],
           "qwen3": ["blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"]}[arch]
    assert all(types[name] == "F32" for name in own)


# ---------------------------------------------------------------------------------------------------------------
# What is refused, and the rules behind the tokenizer and RoPE


def test_other_architectures_are_refused_before_any_merge(finished_run, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path / "tiny-gpt2"
    GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=64, n_positions=32)).save_pretrained(folder)
    sentence = ("GGUF export covers Llama and Qwen2/Qwen3 models; this run's model is a GPT2LMHeadModel: merge it "
                "(dragon merge) and convert it with llama.cpp's convert_hf_to_gguf.py.")
    with pytest.raises(ConfigError) as refused:
        gguf_export.write_gguf(folder, tmp_path / "gpt2.gguf", "f16", name="gpt2")
    assert str(refused.value) == sentence and not (tmp_path / "gpt2.gguf").exists()

    config = json.loads(finished_run.config_path.read_text())
    config["model"]["id"] = str(folder)
    finished_run.config_path.write_text(json.dumps(config))
    with pytest.raises(ConfigError) as refused:
        gguf_export.export_gguf(finished_run)
    assert str(refused.value) == sentence and not finished_run.merged_dir.exists()


def test_an_unknown_precision_is_refused(finished_run):
    with pytest.raises(ConfigError, match=r"GGUF precision must be q8_0 \(smaller, the default\) or f16; 'q4_k' is"):
        gguf_export.export_gguf(finished_run, "q4_k")
    assert not finished_run.merged_dir.exists()


def test_a_tokenizer_that_is_not_byte_level_bpe_is_refused(tiny_model_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    described = json.loads((folder / "tokenizer.json").read_text())
    described["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    (folder / "tokenizer.json").write_text(json.dumps(described))
    with pytest.raises(ConfigError, match="writes GPT-2 style byte-level BPE tokenizers .* decodes with Metaspace"):
        gguf_export.write_gguf(folder, tmp_path / "model.gguf", "f16", name="model")


@pytest.mark.parametrize("pre_tokenizer, vocab, name", [
    ({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": gguf_export.QWEN2_SPLIT}},
                                            {"type": "ByteLevel", "use_regex": False}]}, {}, "qwen2"),
    ({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": gguf_export.LLAMA3_SPLIT}},
                                            {"type": "ByteLevel", "use_regex": False}]}, {}, "llama-bpe"),
    ({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                            {"type": "ByteLevel", "use_regex": True}]}, {"1": 0, "Ġa": 1}, "smollm"),
    ({"type": "ByteLevel", "use_regex": True}, {"1": 0, "Ġa": 1}, "smollm"),  # SmolLM2 as transformers 5 saves it
    ({"type": "ByteLevel", "use_regex": True}, {"1": 0, "12": 1}, "gpt-2"),
])
def test_the_pre_tokenizer_is_named_as_llama_cpp_names_it(pre_tokenizer, vocab, name):
    assert gguf_export.pre_tokenizer_name({"pre_tokenizer": pre_tokenizer, "model": {"vocab": vocab}}) == name


def test_llama3_rope_factors_match_transformers_scaling():
    """llama.cpp divides each RoPE frequency by its factor: the factors are the unscaled frequencies over the ones
    transformers computes for Llama 3's scaling."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    config = LlamaConfig(hidden_size=128, num_attention_heads=2, rope_parameters=rope, max_position_embeddings=131072)
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    unscaled = 1.0 / (500000.0 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
    factors = gguf_export.llama3_rope_factors(config.to_dict())
    assert factors[0] == 1.0 and factors[-1] == 32.0
    assert torch.allclose(factors, unscaled / scaled, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# The command line and the Compare tab


def test_export_gguf_command(finished_run, tmp_path, capsys):
    target = tmp_path / "take-home"
    assert main(["export-gguf", str(finished_run.path), "--quant", "f16", "--to", str(target)]) == 0
    out = capsys.readouterr().out
    path = target / f"{finished_run.id}-f16.gguf"
    name = f"{finished_run.id}-f16".lower()
    for piece in (str(path), str(target / "Modelfile"), "the final adapter", "GGUF f16",
                  gguf_export.format_size(path.stat().st_size),
                  f"cd {target} && ollama create {name} -f Modelfile && ollama run {name}",
                  f"llama-cli -m {path} -cnv"):
        assert piece in out, piece
    read_back(path)

    assert main(["export-gguf", str(tmp_path / "no-such-run")]) == 2
    assert "not a run folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse's own refusal of a precision it does not offer
        main(["export-gguf", str(finished_run.path), "--quant", "q4_k"])


def test_the_compare_tab_hands_out_the_file_and_its_modelfile(finished_run, runs_dir):
    import gradio as gr

    from dragon_ui.public import LAPTOP
    from dragon_ui.studio.backend import Studio
    from dragon_ui.ui import build_app

    app = build_app(Studio(runs_dir=runs_dir, policy=LAPTOP))
    files, status = handler(app, "compare_gguf")(finished_run.id, "f16")
    assert files == [str(finished_run.path / "gguf" / f"{finished_run.id}-f16.gguf"),
                     str(finished_run.path / "gguf" / "Modelfile")]
    assert f"{finished_run.id}-f16.gguf" in status and "ollama create" in status and "llama-cli" in status
    with pytest.raises(gr.Error, match="Choose a run first"):
        handler(app, "compare_gguf")("", "q8_0")
    with pytest.raises(gr.Error, match="GGUF precision must be q8_0"):
        handler(app, "compare_gguf")(finished_run.id, "q2_k")


def test_a_public_demo_hands_the_gguf_to_its_owner_only_and_counts_it(monkeypatch, tiny_model_dir, runs_dir,
                                                                        finished_run):
    """Another visitor is refused; the owner gets copies of her own (both counted against her share of the disk),
    and the sentence names no folder of the server's."""
    from dragon_ui.errors import BusyError
    from dragon_ui.studio import compare
    from dragon_ui.studio.backend import Studio

    turn_public_mode_on(monkeypatch, tiny_model_dir)
    monkeypatch.setenv("DRAGON_UI_MAX_DISK_FILES", "2")
    studio = Studio(runs_dir=runs_dir, policy=public.Policy.from_env(runs_dir))
    RunDir(finished_run.path).update_status(owner="alice")
    with public.visiting(public.Visitor(key="bob", address="bobs-address")), pytest.raises(NotYoursError):
        compare.gguf_download(studio, finished_run.id, "q8_0")
    assert not (finished_run.path / "gguf").exists()
    with public.visiting(public.Visitor(key="alice", address="alices-address")):
        files, said = compare.gguf_download(studio, finished_run.id, "q8_0")
        assert [Path(file).name for file in files] == [f"{finished_run.id}-q8_0.gguf", "Modelfile"]
        assert all(Path(file).parent.parent == studio.files.downloads_dir for file in files)
        assert str(runs_dir) not in said
        with pytest.raises(BusyError, match="share of 2 files"):  # the two files took her share
            compare.gguf_download(studio, finished_run.id, "q8_0")


@pytest.mark.parametrize("system, written", [
    ('Say """hi""".', 'Say "hi".'),
    ('a"""""b', 'a"b'),  # no run of three quotes is left to close the block
    ('He said "go"', ' He said "go" '),  # a quote at the end would join the closing ones
    ('"""\nFROM other-model\nSYSTEM """', ' "\nFROM other-model\nSYSTEM " '),
])
def test_a_system_message_cannot_end_the_modelfiles_block(system, written):
    """A data file's system message is the run's: it must not end SYSTEM's triple quotes and add lines of its own."""
    assert gguf_export._quoted(system) == written


def test_a_public_demo_refuses_a_gguf_no_share_could_hold_before_any_work(monkeypatch, tiny_model_dir, runs_dir,
                                                                         finished_run):
    """On a Space whose runs lie on its persistent disk, a download is a copy counted against the visitor's share:
    a file larger than the whole share is refused in a sentence, before minutes of merging and converting."""
    from dragon_ui.errors import BusyError
    from dragon_ui.studio import compare, files
    from dragon_ui.studio.backend import Studio

    turn_public_mode_on(monkeypatch, tiny_model_dir)
    monkeypatch.setenv("DRAGON_UI_MAX_DISK_MB", "1")
    studio = Studio(runs_dir=runs_dir, policy=public.Policy.from_env(runs_dir))
    RunDir(finished_run.path).update_status(owner="alice")
    monkeypatch.setattr(gguf_export, "expected_bytes", lambda run, quant: 3 * 2**20)
    monkeypatch.setattr(files, "same_disk", lambda one, other: False)
    with public.visiting(public.Visitor(key="alice", address="alices-address")):
        with pytest.raises(BusyError, match=r"The GGUF file of this run would be about 3 MB, more than this public "
                                            r"demo hands one visitor \(1 MB per"):
            compare.gguf_download(studio, finished_run.id, "q8_0")
        assert not (finished_run.path / "gguf").exists() and not (finished_run.path / "merged").exists()
        monkeypatch.setattr(files, "same_disk", lambda one, other: True)  # a link costs nothing: handed out
        assert len(compare.gguf_download(studio, finished_run.id, "q8_0")[0]) == 2


def test_the_expected_size_is_the_weights_at_the_precision(finished_run):
    from dragon_ui.engine.estimate import model_dims

    params = model_dims(finished_run.read_config().model.id)[0].params
    assert gguf_export.expected_bytes(finished_run, "f16") == 2 * params
    assert gguf_export.expected_bytes(finished_run, "q8_0") == int(params * 34 / 32)
