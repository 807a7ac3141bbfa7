"""The judge client against a real HTTP server on 127.0.0.1 (see judge_server.py)."""

from __future__ import annotations

import socket
import textwrap
import time

import pytest
from judge_server import JudgeServer, chat_reply, user_content

from mlx_grpo.common.errors import UserError
from mlx_grpo.rewards.judge import Judge, JudgeConfig, chat_completions_url, parse_score, render
from mlx_grpo.rewards.rubric import load_rubric
from mlx_grpo.rewards.rubric_reward import RubricReward

TEMPLATE = "Task: {prompt}\nAnswer: {completion}\nReference: {answer}\nScore 0-10:"


def score_by_word(body: dict) -> tuple[int, dict]:
    """Judge stand-in: 9 for an answer containing 'good', else 2."""
    return 200, chat_reply("9" if "good" in user_content(body).split("Answer:")[1] else "2")


def make_judge(url: str, **overrides) -> Judge:
    settings = {"timeout_s": 2.0, "retries": 0, "backoff_s": 0.0, "concurrency": 4} | overrides
    return Judge(JudgeConfig(url=url, **settings))


def score(judge: Judge, completions: list[str], low: float = 0, high: float = 10):
    n = len(completions)
    return judge.score("quality", TEMPLATE, low, high, ["p"] * n, completions, ["ref"] * n)


def test_url_forms_and_rejections():
    assert chat_completions_url("http://127.0.0.1:8080") == "http://127.0.0.1:8080/v1/chat/completions"
    assert chat_completions_url("http://127.0.0.1:8080/v1/") == "http://127.0.0.1:8080/v1/chat/completions"
    assert chat_completions_url("http://h/x/chat/completions") == "http://h/x/chat/completions"
    for bad in ("ftp://127.0.0.1/v1", "127.0.0.1:8080", "http://u:secret@127.0.0.1/v1", "http://h/v1?x=1"):
        with pytest.raises(ValueError) as err:
            chat_completions_url(bad)
        assert "secret" not in str(err.value)


def test_parse_score_takes_first_number_and_rejects_out_of_range():
    assert parse_score("8", 0, 10) == 8
    assert parse_score("Score: 7.5/10 because...", 0, 10) == 7.5
    with pytest.raises(ValueError, match="no number"):
        parse_score("looks fine", 0, 10)
    with pytest.raises(ValueError, match="outside range"):
        parse_score("15", 0, 10)


def test_render_fills_placeholders_once_and_keeps_other_braces():
    text = render('{"score": n} {prompt}|{completion}|{answer}', "P", "says {answer}", "A")
    assert text == '{"score": n} P|says {answer}|A'


def test_scores_are_normalised_and_requests_carry_template_model_and_system():
    with JudgeServer(score_by_word) as server:
        judge = make_judge(server.url, model="judge-model", system="You grade code.", max_tokens=5)
        batch = score(judge, ["good code", "bad code"])
    assert batch.raw == [9, 2]
    assert batch.scores == pytest.approx([0.9, 0.2])
    assert batch.errors == []
    assert server.paths == ["/v1/chat/completions"] * 2
    body = server.requests[0]
    assert body["model"] == "judge-model" and body["max_tokens"] == 5 and body["temperature"] == 0.0
    assert body["messages"][0] == {"role": "system", "content": "You grade code."}
    sent = sorted(user_content(b) for b in server.requests)
    assert sent[0] == "Task: p\nAnswer: bad code\nReference: ref\nScore 0-10:"


def test_token_usage_is_summed_from_responses():
    replies = iter([chat_reply("5", 100, 3), chat_reply("6", 40, 2)])
    with JudgeServer(lambda body: (200, next(replies))) as server:
        batch = score(make_judge(server.url, concurrency=1), ["a", "b"])
    assert batch.api_tokens == 145
    assert batch.requests == 2


def test_missing_usage_counts_zero_tokens_but_still_scores():
    with JudgeServer(lambda body: (200, chat_reply("4", usage=False))) as server:
        batch = score(make_judge(server.url), ["a"])
    assert batch.scores == [pytest.approx(0.4)] and batch.api_tokens == 0


