"""Every NATS subject, stream and consumer name the system uses, built in this one module.

Lane subjects follow seed 000 §8 and contracts Part A §2.2: the pool is used as given, every other
token goes through normalize_model_id so a subject always has exactly six (or seven) tokens.
"""

from __future__ import annotations

from sie.catalog.ids import normalize_model_id, normalize_worker_id

WORK_SUBJECT_PREFIX = "sie.work"
DEAD_LETTER_PREFIX = "sie.dlq"
DEAD_LETTER_STREAM = "DEAD_LETTERS"
CONFIG_SUBJECT_PREFIX = "sie.config.models"
CONFIG_ALL_SUBJECT = f"{CONFIG_SUBJECT_PREFIX}._all"
HEALTH_SUBJECT_PREFIX = "sie.health"
HEALTH_WILDCARD = f"{HEALTH_SUBJECT_PREFIX}.>"
WORK_CANCEL_PREFIX = "work_cancel"
GENERATE_CANCEL_PREFIX = "cancel"
BATCH_CANCEL_PREFIX = "batch_cancel"
INBOX_PREFIX = "_INBOX"
MAX_DELIVERIES_ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>"
# A lane work subject has six tokens; a worker direct-dispatch subject one more, the worker (seed 000 §8.2).
LANE_SUBJECT_TOKENS = 6
WORKER_SUBJECT_TOKENS = 7


def work_subject(pool: str, machine_profile: str, bundle: str, model_id: str) -> str:
    """`sie.work.{pool}.{mp}.{bundle}.{model}`, the subject a gateway publishes one work item to."""
    return ".".join(
        (
            WORK_SUBJECT_PREFIX,
            pool,
            normalize_model_id(machine_profile),
            normalize_model_id(bundle),
            normalize_model_id(model_id),
        )
    )


def work_subject_pool(subject: str) -> str | None:
    """The pool token of a work subject `sie.work.{pool}.…`; None for any other subject."""
    if not subject.startswith(f"{WORK_SUBJECT_PREFIX}."):
        return None
    pool = subject[len(WORK_SUBJECT_PREFIX) + 1 :].split(".", 1)[0]
    return pool or None


def is_work_worker_subject(subject: str) -> bool:
    """Whether `subject` is a worker direct-dispatch subject: `sie.work.` and seven non-empty tokens in all."""
    tokens = subject.split(".")
    return subject.startswith(f"{WORK_SUBJECT_PREFIX}.") and len(tokens) == WORKER_SUBJECT_TOKENS and all(tokens)


def work_worker_subject(pool: str, machine_profile: str, bundle: str, model_id: str, worker_id: str) -> str:
    """The seven-token direct-dispatch subject for one worker."""
    return f"{work_subject(pool, machine_profile, bundle, model_id)}.{normalize_worker_id(worker_id)}"


def lane_filter_subject(pool: str, machine_profile: str, bundle: str) -> str:
    """The durable consumer filter of one lane: `sie.work.{pool}.{mp}.{bundle}.*`."""
    return f"{WORK_SUBJECT_PREFIX}.{pool}.{normalize_model_id(machine_profile)}.{normalize_model_id(bundle)}.*"


def work_pool_stream_name(pool: str) -> str:
    """`WORK_POOL_{pool}`."""
    return f"WORK_POOL_{pool}"


def work_pool_stream_subjects(pool: str) -> list[str]:
    """The only subject a pool stream captures: one token each for profile, bundle and model."""
    return [f"{WORK_SUBJECT_PREFIX}.{pool}.*.*.*"]


def work_consumer_name(pool: str, machine_profile: str, bundle: str) -> str:
    """The durable lane consumer: `{pool}_{mp}_{bundle}`, each token normalised."""
    return "_".join(normalize_model_id(token) for token in (pool, machine_profile, bundle))


def work_worker_stream_name(worker_id: str) -> str:
    """`WORK_WORKER_{worker}`."""
    return f"WORK_WORKER_{normalize_worker_id(worker_id)}"


def work_worker_stream_subjects(pool: str, machine_profile: str, bundle: str, worker_id: str) -> list[str]:
    """Subjects of one worker's direct-dispatch stream."""
    lane = lane_filter_subject(pool, machine_profile, bundle)
    return [f"{lane}.{normalize_worker_id(worker_id)}"]


def work_worker_consumer_name(worker_id: str) -> str:
    """`gen-{worker}`."""
    return f"gen-{normalize_worker_id(worker_id)}"


def max_deliveries_advisory_subject(stream: str, consumer: str) -> str:
    """The advisory JetStream publishes when a message of `consumer` on `stream` hits max_deliver."""
    return f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{consumer}"


def reply_subject(router_id: str, request_id: str) -> str:
    """`_INBOX.{router_id}.{request_id}`, where one request's results arrive."""
    return f"{INBOX_PREFIX}.{router_id}.{request_id}"


def inbox_wildcard(router_id: str) -> str:
    """The one app-wide result subscription of a gateway."""
    return f"{INBOX_PREFIX}.{router_id}.>"


def config_subject(bundle: str) -> str:
    """`sie.config.models.{bundle}`, the bundle-scoped config delta subject."""
    return f"{CONFIG_SUBJECT_PREFIX}.{bundle}"


def health_subject(worker_id: str) -> str:
    """`sie.health.{worker}`, one worker's heartbeat subject."""
    return f"{HEALTH_SUBJECT_PREFIX}.{normalize_worker_id(worker_id)}"


def work_cancel_subject(router_id: str, request_id: str) -> str:
    """`work_cancel.{router_id}.{request_id}`, the best-effort abandonment signal."""
    return f"{WORK_CANCEL_PREFIX}.{router_id}.{request_id}"


def generate_cancel_subject(router_id: str, request_id: str) -> str:
    """`cancel.{router_id}.{request_id}`: the gateway stopped waiting for a generation (seed 001, Generation); the
    sidecar forwards it to the worker as SignalGenerateCancel."""
    return f"{GENERATE_CANCEL_PREFIX}.{router_id}.{request_id}"


def batch_cancel_subject(router_id: str, worker_id: str, request_id: str) -> str:
    """`batch_cancel.{router_id}.{worker}.{request_id}` (seed 000 §8.2): the request's worker direct-dispatch items
    were published again on the lane and stored there, so the worker drops those still queued on its own stream."""
    return f"{BATCH_CANCEL_PREFIX}.{router_id}.{normalize_worker_id(worker_id)}.{request_id}"


def batch_cancel_wildcard(worker_id: str) -> str:
    """`batch_cancel.*.{worker}.*`: every batch_cancel addressed to one worker, from any gateway."""
    return f"{BATCH_CANCEL_PREFIX}.*.{normalize_worker_id(worker_id)}.*"


def dead_letter_subject(work_subject_text: str) -> str:
    """`sie.dlq.{model_token}` from the sixth token of an original work subject."""
    model_token = work_subject_text.split(".")[5]
    return f"{DEAD_LETTER_PREFIX}.{model_token.replace('/', '_')}"
