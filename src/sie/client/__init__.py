"""Python SDK for SIE: sync and async clients with the SIE retry contract; imports only `sie.wire`."""
