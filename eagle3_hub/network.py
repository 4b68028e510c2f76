"""Whether an error is the network's (connection refused, DNS failure, timeout): one rule for every call to the Hub.
huggingface_hub raises its HTTP library's errors (httpx, or the httpx2 fork of its newer releases), also wrapped."""

from __future__ import annotations

NETWORK_ERRORS = {"TransportError", "NetworkError", "ConnectError", "TimeoutException", "ProxyError"}


def is_network_error(error: BaseException | None) -> bool:
    """Connection refused, DNS failure, timeout... (httpx or its fork that huggingface_hub may use), also when
    wrapped by another exception."""
    while error is not None:
        if isinstance(error, (ConnectionError, TimeoutError)) or NETWORK_ERRORS & {c.__name__ for c in type(error).__mro__}:
            return True
        error = error.__cause__ or error.__context__
    return False
