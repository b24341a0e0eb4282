"""The trained model as one GGUF file, the format llama.cpp, Ollama and LM Studio run, with an Ollama Modelfile.

The file is written with the ``gguf`` package's GGUFWriter the way llama.cpp's ``convert_hf_to_gguf.py`` writes the
architectures the presets use: Llama (SmolLM2 is one), Qwen2 and Qwen3. That converter is not a package (it lives in
llama.cpp's source tree and pins its own transformers), so the few rules these architectures need are kept here:
the hyperparameters, the tensor names (gguf's own name map), Llama's reordering of the query and key rows for
llama.cpp's rotary embedding, the byte-level BPE tokenizer with its merges, special tokens and chat template, and
which tensors are quantized. Any other architecture or tokenizer is refused with a sentence saying what to use.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import gguf

from ..errors import ConfigError
from ..runstore import RunDir
from ..system.disk import replaced_atomically
from .trained import shared_system_message, trained_weights
from .weights import format_size, merge_model, newest_change

if TYPE_CHECKING:
    from collections.abc import Iterator

    import numpy as np
    import torch

log = logging.getLogger(__name__)

# Each precision's type for the weight matrices and the file type it is named by; q8_0, the default, is half the size
# of f16 and answers almost exactly alike (docs/reference.md has the differences measured).
QUANTS = {"q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
          "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16)}
ARCHITECTURES = {"LlamaForCausalLM": gguf.MODEL_ARCH.LLAMA, "Qwen2ForCausalLM": gguf.MODEL_ARCH.QWEN2,
                 "Qwen3ForCausalLM": gguf.MODEL_ARCH.QWEN3}
MODELFILE = "Modelfile"
REFUSAL_HINT = "merge it (dragon merge) and convert it with llama.cpp's convert_hf_to_gguf.py"

# The regular expressions that split text before the merges, by llama.cpp's name for them (tokenizer.ggml.pre).
QWEN2_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                r"|\s+(?!\S)|\s+")
KNOWN_SPLITS = {QWEN2_SPLIT: "qwen2", LLAMA3_SPLIT: "llama-bpe"}

# Ollama's ChatML template (as its qwen2.5 and smollm2 models have it, without tools): the chat template of SmolLM2,
# Qwen2.5 and Qwen3, and of any model whose template writes <|im_start|>.
CHATML_MARK = "<|im_start|>"
CHATML_TEMPLATE = """{{- if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}
{{- range $i, $_ := .Messages }}
{{- if or (eq .Role "user") (eq .Role "assistant") }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}
{{- if and (eq (len (slice $.Messages $i)) 1) (ne .Role "assistant") }}<|im_start|>assistant
{{ end }}
{{- end }}"""
CHATML_STOPS = ("<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class GgufExport:
    """A model written as GGUF: the file, its size and precision, and the Ollama Modelfile beside it that runs it."""

    path: Path
    modelfile: Path
    size_bytes: int
    quant: str
    ollama_name: str  # what `ollama create` calls it


def expected_bytes(run: RunDir, quant: str) -> int:
    """About how large the run's GGUF file will be: its weights at the precision's bytes per weight (q8_0 keeps 34
    bytes for each 32 weights), known before minutes of merging and converting."""
    from .estimate import model_dims

    dims, _ = model_dims(run.read_config().model.id)
    return int(dims.params * (34 / 32 if quant == "q8_0" else 2))


def check_quant(quant: str) -> None:
    """Refuse a precision this export does not write (any client can send any value)."""
    if not isinstance(quant, str) or quant not in QUANTS:
        raise ConfigError(f"GGUF precision must be q8_0 (smaller, the default) or f16; {quant!r} is neither.")


def export_gguf(run: RunDir, quant: str = "q8_0", target_dir: str | Path | None = None) -> GgufExport:
    """The run's trained model (merged: merge_model) as ``<run id>-<quant>.gguf`` with a Modelfile, in
    ``target_dir`` (default ``<run>/gguf``). A file written after the merge it comes from is reused; the Modelfile
    always runs the file just returned."""
    check_quant(quant)
    refuse_unless_covered(starting_architecture(run))
    folder = merge_model(run)
    target = Path(target_dir).expanduser().resolve() if target_dir else run.gguf_dir
    path = target / f"{run.id}-{quant}.gguf"
    system = shared_system_message(run)
    with _EXPORTING:  # one export at a time: two would write the same files
        if not path.is_file() or path.stat().st_mtime_ns < newest_change(folder):
            write_gguf(folder, path, quant, name=run.id)
            log.info("Wrote %s of run %s as GGUF %s: %s", trained_weights(run).label, run.id, quant, path)
        return write_modelfile(folder, path, quant, system[0]["content"] if system else None)


_EXPORTING = threading.Lock()


def starting_architecture(run: RunDir) -> str:
    """The model class of what the run trained (``architectures`` in its config.json), read before any merge: a
    merge of a model that GGUF export does not cover would take minutes for nothing."""
    from transformers import AutoConfig

    from .models import resolve_model

    weights = trained_weights(run)
    if weights.is_adapter:
        model = resolve_model(run.read_config().model)
        config = AutoConfig.from_pretrained(model.path, revision=model.revision, local_files_only=model.local_files_only,
                                            trust_remote_code=model.trust_remote_code)
    else:
        config = AutoConfig.from_pretrained(weights.path)
    return (config.architectures or [type(config).__name__])[0]


def refuse_unless_covered(architecture: str) -> None:
    if architecture not in ARCHITECTURES:
        raise ConfigError(f"GGUF export covers Llama and Qwen2/Qwen3 models; this run's model is a {architecture}: "
                          f"{REFUSAL_HINT}.")


def write_gguf(folder: Path, path: Path, quant: str, name: str) -> None:
    """Write the model in ``folder`` (a transformers model folder) to ``path`` as GGUF, atomically. The tensors go
    through a temporary file one at a time, so the memory needed is one tensor's, not the model's."""
    check_quant(quant)
    hparams = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    architecture = (hparams.get("architectures") or ["model with no architecture in its config.json"])[0]
    refuse_unless_covered(architecture)
    arch = ARCHITECTURES[architecture]
    weight_type, file_type = QUANTS[quant]
    with replaced_atomically(path) as staging:
        writer = gguf.GGUFWriter(staging, gguf.MODEL_ARCH_NAMES[arch], use_temp_file=True)
        writer.add_type(gguf.GGUFType.MODEL)
        writer.add_name(name)
        _add_hyperparameters(writer, hparams, arch, file_type)
        _add_tokenizer(writer, folder, hparams["vocab_size"])
        for tensor_name, data in _tensors(folder, hparams, arch):
            stored, stored_type = _stored(tensor_name, data, weight_type)
            writer.add_tensor(tensor_name, stored, raw_dtype=stored_type)
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()


def _rope(hparams: dict) -> dict:
    """The RoPE settings, where transformers 5 keeps them (``rope_parameters``) or where older configs did."""
    rope = dict(hparams.get("rope_parameters") or hparams.get("rope_scaling") or {})
    rope.setdefault("rope_theta", hparams.get("rope_theta", 10000.0))
    rope.setdefault("rope_type", rope.get("type", "default"))
    return rope


def _head_dim(hparams: dict) -> int:
    return hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]


def _add_hyperparameters(writer: gguf.GGUFWriter, hparams: dict, arch: gguf.MODEL_ARCH,
                         file_type: gguf.LlamaFileType) -> None:
    """The model's shape, as llama.cpp's converter writes it for these architectures."""
    rope = _rope(hparams)
    if rope["rope_type"] not in ("default", "linear", "llama3") or (rope["rope_type"] == "llama3"
                                                                     and arch != gguf.MODEL_ARCH.LLAMA):
        raise ConfigError(f"GGUF export writes models without RoPE scaling, or with linear or Llama 3 scaling; this "
                          f"model scales RoPE by {rope['rope_type']!r}: {REFUSAL_HINT}.")
    writer.add_context_length(hparams["max_position_embeddings"])
    writer.add_embedding_length(hparams["hidden_size"])
    writer.add_block_count(hparams["num_hidden_layers"])
    writer.add_feed_forward_length(hparams["intermediate_size"])
    writer.add_head_count(hparams["num_attention_heads"])
    writer.add_head_count_kv(hparams.get("num_key_value_heads") or hparams["num_attention_heads"])
    writer.add_rope_freq_base(rope["rope_theta"])
    if rope["rope_type"] == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    writer.add_layer_norm_rms_eps(hparams["rms_norm_eps"])
    writer.add_rope_dimension_count(_head_dim(hparams))
    if hparams.get("head_dim"):
        writer.add_key_length(hparams["head_dim"])
        writer.add_value_length(hparams["head_dim"])
    writer.add_vocab_size(hparams["vocab_size"])
    writer.add_file_type(file_type)


def _add_tokenizer(writer: gguf.GGUFWriter, folder: Path, vocab_size: int) -> None:
    """The tokenizer as llama.cpp reads a GPT-2 style byte-level BPE: every token and its kind (an id the tokenizer
    lacks as ``[PADn]``), the merges, the special tokens, whether BOS and EOS are added, and the chat template."""
    from transformers import AutoTokenizer

    described = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")) \
        if (folder / "tokenizer.json").is_file() else {}
    kind = (described.get("decoder") or {}).get("type") or "not in a tokenizer.json"
    if (described.get("model") or {}).get("type") != "BPE" or kind != "ByteLevel":
        raise ConfigError(f"GGUF export writes GPT-2 style byte-level BPE tokenizers (SmolLM2's, Qwen's, Llama 3's); "
                          f"this model's tokenizer decodes with {kind}: {REFUSAL_HINT}.")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokens, token_types = _vocabulary(tokenizer, vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer_name(described))
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=vocab_size)
    # What the tokenizer does, not what its config files say: llama.cpp adds a BOS to a BPE vocabulary unless told
    # not to, and transformers 5 writes no add_bos_token for most tokenizers.
    ids = tokenizer("x")["input_ids"]
    special.add_special_token = {"bos": tokenizer.bos_token_id is not None and ids[:1] == [tokenizer.bos_token_id],
                                 "eos": tokenizer.eos_token_id is not None and ids[-1:] == [tokenizer.eos_token_id]}
    special.chat_template = tokenizer.chat_template
    special.add_to_gguf(writer, quiet=True)


def _vocabulary(tokenizer, vocab_size: int) -> tuple[list[str], list[gguf.TokenType]]:
    """Each id's token and kind (llama.cpp's ``get_vocab_base``): added special tokens, and ones spelled like
    ``<|...|>``, are control tokens; other added tokens (``<think>``) user-defined; ids the tokenizer lacks unused."""
    by_id = {token_id: token for token, token_id in tokenizer.get_vocab().items()}
    if max(by_id) >= vocab_size:
        raise ConfigError(f"The tokenizer has ids up to {max(by_id)} but the model embeds only {vocab_size} tokens: "
                          "this folder's tokenizer and weights do not belong together.")
    added = tokenizer.added_tokens_decoder
    tokens, token_types = [], []
    for token_id in range(vocab_size):
        token = by_id.get(token_id)
        if token is None:
            tokens.append(f"[PAD{token_id}]")
            token_types.append(gguf.TokenType.UNUSED)
        elif token_id in added:
            tokens.append(token)
            control = added[token_id].special or (token.startswith("<|") and token.endswith("|>"))
            token_types.append(gguf.TokenType.CONTROL if control else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(token)
            token_types.append(gguf.TokenType.NORMAL)
    return tokens, token_types


def pre_tokenizer_name(described: dict) -> str:
    """llama.cpp's name (``tokenizer.ggml.pre``) for how a tokenizer splits text before its merges.

    llama.cpp's converter recognises a tokenizer by hashing the ids it gives a test text, which names only
    tokenizers it has seen. Here the rules are read from ``tokenizer.json`` (``described``) instead: Qwen's and
    Llama 3's regular expressions by name; else GPT-2's (ByteLevel's own), to which SmolLM adds a split of every
    digit: "smollm" when the vocabulary has no token joining a digit to anything (the split's mark; transformers 5
    saves SmolLM2's tokenizer without its Digits step), else "gpt-2", llama.cpp's name for GPT-2's rules and the
    closest documented default for a byte-level BPE it does not know.
    """
    steps = described.get("pre_tokenizer") or {}
    steps = steps.get("pretokenizers", [steps]) if steps.get("type") == "Sequence" else [steps]
    for step in steps:
        if step.get("type") == "Split" and (step.get("pattern") or {}).get("Regex") in KNOWN_SPLITS:
            return KNOWN_SPLITS[step["pattern"]["Regex"]]
    vocabulary = (described.get("model") or {}).get("vocab") or {}
    digits_alone = not any(len(token) > 1 and re.search(r"\d", token) for token in vocabulary)
    return "smollm" if digits_alone else "gpt-2"


def _tensors(folder: Path, hparams: dict, arch: gguf.MODEL_ARCH) -> Iterator[tuple[str, torch.Tensor]]:
    """(GGUF name, float32 tensor) for each tensor of the model's safetensors files, as llama.cpp stores them."""
    import torch
    from safetensors import safe_open

    names = gguf.get_tensor_name_map(arch, hparams["num_hidden_layers"])
    tied = hparams.get("tie_word_embeddings", False)
    heads = hparams["num_attention_heads"]
    kv_heads = hparams.get("num_key_value_heads") or heads
    if _rope(hparams)["rope_type"] == "llama3":
        yield gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", llama3_rope_factors(hparams)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{folder} has no .safetensors weights to convert; save the model with safetensors.")
    for file in files:
        with safe_open(file, framework="pt") as weights:
            for name in weights.keys():
                if name.endswith(".rotary_emb.inv_freq") or (tied and name == "lm_head.weight"):
                    continue  # recomputed by llama.cpp; a tied output layer is the embeddings
                data = weights.get_tensor(name).to(torch.float32)
                if arch == gguf.MODEL_ARCH.LLAMA and name.endswith(("q_proj.weight", "q_proj.bias")):
                    data = permute_for_rope(data, heads)
                elif arch == gguf.MODEL_ARCH.LLAMA and name.endswith(("k_proj.weight", "k_proj.bias")):
                    data = permute_for_rope(data, kv_heads)
                gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
                if gguf_name is None:
                    raise ConfigError(f"The model has a tensor GGUF has no name for ({name}): {REFUSAL_HINT}.")
                yield gguf_name, data


def permute_for_rope(weights: torch.Tensor, heads: int) -> torch.Tensor:
    """Llama's query or key rows reordered for llama.cpp, whose rotary embedding pairs each head's dimension i with
    i + 1 where transformers pairs it with i + head_dim / 2 (convert_hf_to_gguf.py's LlamaModel.permute)."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def llama3_rope_factors(hparams: dict) -> torch.Tensor:
    """Llama 3's RoPE scaling as llama.cpp takes it: one factor per frequency, each frequency divided by its own
    (``rope_freqs.weight``; convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors)."""
    import torch

    rope = _rope(hparams)
    dim = _head_dim(hparams)
    frequencies = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    context = rope.get("original_max_position_embeddings", 8192)
    factors = []
    for frequency in frequencies.tolist():
        wavelength = 2 * math.pi / frequency
        if wavelength < context / high:
            factors.append(1.0)
        elif wavelength > context / low:
            factors.append(factor)
        else:
            smooth = (context / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(factors, dtype=torch.float32)


def _stored(name: str, data: torch.Tensor,
            weight_type: gguf.GGMLQuantizationType) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """(the bytes or floats written, their GGML type): norms, biases and other 1-D tensors stay float32 as llama.cpp
    keeps them; a matrix goes to ``weight_type``, and to float16 where Q8_0 cannot take it (a row length that is
    not a multiple of its block of 32)."""
    array = data.numpy()
    if array.ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        kind = gguf.GGMLQuantizationType.F32
    else:
        kind = weight_type
    try:
        return gguf.quants.quantize(array, kind), kind
    except gguf.QuantError:
        return gguf.quants.quantize(array, gguf.GGMLQuantizationType.F16), gguf.GGMLQuantizationType.F16


def write_modelfile(folder: Path, path: Path, quant: str, system: str | None) -> GgufExport:
    """Write the Ollama Modelfile that runs ``path`` beside it (only when its text changes) and describe the
    export. ``system``: the run's system message, which Ollama then sends unless a chat brings its own."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    ollama_name = path.stem.lower()
    lines = [f"# Ollama: ollama create {ollama_name} -f {MODELFILE} && ollama run {ollama_name}",
             f"FROM ./{path.name}"]
    template = tokenizer.chat_template or ""
    if CHATML_MARK in template:
        system = system or chatml_default_system(tokenizer)
        lines.append(f'TEMPLATE """{CHATML_TEMPLATE}"""')
        stops = list(CHATML_STOPS)
    else:  # Ollama picks its known template closest to the one in the file (tokenizer.chat_template)
        stops = [tokenizer.eos_token] if tokenizer.eos_token else []
    if system:
        lines.append(f'SYSTEM """{_quoted(system)}"""')
    lines += [f'PARAMETER stop "{stop}"' for stop in stops]
    modelfile = path.parent / MODELFILE
    text = "\n".join(lines) + "\n"
    if not modelfile.is_file() or modelfile.read_text(encoding="utf-8") != text:
        with replaced_atomically(modelfile) as staging:
            staging.write_text(text, encoding="utf-8")
    return GgufExport(path, modelfile, path.stat().st_size, quant, ollama_name)


def _quoted(text: str) -> str:
    """Text for a Modelfile's triple quotes, which cannot hold three quotes in a row, nor begin or end with one (it
    would join the closing ones): a data file's system message must not end the block and add lines of its own."""
    text = re.sub(r'"{3,}', '"', text)
    return f" {text} " if text.startswith('"') or text.endswith('"') else text


def chatml_default_system(tokenizer) -> str | None:
    """The system message a ChatML template writes when a chat has none (Qwen2.5's "You are Qwen…", SmolLM2's):
    training saw it in every prompt without a system message of its own, so Ollama should send it too."""
    mark = "\x00user\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": mark}], tokenize=False,
                                         add_generation_prompt=True)
    found = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", text.split(mark)[0], re.DOTALL)
    return found.group(1) if found else None


def run_commands(export: GgufExport, folder: Path | None = None) -> tuple[str, str]:
    """(Ollama's, llama.cpp's): the commands that run the export, typed anywhere when ``folder`` says where its
    files are, else in the folder they were downloaded to."""
    model = folder / export.path.name if folder else export.path.name
    ollama = f"ollama create {export.ollama_name} -f {MODELFILE} && ollama run {export.ollama_name}"
    return (f"cd {folder} && {ollama}" if folder else ollama), f"llama-cli -m {model} -cnv"


def export_message(run: RunDir, export: GgufExport) -> str:
    """What was written, for the UI and the command line: which weights, the file and its size."""
    return (f"The trained model ({trained_weights(run).label} of run {run.id}, merged) as GGUF {export.quant}: "
            f"{export.path.name} ({format_size(export.size_bytes)}), with the Ollama {MODELFILE} that runs it.")