def test_identical_requests_in_a_batch_are_sent_once():
    with JudgeServer(score_by_word) as server:
        batch = score(make_judge(server.url), ["good", "good", "good", "bad"])
    assert len(server.requests) == 2
    assert batch.scores == pytest.approx([0.9, 0.9, 0.9, 0.2])


def test_slow_judge_times_out_into_missing_scores():
    with JudgeServer(score_by_word, delay_s=10) as server:
        judge = make_judge(server.url, timeout_s=0.4, retries=1, backoff_s=0.05)
        start = time.monotonic()
        batch = score(judge, ["good", "bad"])
        elapsed = time.monotonic() - start
    assert elapsed < 3.0
    assert batch.scores == [None, None]
    assert len(batch.errors) == 2
    assert all(e.attempts == 2 and "within 0.4 s" in e.message for e in batch.errors)
    assert len(server.requests) == 4  # first try + one retry, per completion


def test_failing_judge_is_retried_then_missing():
    with JudgeServer(lambda body: (500, {"error": "model crashed"})) as server:
        batch = score(make_judge(server.url, retries=2, backoff_s=0.01), ["good"])
    assert batch.scores == [None]
    assert len(server.requests) == 3
    assert batch.errors[0].attempts == 3
    assert "HTTP 500" in batch.errors[0].message and "model crashed" in batch.errors[0].message


def test_client_errors_and_unusable_replies_are_not_retried():
    with JudgeServer(lambda body: (404, {"error": "no such model"})) as server:
        batch = score(make_judge(server.url, retries=3), ["x"])
    assert len(server.requests) == 1 and "HTTP 404" in batch.errors[0].message

    replies = {"a": "I cannot rate this", "b": "42", "c": "7"}
    with JudgeServer(lambda body: (200, chat_reply(replies[user_content(body).split("Answer: ")[1][0]]))) as server:
        batch = score(make_judge(server.url, retries=3), ["a", "b", "c"])
    assert len(server.requests) == 3
    assert batch.scores[:2] == [None, None] and batch.scores[2] == pytest.approx(0.7)
    messages = sorted(e.message for e in batch.errors)
    assert "no number" in messages[0] and "outside range [0, 10]" in messages[1]
    assert batch.api_tokens == 36  # tokens spent on unusable replies still count


def test_unreachable_judge_gives_missing_scores():
    with socket.socket() as probe:  # find a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    batch = score(make_judge(f"http://127.0.0.1:{port}/v1", retries=1, backoff_s=0.01), ["a"])
    assert batch.scores == [None]
    assert "cannot reach" in batch.errors[0].message and batch.errors[0].attempts == 2


def test_requests_run_concurrently_up_to_the_limit():
    completions = [f"answer {i}" for i in range(8)]
    with JudgeServer(lambda body: (200, chat_reply("5")), delay_s=0.5) as server:
        start = time.monotonic()
        batch = score(make_judge(server.url, concurrency=8), completions)
        elapsed = time.monotonic() - start
    assert batch.scores == [0.5] * 8
    assert elapsed < 1.5  # one request takes 0.5 s; eight in a row would take 4 s
    assert server.max_in_flight == 8

    with JudgeServer(lambda body: (200, chat_reply("5")), delay_s=0.2) as server:
        score(make_judge(server.url, concurrency=3), completions)
    assert server.max_in_flight == 3


def test_only_the_configured_url_is_contacted(monkeypatch):
    with JudgeServer(score_by_word) as elsewhere, JudgeServer(score_by_word) as proxy:
        # A redirect to another host is not followed...
        with JudgeServer(lambda body: (302, ""), headers={"Location": elsewhere.url + "/chat/completions"}) as judge:
            batch = score(make_judge(judge.url), ["good"])
        assert batch.scores == [None] and "HTTP 302" in batch.errors[0].message
        # ...and proxy settings from the environment are ignored.
        monkeypatch.setenv("http_proxy", proxy.base_url)
        monkeypatch.setenv("HTTP_PROXY", proxy.base_url)
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        with JudgeServer(score_by_word) as judge:
            batch = score(make_judge(judge.url), ["good"])
        assert batch.scores == [pytest.approx(0.9)] and len(judge.requests) == 1
    assert elsewhere.requests == [] and proxy.requests == []


