"""The GGUF tokenizer: SmolLM2's embedded vocabulary vs transformers' GGUF reader."""

import gguf
import pytest
import transformers
from tokenizers import pre_tokenizers

from agentic_esopt.models.gguf import default_gguf_path
from agentic_esopt.models.tokenizer import tokenizer_from_gguf

AGREED_TEXTS = [
    "12345", "x=3.14159", "Hello world", " leading space", "multiple   spaces",
    "tabs\tand\nnewlines\n\n", "  \t mixed \n whitespace", "café naïve résumé",
    "日本語のテキスト", "emoji 🤖🎉 end", "<|im_start|>user\nhi<|im_end|>\n",
    "I'm sure they'll say it's fine.",
]
CONVERSATION = [
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "12 + 30 = 42."},
    {"role": "user", "content": "And 7*6?\n\tExplain."},
]


@pytest.fixture(scope="module")
def smollm2_tokenizers():
    """(ours, transformers' reference) built from the embedded SmolLM2 GGUF."""
    path = default_gguf_path("smollm2-135m")
    reference = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return tokenizer_from_gguf(path), reference


@pytest.mark.parametrize("text", AGREED_TEXTS)
def test_ids_equal_transformers_gguf_tokenizer(smollm2_tokenizers, text):
    ours, reference = smollm2_tokenizers
    assert ours.encode(text) == reference.encode(text)
    assert ours.decode(ours.encode(text)) == text


@pytest.mark.parametrize("text, tokens", [
    ("a  3", ["a", "ĠĠ", "3"]),
    ("\n\n42", ["ĊĊ", "4", "2"]),
    ("x 12", ["x", "Ġ", "1", "2"]),
])
def test_digits_are_isolated_before_the_byte_level_split(smollm2_tokenizers, text, tokens):
    # SmolLM2's tokenizer.json (and llama.cpp's "smollm" pre-tokenizer) isolate each digit,
    # then split the rest GPT-2 style, so whitespace before a digit stays one piece.
    # transformers' GGUF reader ignores tokenizer.ggml.pre and splits "a  3" as a/Ġ/Ġ3.
    ours, _ = smollm2_tokenizers
    assert ours.convert_ids_to_tokens(ours.encode(text)) == tokens
    assert ours.decode(ours.encode(text)) == text


def test_chat_template_text_and_ids_equal_reference(smollm2_tokenizers):
    ours, reference = smollm2_tokenizers
    def render(tokenizer, **kwargs):
        return tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True, **kwargs)

    text = render(ours, tokenize=False)
    assert text == render(reference, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("user\nAnd 7*6?\n\tExplain.<|im_end|>\n<|im_start|>assistant\n")
    ids = render(ours)["input_ids"]
    assert ids == render(reference)["input_ids"]
    assert ours.decode(ids) == text


def test_special_tokens(smollm2_tokenizers):
    ours, _ = smollm2_tokenizers
    ids = (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id, ours.unk_token_id)
    assert ids == (1, 2, 2, 0)
    assert ours.eos_token == "<|im_end|>" and len(ours) == 49152
    for control in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<file_sep>", "<jupyter_code>"):
        assert len(ours.encode(control)) == 1, control
    assert ours.encode("hi") == ours.encode("hi", add_special_tokens=True)  # No BOS added.
    assert ours.decode(ours.encode("<|im_start|>hi"), skip_special_tokens=True) == "hi"


def write_tokenizer_gguf(path, pre="smollm", model="gpt2", add_bos=None):
    """A GGUF holding only tokenizer metadata: specials, byte symbols and a "12" merge."""
    tokens = ["<s>", "</s>"] + sorted(pre_tokenizers.ByteLevel.alphabet()) + ["12"]
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3] + [1] * (len(tokens) - 2))
    writer.add_token_merges(["1 2"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("pre, tokens", [
    ("smollm", ["1", "2", "3"]), ("gpt2", ["12", "3"]), ("llama-bpe", ["12", "3"]),
])
def test_pre_tokenizer_follows_gguf_pre(tmp_path, pre, tokens):
    tokenizer = tokenizer_from_gguf(write_tokenizer_gguf(tmp_path / "t.gguf", pre=pre))
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("123")) == tokens


def test_add_bos_token_metadata_prepends_bos(tmp_path):
    path = write_tokenizer_gguf(tmp_path / "t.gguf", pre="gpt2", add_bos=True)
    tokenizer = tokenizer_from_gguf(path)
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("12")) == ["<s>", "12"]
    unmarked = tokenizer.encode("12", add_special_tokens=False)
    assert unmarked == tokenizer.convert_tokens_to_ids(["12"])


@pytest.mark.parametrize("kwargs, message", [
    ({"model": "llama"}, "Unsupported GGUF tokenizer model 'llama'"),
    ({"pre": "mystery"}, "Unsupported GGUF pre-tokenizer 'mystery'"),
])
def test_unsupported_tokenizers_are_clear_errors(tmp_path, kwargs, message):
    path = write_tokenizer_gguf(tmp_path / "t.gguf", **kwargs)
    with pytest.raises(ValueError, match=message):
        tokenizer_from_gguf(path)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="No GGUF file"):
        tokenizer_from_gguf(tmp_path / "absent.gguf")
