"""The retry contract alone, rung by rung (sie.client._retry; contracts Part A §2.5, Part B §2.3)."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from sie.client import compute_oom_backoff
from sie.client._failures import ErrorResponse
from sie.client._retry import (
    LADDER,
    Retry,
    RetryPolicy,
    RetryState,
    Stop,
    TransportFailure,
    TransportKind,
    apply_jitter,
    attempt_cap,
    decide,
)
from sie.client.errors import (
    InputTooLongError,
    LoraLoadingError,
    ModelLoadFailedError,
    ModelLoadingError,
    ProvisioningError,
    RateLimitError,
    RequestError,
    ResourceExhaustedError,
    ServerError,
    SIEConnectionError,
    SIETimeoutError,
)


class Draw:
    """A random source pinned to one end of the jitter range: 'top' = no jitter, 'bottom' = the full 25%."""

    def __init__(self, end: str) -> None:
        self.end = end

    def uniform(self, a: float, b: float) -> float:
        return b if self.end == "top" else a


NO_JITTER, FULL_JITTER = Draw("top"), Draw("bottom")


def resp(status: int, code: str | None = None, retry_after: float | None = None, **fields: Any) -> ErrorResponse:
    return ErrorResponse(
        status_code=status, code=code, message=f"{status} {code}", retry_after=retry_after, fields=fields
    )


def transport(kind: TransportKind, *, timeout: bool = False) -> TransportFailure:
    return TransportFailure(kind=kind, message=f"{kind.value} failed", timeout=timeout)


def run(
    outcome: Any,
    *,
    state: RetryState | None = None,
    elapsed: float = 0.0,
    rng: Draw = NO_JITTER,
    **policy: Any,
) -> Retry | Stop:
    policy.setdefault("model", "org/m")
    return decide(outcome, state or RetryState(), elapsed=elapsed, policy=RetryPolicy(**policy), rng=rng)


# (id, outcome, run keywords, expected delay) — every retried case of the ladder.
RETRIES = [
    # 1. Connect and transport errors: only with wait_for_capacity, 5 s jittered down by up to 25%.
    ("connect", transport(TransportKind.CONNECT), {}, 5.0),
    ("connect-jittered", transport(TransportKind.CONNECT), {"rng": FULL_JITTER}, 3.75),
    ("connect-capped-by-budget", transport(TransportKind.CONNECT), {"elapsed": 898.0}, 2.0),
    ("broken-connection", transport(TransportKind.BROKEN), {}, 5.0),
    ("write-timeout", transport(TransportKind.BROKEN, timeout=True), {"rng": FULL_JITTER}, 3.75),
    # 3. PROVISIONING: Retry-After verbatim, else 5 s jittered; both capped by the budget.
    ("provisioning-hint", resp(503, "PROVISIONING", 7.0), {"rng": FULL_JITTER}, 7.0),
    ("provisioning-default", resp(503, "PROVISIONING"), {"rng": FULL_JITTER}, 3.75),
    ("provisioning-capped", resp(503, "PROVISIONING", 100.0), {"elapsed": 890.0}, 10.0),
    # 4. LORA_LOADING: always, Retry-After or 1 s.
    ("lora-default", resp(503, "LORA_LOADING"), {"wait_for_capacity": False}, 1.0),
    ("lora-hint", resp(503, "LORA_LOADING", 3.0), {}, 3.0),
    ("lora-tenth", resp(503, "LORA_LOADING"), {"state": RetryState(lora_retries=9)}, 1.0),
    # 5. MODEL_LOADING: always, Retry-After or 5 s (not jittered), capped by the budget.
    ("model-loading-hint", resp(503, "MODEL_LOADING", 2.0), {"wait_for_capacity": False}, 2.0),
    ("model-loading-default", resp(503, "MODEL_LOADING"), {"rng": FULL_JITTER}, 5.0),
    ("model-loading-capped", resp(503, "MODEL_LOADING", 5.0), {"elapsed": 899.0}, 1.0),
    # 6. RESOURCE_EXHAUSTED: first min(RA, 30) verbatim, then max(5, RA)·2^n capped at 30 and jittered.
    ("oom-first-hint", resp(503, "RESOURCE_EXHAUSTED", 3.0), {"rng": FULL_JITTER}, 3.0),
    ("oom-first-hint-capped", resp(503, "RESOURCE_EXHAUSTED", 90.0), {}, 30.0),
    ("oom-first-default", resp(503, "RESOURCE_EXHAUSTED"), {}, 5.0),
    (
        "oom-second-jittered",
        resp(503, "RESOURCE_EXHAUSTED"),
        {"state": RetryState(oom_retries=1), "rng": FULL_JITTER},
        7.5,
    ),
    ("oom-without-wait", resp(503, "RESOURCE_EXHAUSTED"), {"wait_for_capacity": False}, 5.0),
    # 7. Admission: 429 and QUEUE_FULL/BILLING: RA else 1 s jittered; QUEUE_UNAVAILABLE/transport_failure with RA only.
    ("429-hint", resp(429, "RATE_LIMIT", 2.0), {"wait_for_capacity": False}, 2.0),
    ("429-default", resp(429), {"rng": FULL_JITTER}, 0.75),
    ("queue-full-default", resp(503, "QUEUE_FULL"), {}, 1.0),
    ("queue-full-hint", resp(503, "QUEUE_FULL", 4.0), {"rng": FULL_JITTER}, 4.0),
    ("billing-capacity", resp(503, "BILLING_CAPACITY_UNAVAILABLE"), {}, 1.0),
    ("queue-unavailable-hinted", resp(503, "QUEUE_UNAVAILABLE", 2.0), {}, 2.0),
    ("transport-failure-hinted", resp(503, "transport_failure", 0.5), {}, 0.5),
    # 8. 504: only with wait_for_capacity, Retry-After or 5 s.
    ("gateway-timeout-default", resp(504, "GATEWAY_TIMEOUT"), {"rng": FULL_JITTER}, 5.0),
    ("gateway-timeout-hint", resp(504, None, 3.0), {}, 3.0),
]


@pytest.mark.parametrize(("outcome", "keywords", "delay"), [case[1:] for case in RETRIES], ids=[c[0] for c in RETRIES])
def test_retried_outcomes_wait_the_contract_delay(outcome, keywords, delay):
    decision = run(outcome, **keywords)
    assert isinstance(decision, Retry)
    assert decision.delay == pytest.approx(delay)


# (id, outcome, run keywords, expected exception class, expected attributes)
STOPS = [
    ("connect-without-wait", transport(TransportKind.CONNECT), {"wait_for_capacity": False}, SIEConnectionError, {}),
    ("connect-budget-spent", transport(TransportKind.CONNECT), {"elapsed": 900.0}, SIEConnectionError, {}),
    ("connect-permanent", transport(TransportKind.CONNECT_PERMANENT), {}, SIEConnectionError, {}),
    ("broken-without-wait", transport(TransportKind.BROKEN), {"wait_for_capacity": False}, SIEConnectionError, {}),
    ("read-timeout-never", transport(TransportKind.READ_TIMEOUT, timeout=True), {}, SIETimeoutError, {}),
    ("other-transport", transport(TransportKind.OTHER), {}, SIEConnectionError, {}),
    (
        "model-load-failed",
        resp(502, "MODEL_LOAD_FAILED", 5.0, message="gated", error_class="GATED", permanent=False, attempts=3),
        {},
        ModelLoadFailedError,
        {"error_class": "GATED", "permanent": False, "attempts": 3, "model": "org/m", "status_code": 502},
    ),
    ("502-other", resp(502, "BAD_GATEWAY"), {}, ServerError, {"code": "BAD_GATEWAY", "status_code": 502}),
    (
        "provisioning-without-wait",
        resp(503, "PROVISIONING", 120.0),
        {"wait_for_capacity": False, "gpu": "l4"},
        ProvisioningError,
        {"gpu": "l4", "retry_after": 120.0},
    ),
    ("provisioning-budget-spent", resp(503, "PROVISIONING"), {"elapsed": 900.0}, ProvisioningError, {}),
    (
        "lora-eleventh",
        resp(503, "LORA_LOADING"),
        {"state": RetryState(lora_retries=10), "lora": "my-adapter"},
        LoraLoadingError,
        {"lora": "my-adapter", "model": "org/m"},
    ),
    ("model-loading-budget-spent", resp(503, "MODEL_LOADING", 5.0), {"elapsed": 900.0}, ModelLoadingError, {}),
    (
        "oom-disabled",
        resp(503, "RESOURCE_EXHAUSTED", 5.0),
        {"max_oom_retries": 0},
        ResourceExhaustedError,
        {"retries": 0, "retry_after": 5.0, "status_code": 503},
    ),
    (
        "oom-retries-used",
        resp(503, "RESOURCE_EXHAUSTED"),
        {"state": RetryState(oom_retries=3)},
        ResourceExhaustedError,
        {"retries": 3},
    ),
    (
        "oom-next-delay-uses-budget",
        resp(503, "RESOURCE_EXHAUSTED"),
        {"elapsed": 896.0},
        ResourceExhaustedError,
        {"retries": 0},
    ),
    ("429-budget-spent", resp(429, "RATE_LIMIT", 2.0), {"elapsed": 899.0}, RateLimitError, {"retry_after": 2.0}),
    ("queue-full-budget-spent", resp(503, "QUEUE_FULL"), {"elapsed": 900.0}, ServerError, {"code": "QUEUE_FULL"}),
    ("queue-unavailable-unhinted", resp(503, "QUEUE_UNAVAILABLE"), {}, ServerError, {"code": "QUEUE_UNAVAILABLE"}),
    ("transport-failure-unhinted", resp(503, "transport_failure"), {}, ServerError, {"status_code": 503}),
    ("504-without-wait", resp(504, "GATEWAY_TIMEOUT"), {"wait_for_capacity": False}, ServerError, {"status_code": 504}),
    ("504-budget-spent", resp(504), {"elapsed": 900.0}, ServerError, {"status_code": 504}),
    ("503-other-code", resp(503, "MODEL_NOT_LOADED", 5.0), {}, ServerError, {"code": "MODEL_NOT_LOADED"}),
    ("503-no-code", resp(503), {}, ServerError, {"code": None, "status_code": 503}),
    ("500", resp(500, "INFERENCE_ERROR"), {}, ServerError, {"code": "INFERENCE_ERROR", "status_code": 500}),
    ("400", resp(400, "INVALID_INPUT"), {}, RequestError, {"code": "INVALID_INPUT", "status_code": 400}),
    ("400-too-long", resp(400, "INPUT_TOO_LONG"), {}, InputTooLongError, {"model": "org/m"}),
    ("404", resp(404, "MODEL_NOT_FOUND"), {}, RequestError, {"code": "MODEL_NOT_FOUND", "status_code": 404}),
    (
        "catalogue-calls-never-retry",
        resp(503, "MODEL_LOADING", 1.0),
        {"retries_enabled": False},
        ServerError,
        {"code": "MODEL_LOADING"},
    ),
]


@pytest.mark.parametrize(
    ("outcome", "keywords", "error_class", "attributes"), [case[1:] for case in STOPS], ids=[c[0] for c in STOPS]
)
def test_stopped_outcomes_raise_the_contract_error(outcome, keywords, error_class, attributes):
    decision = run(outcome, **keywords)
    assert isinstance(decision, Stop)
    assert type(decision.error) is error_class
    for name, value in attributes.items():
        assert getattr(decision.error, name) == value, name


def test_the_ladder_is_checked_in_the_contract_order():
    names = [rung.__name__ for rung in LADDER]
    assert names == [
        "_transport",
        "_model_load_failed",
        "_provisioning",
        "_lora_loading",
        "_model_loading",
        "_resource_exhausted",
        "_admission",
        "_gateway_timeout",
    ]


def test_model_load_failed_is_raised_even_when_the_caller_would_wait():
    decision = run(resp(502, "MODEL_LOAD_FAILED", 5.0), wait_for_capacity=True)
    assert isinstance(decision, Stop)
    assert isinstance(decision.error, ModelLoadFailedError)
    assert decision.error.permanent is True
    assert decision.error.attempts == 1


def test_each_retry_counts_and_only_its_own_counter_moves():
    start = RetryState(retries=2, lora_retries=1, oom_retries=1, after_capacity_wait=True)
    lora = run(resp(503, "LORA_LOADING"), state=start)
    oom = run(resp(503, "RESOURCE_EXHAUSTED"), state=start)
    queue = run(resp(503, "QUEUE_FULL"), state=start)
    assert isinstance(lora, Retry) and isinstance(oom, Retry) and isinstance(queue, Retry)
    assert lora.state == RetryState(retries=3, lora_retries=2, oom_retries=1, after_capacity_wait=False)
    assert oom.state == RetryState(retries=3, lora_retries=1, oom_retries=2, after_capacity_wait=False)
    assert queue.state == RetryState(retries=3, lora_retries=1, oom_retries=1, after_capacity_wait=False)


@pytest.mark.parametrize("code", ["PROVISIONING", "MODEL_LOADING"])
def test_capacity_waits_let_the_next_attempt_go_out_past_the_budget(code):
    decision = run(resp(503, code, 50.0), elapsed=880.0)
    assert isinstance(decision, Retry)
    assert decision.delay == 20.0
    assert decision.state.after_capacity_wait
    policy = RetryPolicy()
    assert attempt_cap(decision.state, elapsed=900.0, policy=policy) == math.inf


def test_attempts_are_capped_by_the_remaining_budget():
    policy = RetryPolicy(provision_timeout_s=60.0)
    assert attempt_cap(RetryState(), elapsed=20.0, policy=policy) == 40.0
    stop = attempt_cap(RetryState(), elapsed=61.0, policy=RetryPolicy(provision_timeout_s=60.0, gpu="l4"))
    assert isinstance(stop, Stop)
    assert isinstance(stop.error, ProvisioningError)
    assert stop.error.gpu == "l4"


def test_a_zero_retry_after_is_honoured_not_replaced_by_the_default():
    for code in ("MODEL_LOADING", "LORA_LOADING", "QUEUE_FULL", "RESOURCE_EXHAUSTED"):
        decision = run(resp(503, code, 0.0))
        assert isinstance(decision, Retry)
        assert decision.delay == 0.0, code


@pytest.mark.parametrize(
    ("retry_after", "delays"),
    [
        (None, [5, 10, 20, 30]),
        (5, [5, 10, 20, 30]),
        (20, [20, 30, 30, 30]),
        (0, [0, 10, 20, 30]),
        (-3, [0, 10, 20, 30]),
    ],
)
def test_oom_backoff_vectors(retry_after, delays):
    # contracts Part B §2.3, for attempts 0..3.
    assert [compute_oom_backoff(retry_after, attempt) for attempt in range(4)] == delays


def test_oom_backoff_jitters_only_its_own_delays():
    assert compute_oom_backoff(20.0, 0, rng=FULL_JITTER) == 20.0
    assert compute_oom_backoff(None, 0, rng=FULL_JITTER) == 3.75
    assert compute_oom_backoff(20.0, 1, rng=FULL_JITTER) == 22.5


def test_jitter_stays_between_three_quarters_and_the_whole_delay():
    rng = random.Random(7)
    draws = [apply_jitter(8.0, rng) for _ in range(1000)]
    assert min(draws) >= 6.0
    assert max(draws) <= 8.0
    assert max(draws) - min(draws) > 1.5
    assert apply_jitter(0.0, rng) == 0.0
    assert apply_jitter(-1.0, rng) == 0.0
