"""Builders for the error bodies SIE clients parse (contracts Part B §1.7, §1.10; seed 000 §2).

Each returns a plain dict for codec.py; choosing which envelope and status a failure gets is the job of
each surface's error mapping, not of this module.
"""

from __future__ import annotations

from typing import Any


def detail_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """SIE-native error: `{"detail": {"code", "message", ...extra}}` (validation, routing, 502 detail fields)."""
    return {"detail": {"code": code, "message": message, **extra}}


def retry_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """SDK retry contract: `{"error": {"code", "message", ...extra}}` for retryable 503s, provisioning and 502."""
    return {"error": {"code": code, "message": message, **extra}}


def openai_body(message: str, error_type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI-compatible error: `{"error": {"message", "type", "param", "code"}}`, all four keys always present."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def all_items_failed_body(details: list[dict[str, Any]]) -> dict[str, Any]:
    """Gateway 500 when items failed with mixed codes: `{"error": "all_items_failed", "details": [...]}`.

    Each detail is `{"item_index", "error", "code"?}` (contracts Part B §1.10).
    """
    return {"error": "all_items_failed", "details": details}


def status_body(status: str, message: str, **extra: Any) -> dict[str, Any]:
    """Gateway routing refusal: `{"status", ...extra, "message"}` (contracts Part B §1.10, `gpu_not_configured`)."""
    return {"status": status, **extra, "message": message}
