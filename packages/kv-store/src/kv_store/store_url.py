"""A store URL as it may be shown: its credentials never printed, logged or put in a report
(KV bytes can reveal prompts, and a URL can carry the password that reads them)."""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

__all__ = ["safe_url", "url_secrets"]

# Query parameters of a URL that carry no secret (redis-py passes any other one to the client).
_PLAIN_QUERY = frozenset(
    {
        "db",
        "protocol",
        "socket_timeout",
        "socket_connect_timeout",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_check_hostname",
    }
)


def safe_url(url: str) -> str:
    """``url`` without credentials: user and password become ``***``, and so does the value of
    any query parameter that might carry one."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            netloc = "***@" + netloc.rpartition("@")[2]
        query = [(k, v if k in _PLAIN_QUERY else "***") for k, v in parse_qsl(parts.query, keep_blank_values=True)]
        # by hand: urlunsplit drops the "//" of an empty netloc (unix:///path)
        tail = f"?{urlencode(query, safe='*')}" if query else ""
        return f"{parts.scheme}://{netloc}{parts.path}{tail}"
    except ValueError:
        return "<unparsable url>"


def url_secrets(url: str) -> list[str]:
    """The strings of ``url`` that must never be shown (both raw and percent-decoded)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    found = [parts.username or "", parts.password or ""]
    found += [v for k, v in parse_qsl(parts.query) if k not in _PLAIN_QUERY]
    found += [unquote(s) for s in found] + [quote(s, safe="") for s in found]
    return sorted({s for s in found if s}, key=len, reverse=True)
