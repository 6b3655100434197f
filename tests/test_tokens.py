"""Prompt-token estimation: accuracy per script, request shapes, exact tokenizer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from latgate.routing import tokens
from latgate.routing.tokens import (
    IMAGE_TOKENS,
    LOW_DETAIL_IMAGE_TOKENS,
    ExactTokenizer,
    TokenizerError,
    estimate_prompt_tokens,
    estimate_text_tokens,
)

ENGLISH = (
    "The gateway sits between coding assistants and a handful of inference pools. "
    "Each request is inspected before it is forwarded: the router estimates how long the prompt is, "
    "checks whether the client asked for a fast answer, and then picks the pool most likely to reply "
    "in time. Long documents go to the machines with the largest context windows, while short "
    "interactive questions are sent to the decode pool, which keeps its batches small so that the "
    "first token arrives quickly. When a pool fails before it has sent anything, the next one in the "
    "fallback list is tried, and the client never notices the difference."
)
PYTHON = '''def percentile(values: list[float], fraction: float) -> float:
    """Return the value below which `fraction` of `values` fall (linear interpolation)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    lower = int(position)
    upper = min(lower + 1, len(ordered) - 1)
    weight = position - lower
    return ordered[lower] * (1.0 - weight) + ordered[upper] * weight


for name, samples in {"ttft": [0.12, 0.31, 0.08], "e2e": [1.5, 2.25, 0.9]}.items():
    print(f"{name}: p50={percentile(samples, 0.5):.3f}s p99={percentile(samples, 0.99):.3f}s")
