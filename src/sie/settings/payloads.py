"""Payload offload (seed 000 §16.2, seed 001 "Preparation And Framing"): where work-item payloads too large to
travel inline are stored, when the gateway offloads one, and how much a sidecar reads back. `--role all` passes
work items by reference and never offloads.
"""

from __future__ import annotations

import attrs

from sie.settings._parsers import byte_size, seconds, text
from sie.settings._spec import Env, setting


@attrs.frozen
class PayloadSettings:
    """The payload store shared by gateways and sidecars, and its limits."""

    store_url: str | None = setting(
        Env(
            "SIE_PAYLOAD_STORE_URL",
            text(),
            "Payload store for work items too large to travel inline: a local directory, `s3://bucket/prefix`, "
            "`gs://bucket/prefix` or `abfs://container/prefix` (Azure Blob / ADLS Gen2; `abfss://`, `az://` too). "
            "Credentials come from the backend's usual environment: AWS_*, GOOGLE_APPLICATION_CREDENTIALS, or "
            "AZURE_STORAGE_CONNECTION_STRING (else AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY, "
            "AZURE_STORAGE_SAS_TOKEN or DefaultAzureCredential). Gateways write, sidecars read; set the same store "
            "on both. Unset: nothing is offloaded, and an item that does not fit the broker's max_payload is refused "
            "with 413 PAYLOAD_TOO_LARGE.",
            roles=("gateway", "sidecar"),
            read_by=("sie.roles.gateway", "sie.sidecar.sidecar"),
        ),
        None,
    )
    inline_limit_bytes: int = setting(
        Env(
            "SIE_PAYLOAD_INLINE_LIMIT_BYTES",
            byte_size(),
            "A work item whose encoded payload is larger goes through the payload store (when one is set); the "
            "broker's max_payload lowers it when smaller.",
            roles=("gateway",),
            read_by=("sie.roles.gateway",),
        ),
        2**20,
    )
    sweep_age_s: float = setting(
        Env(
            "SIE_PAYLOAD_SWEEP_AGE_S",
            seconds(),
            "Payloads older than this are deleted by the gateways' sweep of the store (run every tenth of it): what a "
            "gateway that crashed mid-request left behind. Make it longer than any request lives "
            "(SIE_GATEWAY_REQUEST_TIMEOUT_S); 0 turns the sweep off (leave it to the bucket's lifecycle rule).",
            roles=("gateway",),
            read_by=("sie.roles.gateway",),
        ),
        3600.0,
    )
    fetch_max_bytes: int = setting(
        Env(
            "SIE_PAYLOAD_FETCH_MAX_BYTES",
            byte_size(),
            "Largest offloaded payload a sidecar reads back; a larger one fails its item with PAYLOAD_TOO_LARGE. "
            "Sized for the widest request body a gateway accepts plus its encoding overhead.",
            roles=("sidecar",),
            read_by=("sie.sidecar.sidecar",),
        ),
        272 * 2**20,
    )
