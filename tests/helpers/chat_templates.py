"""Chat templates written for the multi-turn tests in the shapes real models use, and a character-level
tokenizer with their special tokens (test-only).

* QWEN25: ChatML; tools listed in the system prompt (JSON per line inside <tools>); the model calls with
  <tool_call>{json}</tool_call>; tool results are role "tool", grouped into one user turn of <tool_response>s.
* LLAMA3: <|begin_of_text|>, <|start_header_id|>role<|end_header_id|>\n\n content (trimmed) <|eot_id|>; tools
  in the system prompt; tool results in the "ipython" role.
* QWEN3: QWEN25 plus thinking: an assistant turn after the last user message keeps its reasoning as
  <think>\n...\n</think>\n\n; earlier turns are rendered without it (what breaks naive re-tokenisation);
  enable_thinking=false puts an empty think block into the generation prompt.
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>", "<|begin_of_text|>", "<|start_header_id|>",
           "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
CHARS = sorted(set(string.printable) - set("\t\r\x0b\x0c"))

# Consecutive tool results become one user turn of <tool_response> blocks (Qwen2.5 and Qwen3 alike).
QWEN_TOOL_RESPONSES = (
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{%- endif %}"
    "{{ '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}{%- endif %}"
)

QWEN25 = (
    "{%- if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}{%- else %}{{ 'You are a helpful assistant.' }}"
    "{%- endif %}"
    "{{ '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{%- endfor %}"
    "{{ '\\n</tools>\\n\\nFor each function call, return a json object within <tool_call></tool_call> tags:\\n'"
    " '<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or message.role == 'assistant' %}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    + QWEN_TOOL_RESPONSES
    + "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

LLAMA3 = (
    "{{ '<|begin_of_text|>' }}"
    "{%- if tools or messages[0].role == 'system' %}"
    "{{ '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{%- if tools %}{{ 'Environment: ipython\\n\\nAnswer with a function call as JSON {\"name\": function name, '"
    " '\"parameters\": arguments} when a function helps.\\n\\n' }}"
    "{%- for tool in tools %}{{ tool | tojson + '\\n\\n' }}{%- endfor %}{%- endif %}"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content | trim }}{%- endif %}"
    "{{ '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' or message.role == 'ipython' %}"
    "{{ '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- elif message.role != 'system' %}"
    "{{ '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

QWEN3 = (
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_query = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    + QWEN25.split("{%- for message in messages %}")[0]
    + "{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{{ '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = message.content %}{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_query and reasoning %}"
    "{{ '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}{%- endif %}"
    + QWEN_TOOL_RESPONSES
    + "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

TEMPLATES = {"qwen25": QWEN25, "llama3": LLAMA3, "qwen3": QWEN3}
#: the end-of-turn (stop) token of each template
STOP_TOKENS = {"qwen25": "<|im_end|>", "llama3": "<|eot_id|>", "qwen3": "<|im_end|>"}


def build_chat_tokenizer(template: str = "qwen25") -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIAL + ADDED + CHARS)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(SPECIAL)
    backend.add_tokens(ADDED)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>",
                                        pad_token="<|endoftext|>", unk_token="<unk>",
                                        clean_up_tokenization_spaces=False)
    tokenizer.chat_template = TEMPLATES[template]
    return tokenizer
