"""The one rule for commit references that the service accepts and hands to git.

Every place that takes a commit from a user (a job submission, a baseline, the gate, the
snapshot cache) calls `check_commit` before the value reaches a query or a `git` command, so
a ref can never look like an option (`--upload-pack=...`), climb out of the ref namespace
(`../x`), or use git's revision syntax (`HEAD@{1}`, `x^{tree}`, `$(...)`). Git calls still pass
`--end-of-options` (`GIT_END_OF_OPTIONS`), so even a value that slipped past is an argument.
"""

from __future__ import annotations

import re

HEX_SHA = re.compile(r"^[0-9a-fA-F]{7,40}\Z")
_SEGMENT = r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*"
# The whole rule as one regular expression without look-arounds, so the OpenAPI schema states it
# exactly and generated clients and fuzzers agree with the server.
REF_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*(?:/{_SEGMENT})*$"
REF_MAX_LENGTH = 200
_REF = re.compile(REF_PATTERN[:-1] + r"\Z")
REF_RULE = (
    "a hex sha of 7-40 characters, or a ref of letters, digits and . _ / - starting with a letter "
    f"or digit (at most {REF_MAX_LENGTH} characters; no '..', '//', '/.', trailing '/' or '.')"
)
REF_SCHEMA = {"pattern": REF_PATTERN, "maxLength": REF_MAX_LENGTH}
GIT_END_OF_OPTIONS = "--end-of-options"


class InvalidCommitRef(ValueError):
    """A commit reference outside `REF_RULE`; the message names the value and the rule."""


def check_commit(value: object, what: str = "commit") -> str:
    """`value` as a commit reference: a hex sha (lower-cased) or a safe ref name.

    Raises InvalidCommitRef (a ValueError, so pydantic validators report it as a 422) naming
    `what`, the value and the rule.
    """
    if not isinstance(value, str):
        raise InvalidCommitRef(f"{what} must be a string ({REF_RULE}); got {value!r}")
    if HEX_SHA.match(value):
        return value.lower()
    if len(value) > REF_MAX_LENGTH or not _REF.match(value):
        raise InvalidCommitRef(f"{what} must be {REF_RULE}; got {value!r}")
    return value


_ANCESTRY = re.compile(r"(?:[~^][0-9]{0,6})*\Z")


def check_revision(value: object, what: str = "revision") -> str:
    """A commit reference followed by git's ancestry steps (`HEAD~1`, `main^2`): what a local
    checkout may be asked to resolve (the gate CLI's `--head HEAD~1`). Reflog (`@{...}`), ranges,
    peeling (`^{tree}`) and anything else stay refused; raises InvalidCommitRef."""
    if not isinstance(value, str):
        raise InvalidCommitRef(f"{what} must be a string ({REF_RULE}); got {value!r}")
    cut = min((i for i in (value.find("~"), value.find("^")) if i >= 0), default=len(value))
    head, steps = value[:cut], value[cut:]  # a ref never holds ~ or ^ (see REF_PATTERN)
    if not _ANCESTRY.match(steps):
        raise InvalidCommitRef(f"{what} must be {REF_RULE}, optionally followed by ~N or ^N; got {value!r}")
    return check_commit(head, what) + steps


def is_commit_ref(value: object) -> bool:
    """True when `check_commit` accepts `value`."""
    try:
        check_commit(value)
    except InvalidCommitRef:
        return False
    return True
