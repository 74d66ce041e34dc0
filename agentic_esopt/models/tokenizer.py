"""Tokenizers rebuilt from GGUF metadata, as `transformers` fast tokenizers.

A GGUF file has no `tokenizer.json`: it stores the vocabulary, the merges, the token
types, the special token ids and the chat template under llama.cpp's metadata keys.
`tokenizer_from_gguf` turns those back into the tokenizer the model was trained with,
including the pre-tokenisation llama.cpp names in `tokenizer.ggml.pre` (SmolLM2, for
example, isolates every digit before the GPT-2 byte-level split).
"""

import json
import os
import pathlib
from typing import Any

import gguf
import tokenizers
import transformers
from tokenizers import decoders, models, pre_tokenizers, processors

_REQUIRED = object()

# llama.cpp token types (`llama_token_type`).
_CONTROL = 3
_USER_DEFINED = 4

# Pre-tokenizer families, keyed by `tokenizer.ggml.pre` (names as llama.cpp writes them).
_GPT2_PRE = ("default", "gpt2", "gpt-2", "mpt", "olmo", "jais")
_DIGITS_THEN_GPT2_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone")
_LLAMA3_PRE = ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3")
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def open_gguf(reader_or_path: "gguf.GGUFReader | str | os.PathLike") -> gguf.GGUFReader:
    """Returns a `GGUFReader`, opening `reader_or_path` if it is a path."""
    if isinstance(reader_or_path, gguf.GGUFReader):
        return reader_or_path
    if not os.path.isfile(reader_or_path):
        raise FileNotFoundError(f"No GGUF file at {os.fspath(reader_or_path)!r}.")
    return gguf.GGUFReader(reader_or_path)


def metadata_value(reader: gguf.GGUFReader, key: str, default: Any = _REQUIRED) -> Any:
    """The value of metadata `key` (scalar, string or list), or `default` if absent.

    Raises:
      KeyError: the key is absent and no default was given.
    """
    field = reader.get_field(key)
    if field is None:
        if default is _REQUIRED:
            raise KeyError(f"GGUF metadata has no {key!r}; this file cannot be converted.")
        return default
    return field.contents()


def tokenizer_from_gguf(
    reader_or_path: "gguf.GGUFReader | str | os.PathLike",
) -> transformers.PreTrainedTokenizerFast:
    """Builds the fast tokenizer a GGUF file describes (byte-level BPE vocabularies).

    Args:
      reader_or_path: an open `gguf.GGUFReader` or the path of a `.gguf` file.

    Returns:
      A `transformers.PreTrainedTokenizerFast` with the file's special tokens, its
      bos/eos/unk/pad tokens and its chat template (`apply_chat_template` works).

    Raises:
      ValueError: the vocabulary is not byte-level BPE (`tokenizer.ggml.model` other
        than "gpt2"), or its pre-tokenizer (`tokenizer.ggml.pre`) is unknown.
    """
    reader = open_gguf(reader_or_path)
    kind = metadata_value(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"Unsupported GGUF tokenizer model {kind!r}: only byte-level BPE ('gpt2') is supported."
        )
    tokens = metadata_value(reader, "tokenizer.ggml.tokens")
    token_types = metadata_value(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(merge.split(" ")) for merge in metadata_value(reader, "tokenizer.ggml.merges")]

    backend = tokenizers.Tokenizer(
        models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges)
    )
    backend.pre_tokenizer = _pre_tokenizer(metadata_value(reader, "tokenizer.ggml.pre", "default"))
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(_added_tokens(tokens, token_types, _CONTROL, special=True))
    backend.add_tokens(_added_tokens(tokens, token_types, _USER_DEFINED, special=False))
    special = _special_tokens(reader, tokens)
    backend.post_processor = _post_processor(reader, tokens, special)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        chat_template=metadata_value(reader, "tokenizer.chat_template", None),
        clean_up_tokenization_spaces=False,
        **_context_length(reader),
        **special,
    )


def save_tokenizer(tokenizer: transformers.PreTrainedTokenizerBase,
                   out_dir: str | os.PathLike) -> None:
    """Saves a tokenizer so `AutoTokenizer.from_pretrained(out_dir)` restores it.

    The chat template goes inside `tokenizer_config.json` (not a separate `.jinja` file),
    and `special_tokens_map.json`, which transformers 5 no longer writes, is added for
    tools that read it.
    """
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)
    pathlib.Path(out_dir, "special_tokens_map.json").write_text(
        json.dumps(tokenizer.special_tokens_map, indent=2) + "\n"
    )


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer llama.cpp applies for `tokenizer.ggml.pre == pre`."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _GPT2_PRE:
        return byte_level
    if pre in _DIGITS_THEN_GPT2_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _LLAMA3_PRE:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(tokenizers.Regex(_LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    known = sorted(_GPT2_PRE + _DIGITS_THEN_GPT2_PRE + _LLAMA3_PRE)
    raise ValueError(f"Unsupported GGUF pre-tokenizer {pre!r}; supported: {known}.")


def _added_tokens(
    tokens: list[str], token_types: list[int], token_type: int, special: bool
) -> list[tokenizers.AddedToken]:
    """Tokens of `token_type`, matched whole in raw text (never split by BPE)."""
    return [
        tokenizers.AddedToken(token, special=special, normalized=False)
        for token, kind in zip(tokens, token_types)
        if kind == token_type
    ]


def _special_tokens(reader: gguf.GGUFReader, tokens: list[str]) -> dict[str, str]:
    """bos/eos/unk/pad token strings from the ids in the metadata."""
    names = {
        "bos_token": "tokenizer.ggml.bos_token_id",
        "eos_token": "tokenizer.ggml.eos_token_id",
        "unk_token": "tokenizer.ggml.unknown_token_id",
        "pad_token": "tokenizer.ggml.padding_token_id",
    }
    special = {}
    for name, key in names.items():
        token_id = metadata_value(reader, key, None)
        if token_id is None:
            continue
        if not 0 <= token_id < len(tokens):
            raise ValueError(f"GGUF {key}={token_id} is outside the vocabulary of {len(tokens)}.")
        special[name] = tokens[token_id]
    return special


def _post_processor(
    reader: gguf.GGUFReader, tokens: list[str], special: dict[str, str]
) -> processors.PostProcessor | None:
    """Adds bos/eos around encoded text when the metadata asks for it."""
    add_bos = metadata_value(reader, "tokenizer.ggml.add_bos_token", False)
    add_eos = metadata_value(reader, "tokenizer.ggml.add_eos_token", False)
    if not (add_bos or add_eos):
        return None
    for flag, name in ((add_bos, "bos_token"), (add_eos, "eos_token")):
        if flag and name not in special:
            raise ValueError(f"GGUF asks to add a {name} but gives no {name} id.")
    ids = {token: i for i, token in enumerate(tokens)}
    bos = [special["bos_token"]] if add_bos else []
    eos = [special["eos_token"]] if add_eos else []
    return processors.TemplateProcessing(
        single=" ".join(bos + ["$A"] + eos),
        pair=" ".join(bos + ["$A"] + eos + bos + ["$B:1"] + eos),
        special_tokens=[(token, ids[token]) for token in dict.fromkeys(bos + eos)],
    )


def _context_length(reader: gguf.GGUFReader) -> dict[str, int]:
    """`model_max_length` from the model's context length, if the metadata states one."""
    architecture = metadata_value(reader, "general.architecture", None)
    length = metadata_value(reader, f"{architecture}.context_length", None)
    return {} if length is None else {"model_max_length": length}