def write_judge_rubric(tmp_path, url: str, extra_judge: str = "") -> str:
    path = tmp_path / "rubric.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: review
        judge:
          url: {url}
          timeout: 2
          retries: 0
          concurrency: 4
        {extra_judge}
        criteria:
          - name: has_answer
            weight: 1
            scorer: substring
            text: answer
          - name: quality
            weight: 3
            scorer: judge
            range: [1, 5]
            prompt: "Rate {{completion}} from 1 to 5."
        """))
    return str(path)


def test_judge_criterion_in_a_rubric_with_metrics_and_alerts(tmp_path):
    def reply(body):
        content = user_content(body)
        if "broken" in content:
            return 500, {"error": "boom"}
        return 200, chat_reply("5" if "great" in content else "1", 20, 1)

    with JudgeServer(reply) as server:
        reward = RubricReward(load_rubric(write_judge_rubric(tmp_path, server.url)), criteria_every=10)
        totals = reward(["p"] * 3, ["great answer", "weak answer", "broken"], ["a"] * 3)
    # quality normalised from [1, 5]: great -> 1.0, weak -> 0.0, broken -> missing
    assert totals == pytest.approx([1.0, 0.25, 0.0])
    metrics = reward.step_metrics(step=1)
    assert metrics["judge/api_tokens"] == 42 and metrics["judge/api_tokens_total"] == 42
    assert metrics["judge/failed_requests"] == 1
    assert metrics["criteria/review/quality/mean"] == pytest.approx(0.5)
    assert metrics["scoring/quality/weight"] == 3
    assert reward.end_epoch() == {"epoch/api_tokens": 42}
    assert reward.end_epoch() == {"epoch/api_tokens": 0}
    alerts = reward.take_alerts()
    assert len(alerts) == 1 and alerts[0]["value"] == 1 and alerts[0]["metric"] == "judge/failed_requests"
    assert "criterion 'quality'" in alerts[0]["message"] and "HTTP 500" in alerts[0]["message"]
    assert reward.take_alerts() == []


def test_api_key_comes_from_the_named_env_var_and_is_never_shown(tmp_path, monkeypatch):
    secret = "sk-test-123456"
    monkeypatch.setenv("JUDGE_TEST_KEY", secret)
    with JudgeServer(lambda body: (401, {"error": "bad key"})) as server:
        rubric = load_rubric(write_judge_rubric(tmp_path, server.url, "  api_key_env: JUDGE_TEST_KEY"))
        scores = rubric.score(["p"], ["x"], ["a"])
    assert server.headers[0]["Authorization"] == f"Bearer {secret}"
    shown = " ".join([rubric.describe(), repr(rubric.judge.config), scores.errors[0].message])
    assert secret not in shown

    monkeypatch.delenv("JUDGE_TEST_KEY")
    with pytest.raises(UserError, match=r"rubric.yaml:\d+: judge: api_key_env: environment variable JUDGE_TEST_KEY"):
        load_rubric(write_judge_rubric(tmp_path, "http://127.0.0.1:9/v1", "  api_key_env: JUDGE_TEST_KEY"))


def test_an_error_reply_reads_as_a_sentence_not_a_dict():
    with JudgeServer(lambda body: (401, {"error": {"message": "Invalid API key", "type": "auth", "code": 401}})) as server:
        batch = score(make_judge(server.url, retries=0), ["x"])
    message = batch.errors[0].message
    assert message.startswith(f"HTTP 401 from {server.url}") and "Invalid API key" in message
    assert "{" not in message  # not the reply's JSON


def test_a_judge_that_is_down_is_not_asked_again_for_a_few_batches():
    from mlx_grpo.rewards.judge import SKIP_AFTER_OUTAGE

    with JudgeServer(lambda body: (500, {"error": "down"})) as server:
        judge = make_judge(server.url, retries=1, backoff_s=0.01)
        first = score(judge, ["a", "b"])
        asked = len(server.requests)
        assert first.scores == [None, None] and asked == 4  # two completions, one retry each
        for _ in range(SKIP_AFTER_OUTAGE):
            skipped = score(judge, ["a", "b"])
            assert skipped.scores == [None, None] and skipped.requests == 0
            assert "not asked: every request of an earlier batch failed (HTTP 500" in skipped.errors[0].message
        assert len(server.requests) == asked
        score(judge, ["a", "b"])  # tried again
        assert len(server.requests) > asked
