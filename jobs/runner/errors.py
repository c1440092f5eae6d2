"""Errors of the runner's local durable state: the journal and the result object store.

::

    AccordError
    ├── JournalError              the runner journal cannot be used as asked
    │   ├── JournalLocked         another writer holds the journal's lock (refused at once)
    │   ├── JournalHeaderInvalid  not a journal this code can read (magic, version, header CRC)
    │   ├── JournalRunnerMismatch the journal belongs to another runner id
    │   ├── JournalCorrupt        a bad frame followed by valid frames: fatal, never truncated
    │   ├── JournalTornTail       append refused: the torn tail must be repaired first
    │   ├── JournalRecordInvalid  a record that is not a JSON object of a known shape, or too large
    │   └── JournalBroken         a write or fsync failed: this handle is finished, reopen to rescan
    └── ObjectStoreError          the result object store cannot serve the request
        ├── ObjectKeyInvalid      not a content address (``sha256-<64 hex>``)
        ├── ObjectNotFound        no object under that key
        └── ObjectCorrupt         the stored bytes no longer hash to their key

Every error's docstring is its default message; structured fields (``path``, ``offset``,
``defect``, ``key``) ride along as attributes.
"""

from __future__ import annotations

from accord.schemas.errors import AccordError


class JournalError(AccordError):
    """The runner journal cannot be used as asked."""

    reason = "journal"


class JournalLocked(JournalError):
    """Another writer holds the runner journal's lock; refusing to open it."""

    reason = "journal_locked"


class JournalHeaderInvalid(JournalError):
    """The file is not a runner journal this code can read."""

    reason = "journal_header"


class JournalRunnerMismatch(JournalError):
    """The runner journal belongs to another runner id."""

    reason = "journal_runner_mismatch"


class JournalCorrupt(JournalError):
    """The runner journal is corrupt: a bad frame is followed by valid frames; not repairing."""

    reason = "journal_corrupt"


class JournalTornTail(JournalError):
    """The runner journal ends in a torn tail; repair it before appending."""

    reason = "journal_torn"


class JournalRecordInvalid(JournalError):
    """The journal record is not a JSON object of a known shape, or is too large."""

    reason = "journal_record"


class JournalBroken(JournalError):
    """A journal write or fsync failed; this handle is unusable, reopen the journal to rescan."""

    reason = "journal_broken"


class ObjectStoreError(AccordError):
    """The result object store cannot serve the request."""

    reason = "object_store"


class ObjectKeyInvalid(ObjectStoreError):
    """The key is not a content address (sha256-<64 lowercase hex>)."""

    reason = "object_key"


class ObjectNotFound(ObjectStoreError):
    """No object is stored under that key."""

    reason = "object_not_found"


class ObjectCorrupt(ObjectStoreError):
    """The stored object no longer hashes to its key."""

    reason = "object_corrupt"
