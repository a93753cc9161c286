"""The SIE retry contract as one pure decision: from an attempt's outcome to a delay or a stop (contracts Part A §2.5).

No I/O, no clock and no sleeping: the caller passes the elapsed time and a random source, and the sync and
async clients drive the decision with their own sleep. The rungs are checked in the order of the contract.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from typing import Protocol

import attrs

from sie.client._failures import ErrorResponse, error_for
from sie.client.errors import (
    LoraLoadingError,
    ModelLoadingError,
    ProvisioningError,
    RateLimitError,
    ResourceExhaustedError,
    SIEConnectionError,
    SIEError,
    SIETimeoutError,
)
from sie.wire.codes import (
    LORA_LOADING,
    MODEL_LOAD_FAILED,
    MODEL_LOADING,
    PROVISIONING,
    QUEUE_FULL,
    RESOURCE_EXHAUSTED,
    TRANSPORT_FAILURE,
)

DEFAULT_PROVISION_TIMEOUT_S = 900.0
DEFAULT_MAX_OOM_RETRIES = 3
CAPACITY_DEFAULT_DELAY_S = 5.0  # connect/transport errors, PROVISIONING, MODEL_LOADING, 504
LORA_LOADING_DEFAULT_DELAY_S = 1.0
LORA_LOADING_MAX_RETRIES = 10
OOM_BASE_DELAY_S = 5.0
OOM_MAX_DELAY_S = 30.0
ADMISSION_DEFAULT_DELAY_S = 1.0  # 429 and backpressure 503s
JITTER_FRACTION = 0.25  # default delays are drawn from [0.75 d, d]: never longer than the caller budgeted

# Admission codes only the public gateway sends today, so sie.wire.codes does not list them.
BILLING_CAPACITY_UNAVAILABLE = "BILLING_CAPACITY_UNAVAILABLE"
QUEUE_UNAVAILABLE = "QUEUE_UNAVAILABLE"
_BACKPRESSURE_CODES = frozenset({QUEUE_FULL, BILLING_CAPACITY_UNAVAILABLE})
_HINTED_BACKPRESSURE_CODES = frozenset({QUEUE_UNAVAILABLE, TRANSPORT_FAILURE})


class Random(Protocol):
    """The part of `random.Random` the jitter uses; tests pass a stub to pin the draw."""

    def uniform(self, a: float, b: float, /) -> float: ...


class TransportKind(enum.Enum):
    """How an attempt failed before a response arrived; the client's HTTP seam classifies its library's errors."""

    CONNECT = "connect"  # could not connect, for a reason that may pass (refused, reset, unreachable)
    CONNECT_PERMANENT = "connect_permanent"  # TLS failure or an errno that will not pass: never retried
    BROKEN = "broken"  # write timeout, write/read error, protocol error: the peer cut the exchange short
    READ_TIMEOUT = "read_timeout"  # sent, then no answer: the server may be working on it, never retried
    OTHER = "other"  # anything else the HTTP library raises: never retried


@attrs.frozen(kw_only=True)
class TransportFailure:
    """An attempt that ended without a response; `message` is what the stop error will say."""

    kind: TransportKind
    message: str
    timeout: bool = False


Outcome = ErrorResponse | TransportFailure


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """The per-call knobs of an inference call, plus what the stop errors name (model, gpu, LoRA)."""

    wait_for_capacity: bool = True
    max_oom_retries: int = DEFAULT_MAX_OOM_RETRIES
    provision_timeout_s: float = DEFAULT_PROVISION_TIMEOUT_S
    model: str | None = None
    gpu: str | None = None
    lora: str | None = None
    # False for calls the contract never retries (the model catalogue reads): every outcome is terminal.
    retries_enabled: bool = True
    # False for generation, which may run twice if sent twice: only signals that come before the work was
    # published are retried, never a connection lost mid-request or a 504.
    idempotent: bool = True


@attrs.frozen
class RetryState:
    """What the ladder remembers between attempts of one call."""

    retries: int = 0
    lora_retries: int = 0
    oom_retries: int = 0
    # Set after a capacity wait (PROVISIONING, MODEL_LOADING) that may have used the whole budget: the next
    # attempt still goes out, with the client's own timeouts, instead of failing before it is sent.
    after_capacity_wait: bool = False


@attrs.frozen
class Retry:
    """Sleep `delay` seconds, then attempt again with `state`."""

    delay: float
    state: RetryState


@attrs.frozen
class Stop:
    """Give up: raise `error`."""

    error: SIEError


Decision = Retry | Stop


def apply_jitter(delay: float, rng: Random) -> float:
    """Draw a delay from [0.75·delay, delay]: jitter only downward, so caps and budgets still hold."""
    if delay <= 0:
        return 0.0
    return max(0.0, rng.uniform(delay * (1.0 - JITTER_FRACTION), delay))


def compute_oom_backoff(retry_after: float | None, attempt: int, *, rng: Random | None = None) -> float:
    """Delay before RESOURCE_EXHAUSTED retry `attempt` (0-based): a first server hint verbatim (≤ 30 s), then
    max(5, hint)·2^attempt capped at 30 s and jittered when `rng` is given.

    Vectors (contracts Part B §2.3): None → 5, 10, 20, 30; 20 → 20, 30, 30, 30; 0 or −3 → 0, 10, 20, 30.
    """
    hint = None if retry_after is None else max(retry_after, 0.0)
    if hint is not None and attempt == 0:
        return min(hint, OOM_MAX_DELAY_S)
    # A hint above the base keeps the schedule from dropping below what the server asked for; a zero hint
    # falls back to the base instead of collapsing every delay to zero.
    base = OOM_BASE_DELAY_S if hint is None else max(OOM_BASE_DELAY_S, hint)
    delay = min(base * 2**attempt, OOM_MAX_DELAY_S)
    return delay if rng is None else apply_jitter(delay, rng)


@attrs.frozen
class _Attempt:
    """Everything one decision reads; the rungs below are small functions of it."""

    outcome: Outcome
    state: RetryState
    elapsed: float
    policy: RetryPolicy
    rng: Random

    @property
    def remaining(self) -> float:
        return self.policy.provision_timeout_s - self.elapsed

    @property
    def budget_spent(self) -> bool:
        return self.elapsed >= self.policy.provision_timeout_s

    def response(self, status: int, *codes: str) -> ErrorResponse | None:
        """The outcome when it is an error response with this status (and one of `codes`, if given)."""
        outcome = self.outcome
        if not isinstance(outcome, ErrorResponse) or outcome.status_code != status:
            return None
        return outcome if not codes or outcome.code in codes else None

    def retry(self, delay: float, *, capacity_wait: bool = False, lora: int = 0, oom: int = 0) -> Retry:
        state = self.state
        return Retry(
            delay,
            RetryState(state.retries + 1, state.lora_retries + lora, state.oom_retries + oom, capacity_wait),
        )

    def hint_or_jittered(self, response: ErrorResponse, default: float) -> float:
        """The server's Retry-After verbatim, else `default` capped by the budget and jittered."""
        if response.retry_after is not None:
            return response.retry_after
        return apply_jitter(min(default, self.remaining), self.rng)


