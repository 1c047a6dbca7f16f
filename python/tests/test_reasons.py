"""The Python list of reason codes (raftq.reasons) is the server's: parsed from the Rust sources, so the two
cannot drift. When the server gains a reason, add it to raftq/reasons.py with its family and retryability."""

import re
from pathlib import Path
from typing import Set

from raftq import errors, reasons

REPO = Path(__file__).resolve().parents[2]
CODE = re.compile(r'"([A-Z][A-Z0-9_]{2,})"')


def _without_tests(text: str) -> str:
    """Unit-test modules close raftq's files: drop them (their literals are test data)."""
    i = text.find("#[cfg(test)]")
    return text if i < 0 else text[:i]


def _body(text: str, start: int) -> str:
    """The brace-matched block that opens at or after ``start``."""
    i = text.index("{", start)
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i : j + 1]
    return text[i:]


def server_reasons() -> Set[str]:
    """Every reason code the server's sources define:
    - the arms of every `fn reason` (``ApiError::reason``, ``Rejected::reason``, and a shared ``Reason`` type),
    - the elements of every ``*_REASONS`` constant,
    - ``reason: "..."`` in error values, statuses given a reason by hand (``REASON_HEADER, "..."``) and REST
      error bodies written by hand (``"code": "..."``),
    - every code literal of a reason module in ``raftq-proto`` (where the vocabulary is moving).
    """
    found: Set[str] = set()
    files = list((REPO / "src").rglob("*.rs")) + list((REPO / "proto" / "src").rglob("*.rs"))
    assert files, "the Rust sources are not beside the Python package"
    for f in files:
        text = _without_tests(f.read_text())
        if f.parts[-3:-1] == ("proto", "src") and "reason" in f.name.lower():
            found |= set(CODE.findall(text))
            continue
        for m in re.finditer(r"\bfn (reason|as_reason|code)\s*\(", text):
            found |= set(re.findall(r'=>\s*"([A-Z][A-Z0-9_]+)"', _body(text, m.end())))
        for m in re.finditer(r"const [A-Z_]*REASONS\b[^=]*=\s*\[([^\]]*)\]", text):
            found |= set(CODE.findall(m.group(1)))
        found |= set(re.findall(r'\breason:\s*"([A-Z][A-Z0-9_]+)"', text))
        found |= set(re.findall(r'REASON_HEADER,\s*"([A-Z][A-Z0-9_]+)"', text))
        found |= set(re.findall(r'"code":\s*"([A-Z][A-Z0-9_]+)"', text))
    return found


def test_python_reasons_are_exactly_the_servers():
    rust = server_reasons()
    python = set(reasons.SERVER_REASONS)
    assert len(rust) >= 20, f"the parser found too few reasons ({sorted(rust)}): has the server's layout changed?"
    assert rust - python == set(), f"reasons the server sends that raftq/reasons.py lacks: {sorted(rust - python)}"
    assert python - rust == set(), f"reasons raftq/reasons.py lists that the server never sends: {sorted(python - rust)}"


def test_every_reason_maps_to_an_exception_class_with_its_retryability():
    for code, r in reasons.ALL_REASONS.items():
        e = errors.from_reason(code, f"{code}: something")
        assert e.reason == code
        assert e.retryable == r.retryable, code
        if code == "UNKNOWN_OUTCOME":
            assert isinstance(e, errors.UnknownOutcomeError)
        else:
            assert isinstance(e, errors.ServerError)
            assert e.detail == "something", "the reason prefix is stripped from the message"
    assert isinstance(errors.from_reason("NOT_LEADER", "x", leader="10.0.0.2:9091"), errors.NotLeaderError)
    assert isinstance(errors.from_reason("RATE_LIMITED", "x", retry_after_ms=250), errors.ResourceExhaustedError)
    assert isinstance(errors.from_reason("TOKEN_EXPIRED", "x"), errors.AuthenticationError)
    assert isinstance(errors.from_reason("SCOPE_REQUIRED", "x"), errors.PermissionDeniedError)
    assert isinstance(errors.from_reason("ALREADY_ENDED", "x"), errors.ConflictError)
    assert isinstance(errors.from_reason("LEASE_LOST", "x"), errors.LeaseLostError)
    unknown = errors.from_reason("SOMETHING_NEW", "x")
    assert type(unknown) is errors.ServerError and unknown.reason == "SOMETHING_NEW" and not unknown.retryable