'''
TOOL_JSON = (
    '{"type": "function", "function": {"name": "read_file", "description": "Read a text file from the '
    'workspace and return its contents.", "parameters": {"type": "object", "properties": {"path": '
    '{"type": "string", "description": "Path relative to the workspace root"}, "max_lines": {"type": '
    '"integer", "minimum": 1, "default": 400}}, "required": ["path"]}}}'
)
CHINESE = (
    "今天的会议讨论了新产品的发布计划，包括市场推广、技术支持和售后服务三个方面。大家一致认为，"
    "需要在下个月之前完成所有准备工作，并且每周汇报一次进度。如果遇到问题，请及时联系项目负责人，"
    "以免影响整体时间安排。"
)
JAPANESE = (
    "今日は天気がとても良かったので、午後から近くの公園まで散歩に行きました。桜の花がちょうど満開で、"
    "たくさんの家族連れが写真を撮ったり、お弁当を食べたりしていました。帰りにカフェに寄って、"
    "温かいコーヒーを飲みながら本を読みました。"
)
KOREAN = (
    "오늘은 날씨가 정말 좋아서 오후에 근처 공원으로 산책을 나갔습니다. 벚꽃이 활짝 피어 있어서 많은 "
    "가족들이 사진을 찍거나 도시락을 먹고 있었습니다. 돌아오는 길에 카페에 들러 따뜻한 커피를 "
    "마시면서 책을 읽었습니다."
)
MIXED = (
    "请帮我检查下面这段代码为什么会报错：\n```python\nimport json\n\ndef load(path):\n"
    '    with open(path) as f:\n        return json.load(f)["items"]\n```\n'
    "运行时提示 KeyError: 'items'，但是文件里明明有这个字段。"
)
PROVIDER_TABLE_LONG_PROMPT = "请总结以下内容：" + "测试" * 20000

# Exact counts of the samples above, measured offline with the cl100k_base and
# o200k_base vocabularies (tiktoken-compatible BPE).
REFERENCE_TOKENS = {
    "english": (ENGLISH, 117, 117),
    "python": (PYTHON, 205, 207),
    "tool_json": (TOOL_JSON, 93, 94),
    "chinese": (CHINESE, 102, 60),
    "japanese": (JAPANESE, 119, 88),
    "korean": (KOREAN, 131, 70),
    "mixed": (MIXED, 68, 60),
}


def test_empty_text_has_no_tokens_and_any_text_at_least_one() -> None:
    assert estimate_text_tokens("") == 0
    assert estimate_text_tokens("a") == 1
    assert estimate_text_tokens(" ") == 1


@pytest.mark.parametrize(
    "text", ["测试" * 500, "ひらがなとカタカナ" * 100, "안녕하세요" * 200, "「」，。！？" * 100]
)
def test_cjk_kana_hangul_and_fullwidth_punctuation_count_one_token_per_character(text: str) -> None:
    assert estimate_text_tokens(text) == len(text)


@pytest.mark.parametrize("name", ["chinese", "japanese"])
def test_cjk_prose_estimates_about_one_token_per_character(name: str) -> None:
    text = REFERENCE_TOKENS[name][0]
    assert 0.9 * len(text) <= estimate_text_tokens(text) <= 1.1 * len(text)


@pytest.mark.parametrize("name", ["english", "python", "tool_json"])
def test_ascii_text_estimate_is_within_15_percent_of_cl100k(name: str) -> None:
    text, cl100k, _ = REFERENCE_TOKENS[name]
    assert abs(estimate_text_tokens(text) - cl100k) <= 0.15 * cl100k


@pytest.mark.parametrize("name", sorted(REFERENCE_TOKENS))
def test_estimate_lies_between_o200k_and_cl100k_give_or_take_a_quarter(name: str) -> None:
    text, cl100k, o200k = REFERENCE_TOKENS[name]
    assert 0.75 * min(cl100k, o200k) <= estimate_text_tokens(text) <= 1.25 * max(cl100k, o200k)


def test_code_counts_more_tokens_per_character_than_prose() -> None:
    prose_rate = estimate_text_tokens(ENGLISH) / len(ENGLISH)
    code_rate = estimate_text_tokens(PYTHON) / len(PYTHON)
    assert code_rate > 1.3 * prose_rate


def test_english_prose_is_about_four_characters_per_token() -> None:
    assert 3.5 <= len(ENGLISH) / estimate_text_tokens(ENGLISH) <= 6.0


def test_provider_table_long_cjk_prompt_is_over_the_long_context_threshold() -> None:
    assert len(PROVIDER_TABLE_LONG_PROMPT) == 40008
    assert estimate_text_tokens(PROVIDER_TABLE_LONG_PROMPT) > 16384
    body = {"model": "llama-3-8b-instruct", "messages": [{"role": "user", "content": PROVIDER_TABLE_LONG_PROMPT}]}
    assert estimate_prompt_tokens(body) > 16384


def test_emoji_and_lone_surrogates_are_counted_without_error() -> None:
    assert estimate_text_tokens("🙂" * 10) == 20
    assert estimate_text_tokens("\ud83d") >= 1


def test_estimate_is_additive_over_concatenation() -> None:
    assert estimate_text_tokens(ENGLISH * 10) == pytest.approx(10 * estimate_text_tokens(ENGLISH), rel=0.01)


# -- request bodies -------------------------------------------------------------


def _chat(*messages: dict[str, object], **extra: object) -> dict[str, object]:
    return {"model": "m", "messages": list(messages), **extra}


def test_chat_body_counts_content_plus_per_message_overhead() -> None:
    one = estimate_prompt_tokens(_chat({"role": "user", "content": ENGLISH}))
    assert estimate_text_tokens(ENGLISH) < one <= estimate_text_tokens(ENGLISH) + 10
    two = estimate_prompt_tokens(
        _chat({"role": "system", "content": "Be brief."}, {"role": "user", "content": ENGLISH})
    )
    assert two > one + 2


def test_multipart_content_counts_text_parts_and_a_fixed_cost_per_image() -> None:
    text_only = estimate_prompt_tokens(
        _chat({"role": "user", "content": [{"type": "text", "text": ENGLISH}]})
    )
    assert text_only == estimate_prompt_tokens(_chat({"role": "user", "content": ENGLISH}))
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 50_000}}
    low = {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png", "detail": "low"}}
    with_images = estimate_prompt_tokens(
        _chat({"role": "user", "content": [{"type": "text", "text": ENGLISH}, image, low]})
    )
    assert with_images == text_only + IMAGE_TOKENS + LOW_DETAIL_IMAGE_TOKENS


def test_tool_calls_arguments_and_tool_definitions_are_counted() -> None:
    arguments = '{"path": "src/latgate/routing/decision.py", "max_lines": 200}'
    base = _chat({"role": "user", "content": "read it"})
    with_call = _chat(
        {"role": "user", "content": "read it"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": arguments},
                }
            ],
        },
    )
    assert estimate_prompt_tokens(with_call) >= estimate_prompt_tokens(base) + estimate_text_tokens(arguments)
    import json

    tool = json.loads(TOOL_JSON)
    with_tools = dict(base, tools=[tool] * 20)
    added = estimate_prompt_tokens(with_tools) - estimate_prompt_tokens(base)
    assert 20 * 70 <= added <= 20 * 130


def test_completions_prompt_as_string_list_and_token_ids() -> None:
    assert estimate_prompt_tokens({"model": "m", "prompt": ENGLISH}) == estimate_text_tokens(ENGLISH)
    assert estimate_prompt_tokens({"model": "m", "prompt": [ENGLISH, ENGLISH]}) == pytest.approx(
        2 * estimate_text_tokens(ENGLISH), abs=1
    )
    assert estimate_prompt_tokens({"model": "m", "prompt": [1, 2, 3, 4, 5]}) == 5
    assert estimate_prompt_tokens({"model": "m", "prompt": [[1, 2, 3], [4, 5]]}) == 5


def test_embeddings_input_is_counted() -> None:
    assert estimate_prompt_tokens({"model": "e", "input": CHINESE}) == estimate_text_tokens(CHINESE)
    assert estimate_prompt_tokens({"model": "e", "input": [CHINESE, "x"]}) > estimate_text_tokens(CHINESE)


def test_anthropic_system_and_content_blocks_are_counted() -> None:
    body = {
        "model": "claude",
        "system": [{"type": "text", "text": ENGLISH}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "a" * 400}}
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": CHINESE}],
                    }
                ],
            },
        ],
    }
    total = estimate_prompt_tokens(body)
    floor = estimate_text_tokens(ENGLISH) + estimate_text_tokens("a" * 400) + estimate_text_tokens(CHINESE)
    assert floor < total < floor + 40
    assert estimate_prompt_tokens({"model": "c", "system": ENGLISH}) == estimate_text_tokens(ENGLISH)


def test_responses_api_instructions_and_input_items_are_counted() -> None:
    body = {
        "model": "codex",
        "instructions": ENGLISH,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": CHINESE}]}],
    }
    floor = estimate_text_tokens(ENGLISH) + estimate_text_tokens(CHINESE)
    assert floor < estimate_prompt_tokens(body) < floor + 10


def test_malformed_bodies_are_estimated_without_raising() -> None:
    for body in (
        {},
        {"messages": "oops"},
        {"messages": [None, 3, {"content": {"x": 1}}]},
        {"prompt": None},
        {"input": [None]},
        {"tools": "x"},
    ):
        assert estimate_prompt_tokens(body) >= 0


# -- exact tokenizer --------------------------------------------------------------


def _word_level_tokenizer(path: Path, *, split_every_character: bool, corpus: list[str]) -> Path:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = (
        pre_tokenizers.Split(Regex("."), behavior="isolated")
        if split_every_character
        else pre_tokenizers.Whitespace()
    )
    tokenizer.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tokenizer.save(str(path))
    return path


def test_exact_tokenizer_counts_with_a_tokenizer_json(tmp_path: Path) -> None:
    path = _word_level_tokenizer(tmp_path / "tokenizer.json", split_every_character=False, corpus=[ENGLISH])
    exact = ExactTokenizer(path)
    assert exact.count_text("the gateway sits between pools.") == 6
    assert exact.count_text("") == 0
    body = _chat({"role": "user", "content": "the gateway sits"})
    assert exact.count_prompt(body) == 3 + 4 + 3


@pytest.mark.parametrize("name", ["chinese", "japanese"])
def test_estimate_matches_a_character_level_tokenizer_on_cjk(tmp_path: Path, name: str) -> None:
    text = REFERENCE_TOKENS[name][0]
    path = _word_level_tokenizer(tmp_path / "chars.json", split_every_character=True, corpus=[text])
    exact = ExactTokenizer(path).count_text(text)
    assert exact == len(text)
    assert abs(estimate_text_tokens(text) - exact) <= 0.1 * exact


@pytest.mark.parametrize("name", ["english", "python"])
def test_estimate_is_close_to_a_word_and_punctuation_tokenizer_on_ascii(tmp_path: Path, name: str) -> None:
    text = REFERENCE_TOKENS[name][0]
    path = _word_level_tokenizer(tmp_path / "words.json", split_every_character=False, corpus=[text])
    exact = ExactTokenizer(path).count_text(text)
    assert abs(estimate_text_tokens(text) - exact) <= 0.15 * exact


def test_exact_tokenizer_names_an_unreadable_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(TokenizerError, match="nope/tokenizer.json"):
        ExactTokenizer(missing)


def test_exact_tokenizer_without_the_package_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(TokenizerError, match=r"latgate\[tokenizers\]"):
        ExactTokenizer(tmp_path / "tokenizer.json")


def test_a_body_of_more_messages_than_are_counted_is_estimated_from_a_sample_within_two_percent(monkeypatch) -> None:
    from latgate.routing import tokens

    words = ["short", "a longer message about the build", "def f(x):\n    return x * 2\n" * 3, "测试" * 20]
    body = {"messages": [{"role": "user", "content": words[i % 7 % 4] + str(i)} for i in range(20 * tokens.MAX_COUNTED_MESSAGES)]}
    sampled = tokens.estimate_prompt_tokens(body)
    monkeypatch.setattr(tokens, "MAX_COUNTED_MESSAGES", len(body["messages"]))
    walked = tokens.estimate_prompt_tokens(body)
    assert abs(sampled - walked) <= 0.02 * walked


# -- remembered estimates of long texts -------------------------------------------


def test_a_text_seen_before_is_estimated_as_when_first_counted(monkeypatch) -> None:
    body = _chat(
        {"role": "system", "content": ENGLISH * 20},
        {"role": "user", "content": "中文" * 600},
        tools=[{"type": "function", "function": {"name": "read", "parameters": {"description": PYTHON * 5}}}],
    )
    monkeypatch.setattr(tokens, "_memo", tokens._Memo(0))  # remembers nothing
    counted = estimate_prompt_tokens(body)
    monkeypatch.setattr(tokens, "_memo", tokens._Memo(1 << 20))
    first = estimate_prompt_tokens(body)
    again = estimate_prompt_tokens({**body, "messages": [dict(m) for m in body["messages"]]})
    assert first == again == counted
    assert estimate_text_tokens("".join(["x"] * 4000)) == estimate_text_tokens("x" * 4000) == 800


def test_the_memo_holds_at_most_its_characters_and_forgets_the_least_recently_used() -> None:
    memo = tokens._Memo(2000)
    texts = [chr(ord("a") + i) * 600 for i in range(5)]
    for text in texts[:3]:
        memo.tokens(text)
    memo.tokens(texts[0])  # used again: now the newest
    memo.tokens(texts[3])  # 2,400 characters: the least recently used (texts[1]) goes
    assert list(memo._tokens) == [texts[2], texts[0], texts[3]]
    assert memo._chars == 1800
    memo.tokens("y" * 5000)  # longer than the whole memo: counted, not kept
    assert "y" * 5000 not in memo._tokens and memo._chars == 1800