def terminal_error(outcome: Outcome, policy: RetryPolicy) -> SIEError:
    """The exception an outcome becomes when nothing retries it."""
    if isinstance(outcome, TransportFailure):
        return SIETimeoutError(outcome.message) if outcome.timeout else SIEConnectionError(outcome.message)
    return error_for(outcome, model=policy.model)


def _transport(at: _Attempt) -> Decision | None:
    outcome = at.outcome
    if not isinstance(outcome, TransportFailure):
        return None
    retryable = outcome.kind is TransportKind.CONNECT or (outcome.kind is TransportKind.BROKEN and at.policy.idempotent)
    if retryable and at.policy.wait_for_capacity and not at.budget_spent:
        return at.retry(apply_jitter(min(CAPACITY_DEFAULT_DELAY_S, at.remaining), at.rng))
    return Stop(terminal_error(outcome, at.policy))


def _model_load_failed(at: _Attempt) -> Decision | None:
    response = at.response(502, MODEL_LOAD_FAILED)
    return None if response is None else Stop(error_for(response, model=at.policy.model))


def _provisioning(at: _Attempt) -> Decision | None:
    response = at.response(503, PROVISIONING)
    if response is None:
        return None
    gpu, hint = at.policy.gpu, response.retry_after
    if not at.policy.wait_for_capacity:
        message = f"No capacity available for GPU '{gpu}'. Server is provisioning."
        return Stop(ProvisioningError(message, gpu=gpu, retry_after=hint))
    if at.budget_spent:
        message = f"Provisioning timeout after {at.elapsed:.1f}s waiting for GPU '{gpu}'"
        return Stop(ProvisioningError(message, gpu=gpu, retry_after=hint))
    delay = min(at.hint_or_jittered(response, CAPACITY_DEFAULT_DELAY_S), at.remaining)
    return at.retry(delay, capacity_wait=True)


