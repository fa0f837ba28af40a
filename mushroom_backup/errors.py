"""The one exception tree of mushroom-backup.

Every error the package raises on purpose is a :class:`MushroomError`. Each class carries the
exit code the CLI uses for it and a message that says what happened and what to do. Messages
never contain credentials: anything that may echo a URL or a service answer goes through
:func:`redact` first.

::

    MushroomError                      exit 1  (anything not listed below)
    ├── UsageError                     exit 2  bad command line, config file or store URL
    ├── StoreError                     exit 1  the object store failed; .retryable says whether
    │   │                                      trying again may help
    │   ├── NotFound                           the key does not exist
    │   ├── PreconditionFailed                 a conditional write or delete was refused (412/409)
    │   │   └── AlreadyExists                  create-only write over an existing key
    │   └── ConditionalWritesUnsupported       this client sends no conditional headers
    │                                          (best-effort mode), or the service answered
    │                                          501 to one
    ├── LeaseError                     exit 1
    │   ├── LeaseHeld                  exit 3  another instance holds a fresh lease
    │   ├── LeaseLost                  exit 4  our lease was taken over or deleted
    │   │   └── LatestMoved            exit 4  another writer moved LATEST under us
    │   ├── FenceClosed                exit 4  the write deadline passed: nothing more is written
    │   └── PreconditionsIgnored       exit 1  the service ignores If-None-Match / If-Match
    ├── ProcessLeaseError              exit 1  the process lease (cluster node identity)
    │   ├── ProcessLeaseInvalid                durable state that breaks a rule; never repaired
    │   ├── ProcessLeaseIO                     the store failed or moved under us
    │   ├── ProcessLeaseDeadline               the caller's deadline expired
    │   └── ProcessLeaseHeld           exit 3  a live process owns the node id
    ├── Interrupted                    128+N   stopped by signal N (SIGINT 130, SIGTERM 143) after
    │                                          cancelling the work and releasing the lease
    ├── SnapshotError                  exit 1  a snapshot could not be taken or read
    └── IntegrityError                 exit 5  stored data is missing, corrupt or unsafe
        └── UnsafePath                 exit 5  a manifest path would escape the restore target

"A 412 is an answer, not a fault": :class:`PreconditionFailed` is never retried blindly.
"""

from __future__ import annotations

import re

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_LEASE_HELD = 3
EXIT_LEASE_LOST = 4
EXIT_INTEGRITY = 5

