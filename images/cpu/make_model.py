"""Write a tiny Qwen3-MoE-style model directory with real, seeded safetensors weights.

    python images/cpu/make_model.py OUT_DIR

- ``config.json``: Qwen3MoeForCausalLM, hidden 64, 2 layers, 4 heads / 2 KV heads, head_dim 64 (one the
  CPU attention supports; 16 is not), 8 experts, top-2, moe_intermediate 32, vocab = the tokenizer's.
- ``tokenizer.json``: a byte-level BPE built with `tokenizers` from merges computed here on a small fixed
  corpus (no trainer: its tie-breaking is not promised to be stable), Qwen2's pre-tokenizer regex.
  ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` are special tokens; ``<think>``, ``</think>``,
  ``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>`` are added (non-special, as in
  Qwen3, so the reasoning and hermes tool parsers see them in the text); each is one token.
- ``tokenizer_config.json``: a Qwen3-style chat template (system/user/assistant/tool messages, hermes
  ``<tool_call>`` tools, ``enable_thinking``).
- ``generation_config.json``: eos = ``<|im_end|>`` and ``<|endoftext|>``; no sampling defaults.
- ``model.safetensors``: every weight of the config in float32 (HF Qwen3-MoE names), loaded by vLLM's
  normal safetensors loader. Matrices are uniform on ``[-sqrt(3)*s, sqrt(3)*s]`` (std ``s`` =
  ``INIT_STD``, 0.3: logits spread over several nats), RMSNorm weights are 1.

Weights generator: Philox4x64-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011;
the Random123 reference), through numpy's ``Philox`` bit generator with an explicit key and counter
(``random_raw``: the raw 64-bit words, no ``SeedSequence``, no distribution method). A counter-based
generator is a fixed function of (key, counter), so its raw stream cannot change with a library version;
numpy's distribution methods (``normal`` ...) and ``torch.manual_seed`` streams carry no such promise.
The tests check numpy's stream against the Random123 known-answer vectors and an independent pure-Python
Philox. Each tensor has its own key ``(SEED, first 8 bytes of sha256(name))``, so a tensor's values do
not depend on the others; its words become values by exact arithmetic (``weight_values``).

Deterministic: the same script version (and `tokenizers`, numpy and safetensors versions) writes the same
bytes; those versions are part of the model's digest (``imageforge.base.model_digest``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

SCRIPT_VERSION = 2
MODEL_NAME = "tiny-qwen3-moe"
SEED = 20261201  # first word of every tensor's Philox key
INIT_STD = 0.3  # std of every matrix (uniform init); an std of 0.3 gives ~10 nats of logit spread
WEIGHTS_FILE = "model.safetensors"
MAX_MERGES = 247  # 256 bytes + 247 merges + 9 added tokens = 512 ids (when the corpus allows)

#: (content, special) in id order after the BPE vocabulary; Qwen3's order.
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

# Qwen2's pre-tokenizer split pattern.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)

CORPUS = """\
You are a helpful assistant. The user asks a question and the assistant answers it.
Hello! How can I help you today? Please tell me what you need, and I will do my best.
What is the weather like in Paris today? Let me check the weather for you.
The function get_weather takes a location and a unit, and returns the temperature.
{"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}
{"type": "function", "function": {"name": "get_time", "description": "Get the current time",
"parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}}
The answer is 42. The result of the calculation is correct. Thank you for the question.
I think the best answer is to explain the steps one by one, then give the final result.
First, we read the input. Second, we compute the value. Finally, we return the output.
The model runs on the CPU and serves requests with an OpenAI compatible server.
This is a test of the tokenizer. The quick brown fox jumps over the lazy dog.
Write a short story about a robot that learns to paint pictures of the sea and the sky.
def main(): return the value of the function for the given input and print the result
import json; data = json.loads(text); print(data["name"], data["arguments"])
Sure, here is the list: one, two, three, four, five, six, seven, eight, nine, ten.
Yes. No. Maybe. Of course! That is a good idea; let us try it and see what happens.
The system message tells the assistant how to behave, and the user message asks the question.
When the assistant calls a tool, the tool returns a response, and the assistant continues the answer.
"""

CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments \
within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": \
<args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and \
not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + \
'\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the ByteLevel alphabet), in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in sorted(zip(bs, cs, strict=True))}


def _pre_tokenizer() -> Any:
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )


def compute_merges(corpus: str, max_merges: int = MAX_MERGES) -> list[tuple[str, str]]:
    """Plain BPE on the pre-tokenized corpus; ties broken by the pair's text (deterministic)."""
    words: Counter[tuple[str, ...]] = Counter()
    for piece, _ in _pre_tokenizer().pre_tokenize_str(corpus):
        words[tuple(piece)] += 1
    merges: list[tuple[str, str]] = []
    vocab = set(bytes_to_unicode().values())
    while len(merges) < max_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for a, b in itertools.pairwise(word):
                pairs[(a, b)] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merged = best[0] + best[1]
        vocab.add(merged)
        merges.append(best)
        new_words: Counter[tuple[str, ...]] = Counter()
        for word, count in words.items():
            out: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            new_words[tuple(out)] += count
        words = new_words
    return merges


def build_tokenizer() -> Any:
    """The `tokenizers.Tokenizer` (byte-level BPE + added tokens)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    merges = compute_merges(CORPUS)
    vocab: dict[str, int] = {}
    for ch in bytes_to_unicode().values():
        vocab[ch] = len(vocab)
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    for content, special in ADDED_TOKENS:
        token = AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False)
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
    return tok


def token_ids(tok: Any) -> dict[str, int]:
    return {content: int(tok.token_to_id(content)) for content, _ in ADDED_TOKENS}


def model_config(vocab_size: int, ids: dict[str, int]) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "decoder_sparse_step": 1,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": 4096,
        "max_window_layers": 2,
        "mlp_only_layers": [],
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "output_router_logits": False,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }


def tokenizer_config(ids: dict[str, int]) -> dict[str, Any]:
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(ids[content]): {
                "content": content,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for content, special in ADDED_TOKENS
        },
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def generation_config(ids: dict[str, int]) -> dict[str, Any]:
    return {
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
    }


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def tensor_key(name: str) -> tuple[int, int]:
    """The Philox key of tensor ``name``: (SEED, the first 8 bytes of sha256(name), little endian)."""
    return SEED, int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def philox_words(key: tuple[int, int], count: int) -> Any:
    """``count`` raw 64-bit Philox4x64-10 words for ``key``, blocks at counters 1, 2, 3, ... (numpy uint64).

    numpy's ``Philox(counter=c)`` increments the counter before each block, so counter 0 starts at block 1.
    """
    import numpy as np

    bitgen = np.random.Philox(counter=0, key=np.array(key, dtype=np.uint64))
    return bitgen.random_raw(count)


def weight_values(words: Any, std: float) -> Any:
    """Uniform values of std ``std`` from raw words, by exact arithmetic (float32 array).

    The top 24 bits ``u`` of a word give ``(2u + 1 - 2**24) / 2**24`` (an odd multiple of 2**-24 in
    (-1, 1), exact in float64), times ``sqrt(3) * std`` in float64, rounded once to float32. IEEE-754
    rounding makes this the same on every platform and numpy version.
    """
    import numpy as np

    u = (np.asarray(words, dtype=np.uint64) >> np.uint64(40)).astype(np.int64)
    x = (2 * u + 1 - 2**24).astype(np.float64) / float(2**24)
    return (x * (math.sqrt(3.0) * std)).astype(np.float32)


def weight_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF Qwen3-MoE parameter name -> shape (``[out, in]`` for linear layers) for ``config``."""
    h, v = int(config["hidden_size"]), int(config["vocab_size"])
    hd, nh, nkv = int(config["head_dim"]), int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    e, inter = int(config["num_experts"]), int(config["moe_intermediate_size"])
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,),
                                          "lm_head.weight": (v, h)}
    for layer in range(int(config["num_hidden_layers"])):
        p = f"model.layers.{layer}"
        shapes.update({
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.post_attention_layernorm.weight": (h,),
            f"{p}.self_attn.q_proj.weight": (nh * hd, h),
            f"{p}.self_attn.k_proj.weight": (nkv * hd, h),
            f"{p}.self_attn.v_proj.weight": (nkv * hd, h),
            f"{p}.self_attn.o_proj.weight": (h, nh * hd),
            f"{p}.self_attn.q_norm.weight": (hd,),
            f"{p}.self_attn.k_norm.weight": (hd,),
            f"{p}.mlp.gate.weight": (e, h),
        })
        for expert in range(e):
            q = f"{p}.mlp.experts.{expert}"
            shapes.update({f"{q}.gate_proj.weight": (inter, h), f"{q}.up_proj.weight": (inter, h),
                           f"{q}.down_proj.weight": (h, inter)})
    return dict(sorted(shapes.items()))


def weights(config: dict[str, Any]) -> dict[str, Any]:
    """Name -> float32 numpy array: norms 1, every other tensor seeded uniform of std INIT_STD."""
    import numpy as np

    out: dict[str, Any] = {}
    for name, shape in weight_shapes(config).items():
        if name.endswith("norm.weight"):
            out[name] = np.ones(shape, dtype=np.float32)
        else:
            words = philox_words(tensor_key(name), math.prod(shape))
            out[name] = weight_values(words, INIT_STD).reshape(shape)
    return out


def weights_bytes(config: dict[str, Any]) -> bytes:
    """The ``model.safetensors`` file for ``config``."""
    from safetensors.numpy import save

    # One metadata key only: safetensors keeps metadata in a hash map, so several keys come out in any order.
    data: bytes = save(weights(config), metadata={"format": "pt"})
    return data


def model_files() -> dict[str, str]:
    """File name -> text of every file of the model directory."""
    tok = build_tokenizer()
    ids = token_ids(tok)
    vocab_size = int(tok.get_vocab_size(with_added_tokens=True))
    tok_json = json.loads(tok.to_str())
    return {
        "config.json": _dump(model_config(vocab_size, ids)),
        "generation_config.json": _dump(generation_config(ids)),
        "tokenizer.json": _dump(tok_json),
        "tokenizer_config.json": _dump(tokenizer_config(ids)),
        "special_tokens_map.json": _dump(
            {
                "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
            }
        ),
    }


def write_model(out_dir: Path) -> Path:
    """Write the model directory (files replaced, nothing else touched); return it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = model_files()
    for name, text in files.items():
        (out_dir / name).write_bytes(text.encode("utf-8"))
    (out_dir / WEIGHTS_FILE).write_bytes(weights_bytes(json.loads(files["config.json"])))
    return out_dir


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    out = write_model(Path(args[0]))
    print(f"wrote {MODEL_NAME} (script version {SCRIPT_VERSION}) to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