def _lora_loading(at: _Attempt) -> Decision | None:
    response = at.response(503, LORA_LOADING)
    if response is None:
        return None
    if at.state.lora_retries + 1 > LORA_LOADING_MAX_RETRIES:
        message = f"LoRA loading timeout after {at.state.lora_retries + 1} retries"
        return Stop(LoraLoadingError(message, lora=at.policy.lora, model=at.policy.model))
    delay = response.retry_after if response.retry_after is not None else LORA_LOADING_DEFAULT_DELAY_S
    return at.retry(delay, lora=1)


def _model_loading(at: _Attempt) -> Decision | None:
    response = at.response(503, MODEL_LOADING)
    if response is None:
        return None
    if at.budget_spent:
        message = f"Model loading timeout after {at.elapsed:.1f}s for '{at.policy.model}'"
        return Stop(ModelLoadingError(message, model=at.policy.model))
    delay = response.retry_after if response.retry_after is not None else CAPACITY_DEFAULT_DELAY_S
    return at.retry(min(delay, at.remaining), capacity_wait=True)


def _resource_exhausted(at: _Attempt) -> Decision | None:
    response = at.response(503, RESOURCE_EXHAUSTED)
    if response is None:
        return None
    done = at.state.oom_retries
    if done < at.policy.max_oom_retries and not at.budget_spent:
        delay = compute_oom_backoff(response.retry_after, done, rng=at.rng)
        # A wait that would use up the budget leaves no time for the retried request: report the real
        # cause now rather than a provisioning timeout later.
        if delay < at.remaining:
            return at.retry(delay, oom=1)
    message = f"Server resource exhausted after {done} retry attempt(s) for model '{at.policy.model}'"
    return Stop(ResourceExhaustedError(message, model=at.policy.model, retries=done, retry_after=response.retry_after))


def _admission(at: _Attempt) -> Decision | None:
    rate_limited = at.response(429)
    backpressure = at.response(503, *_BACKPRESSURE_CODES)
    hinted = at.response(503, *_HINTED_BACKPRESSURE_CODES)
    response = rate_limited or backpressure or (hinted if hinted and hinted.retry_after is not None else None)
    if response is None:
        return None
    delay = at.hint_or_jittered(response, ADMISSION_DEFAULT_DELAY_S)
    if delay < at.remaining:
        return at.retry(delay)
    if rate_limited is None:
        return Stop(error_for(response, model=at.policy.model))
    budget = at.policy.provision_timeout_s
    message = f"Rate limited (429); retry budget ({budget:.1f}s) exhausted after {at.elapsed:.1f}s"
    return Stop(RateLimitError(message, retry_after=response.retry_after, param=response.param))


def _gateway_timeout(at: _Attempt) -> Decision | None:
    response = at.response(504)
    if response is None or not at.policy.idempotent or not at.policy.wait_for_capacity or at.budget_spent:
        return None
    delay = response.retry_after if response.retry_after is not None else CAPACITY_DEFAULT_DELAY_S
    return at.retry(min(delay, at.remaining))


# Contracts Part A §2.5, checked in this order; the first rung that answers decides.
LADDER: tuple[Callable[[_Attempt], Decision | None], ...] = (
    _transport,
    _model_load_failed,
    _provisioning,
    _lora_loading,
    _model_loading,
    _resource_exhausted,
    _admission,
    _gateway_timeout,
)


def decide(outcome: Outcome, state: RetryState, *, elapsed: float, policy: RetryPolicy, rng: Random) -> Decision:
    """Retry after a delay, or stop with the error to raise, for one failed attempt of a call.

    `elapsed` is the wall time since the call began; `policy.provision_timeout_s` is its budget.
    """
    if policy.retries_enabled:
        attempt = _Attempt(outcome, state, elapsed, policy, rng)
        for rung in LADDER:
            decision = rung(attempt)
            if decision is not None:
                return decision
    return Stop(terminal_error(outcome, policy))


def attempt_cap(state: RetryState, *, elapsed: float, policy: RetryPolicy) -> float | Stop:
    """Seconds that cap the next attempt's timeouts, or a stop when the budget ran out before it could be sent.

    The attempt right after a capacity wait goes out even with no budget left, uncapped (infinite cap).
    """
    remaining = policy.provision_timeout_s - elapsed
    if remaining > 0:
        return remaining
    if state.after_capacity_wait:
        return math.inf
    message = f"Provision timeout ({policy.provision_timeout_s:.1f}s) exceeded before request could be sent"
    return Stop(ProvisioningError(message, gpu=policy.gpu))