_SECRET_PATTERNS = (
    # key=value pairs of the usual credential names (query strings, env dumps, botocore debug)
    re.compile(
        r"(?i)((?:aws_)?(?:secret_access_key|session_token|access_key_id|password|secret|token|"
        r"signature|credential|x-amz-security-token|x-amz-signature|x-amz-credential)"
        r"[\"']?\s*[=:]\s*[\"']?)([^\s&\"',;]+)"
    ),
    # userinfo in URLs: scheme://user:pass@host
    re.compile(r"(?i)([a-z][a-z0-9+.-]*://)([^/@\s:]+:[^/@\s]+)@"),
    # AWS access key ids
    re.compile(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b"),
)


def redact(text: str) -> str:
    """Text with anything that looks like a credential replaced by ``***``."""
    text = _SECRET_PATTERNS[0].sub(lambda m: m.group(1) + "***", text)
    text = _SECRET_PATTERNS[1].sub(lambda m: m.group(1) + "***@", text)
    return _SECRET_PATTERNS[2].sub("***", text)


class MushroomError(Exception):
    """Base of every error mushroom-backup raises on purpose."""

    exit_code: int = EXIT_ERROR

    def __init__(self, message: str) -> None:
        if not message:
            raise ValueError("an error needs a message")
        super().__init__(redact(message))

    @property
    def message(self) -> str:
        return str(self.args[0])


class UsageError(MushroomError):
    """The command line, the config file or a store URL is wrong."""

    exit_code = EXIT_USAGE


# --- object stores -------------------------------------------------------------------------


class StoreError(MushroomError):
    """The object store failed a request. ``retryable`` says whether trying again may help."""

    def __init__(self, message: str, *, key: str | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.key = key
        self.retryable = retryable


class NotFound(StoreError):
    """The key does not exist."""

    def __init__(self, key: str) -> None:
        super().__init__(f"object {key!r} does not exist", key=key)


class PreconditionFailed(StoreError):
    """A conditional write or delete was refused: the object is not the version we named
    (HTTP 412, or 409 ConditionalRequestConflict for a lost race)."""

    def __init__(self, key: str, detail: str = "") -> None:
        why = f": {detail}" if detail else ""
        super().__init__(f"conditional request on {key!r} was refused{why}", key=key)


class AlreadyExists(PreconditionFailed):
    """A create-only write found the key already present."""

    def __init__(self, key: str) -> None:
        super().__init__(key, "the object already exists")


class ConditionalWritesUnsupported(StoreError):
    """This client is configured without conditional writes (best-effort mode), so it cannot
    send ``If-None-Match`` / ``If-Match`` -- or the service answered 501 Not Implemented to one
    (``reason`` then says so). Callers fall back to read-then-write."""

    def __init__(self, key: str, reason: str | None = None) -> None:
        super().__init__(
            reason
            or (
                f"conditional write of {key!r} is not available: conditional writes are "
                "switched off (MUSHROOM_BACKUP_LEASE_CONDITIONAL=off)"
            ),
            key=key,
        )


# --- the bucket lease ----------------------------------------------------------------------


class LeaseError(MushroomError):
    """The bucket lease could not be taken, renewed or released."""


class LeaseHeld(LeaseError):
    """Another instance holds a fresh lease on the prefix (or won the race for it)."""

    exit_code = EXIT_LEASE_HELD

    def __init__(self, instance_id: str, message: str | None = None) -> None:
        super().__init__(
            message
            or (
                f"the backup prefix's lease is held by another instance ({instance_id}); "
                "wait for it to finish, or use --wait-lease SECONDS"
            )
        )
        self.instance_id = instance_id


class LeaseLost(LeaseError):
    """The lease is no longer ours: the object was replaced or deleted. Final."""

    exit_code = EXIT_LEASE_LOST

    def __init__(self, instance_id: str | None = None, message: str | None = None) -> None:
        if message is None:
            message = (
                f"the bucket lease was taken over by {instance_id}"
                if instance_id
                else "the bucket lease was lost"
            )
        super().__init__(message)
        self.instance_id = instance_id


class LatestMoved(LeaseLost):
    """The ``LATEST`` compare-and-swap was refused: another writer moved it since we read it.
    Our manifest stays an unreferenced orphan; the lease must be treated as lost."""

    def __init__(self, message: str) -> None:
        super().__init__(None, message)


class FenceClosed(LeaseError):
    """The write deadline passed (no confirmed renewal for 2/3 of a TTL, or the lease was lost):
    this holder writes nothing more."""

    exit_code = EXIT_LEASE_LOST


class PreconditionsIgnored(LeaseError):
    """The service accepted a conditional PUT whose precondition was false, so the lease cannot
    keep a second writer out. ``header`` names which header is ignored."""

    def __init__(self, header: str) -> None:
        super().__init__(
            f"the backup service ignores {header} on PUT, so the bucket lease cannot keep a "
            "second writer out; backup is not started. Set MUSHROOM_BACKUP_LEASE_CONDITIONAL=off "
            "to run with a best-effort lease"
        )
        self.header = header


# --- the process lease ---------------------------------------------------------------------


class ProcessLeaseError(MushroomError):
    """The process lease (stable node identity) failed closed."""


class ProcessLeaseInvalid(ProcessLeaseError):
    """Durable process-lease state breaks a rule (noncanonical, oversized, foreign, gapped).
    It is rejected, never repaired."""


class ProcessLeaseIO(ProcessLeaseError):
    """The store failed, or the history moved under us more often than the bound allows."""


class ProcessLeaseDeadline(ProcessLeaseError):
    """The caller's deadline expired before or during a step."""


class ProcessLeaseHeld(ProcessLeaseError):
    """A live process owns the node id."""

    exit_code = EXIT_LEASE_HELD


class Interrupted(MushroomError):
    """A one-shot command was stopped by a signal; its work was cancelled and cleaned up."""

    def __init__(self, signum: int, name: str) -> None:
        super().__init__(
            f"interrupted by {name}: the work in flight was cancelled (a snapshot in flight is "
            "abandoned and LATEST is untouched) and the lease was released"
        )
        self.exit_code = 128 + signum


# --- snapshots -----------------------------------------------------------------------------


class SnapshotError(MushroomError):
    """A snapshot could not be taken, listed or read (not a corruption: see IntegrityError)."""


class IntegrityError(MushroomError):
    """Stored data is missing, corrupt, truncated or unsafe to restore."""

    exit_code = EXIT_INTEGRITY


class UnsafePath(IntegrityError):
    """A manifest path is absolute, contains ``..``, or would escape the target via a symlink."""
