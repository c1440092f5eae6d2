"""The jobs module's errors, rooted at :class:`JobsError`::

    AccordError
    └── JobsError                     the jobs module refused
        ├── JobConflict               same operation submitted with another digest
        ├── JobNotFound               no such job
        ├── InvalidLeaseLength        a lease must be finite and positive
        ├── FenceLost                 the caller no longer holds the job (failed_check = the field)
        ├── EffectError               an effect record refuses the transition
        │   ├── EffectsDisabled       the workflow class is not registered with effects enabled
        │   ├── EffectUndeclared      the key is not among the job class's declared effect keys
        │   ├── EffectIntentInvalid   the intent is not canonical JSON (cannot be digested)
        │   ├── ReceiptInvalid        a call's Success receipt cannot be kept (too long, not text)
        │   ├── IdempotencyKeyMismatch the call's idempotency key is not the one reconcile asks
        │   ├── EffectAlreadyBegun    the key's latest record is not failed_before_dispatch
        │   ├── EffectConflict        the key was begun with another intent digest
        │   ├── EffectNotPending      no pending record of this attempt to finish
        │   └── EffectsUnresolved     publish refused while an effect is pending or unknown
        ├── RegistrationError         the workflow class's queue owner does not allow this
        │   ├── WorkflowNotRegistered no queue owner is registered for the class
        │   ├── WorkflowOwnedElsewhere another queue owner serves the class
        │   └── WorkflowNotDrained    the owner cannot change while work is open
        ├── AuthorityError            authority cannot be verified, or a change was refused
        │   ├── LedgerUnavailable     the authority ledger cannot be read or written
        │   ├── AuthorityRefused      the database refused the change (reason = why)
        │   └── RestoreDetected       the database is behind the ledger for some tenant
        ├── RepairRefused             a repair refused (reason = why: running, not_held, ...)
        ├── LookupUnavailable         a receipt lookup gave no definite answer (reconcile later)
        ├── PruneBlocked              another schema's foreign key forbids removing a finished job
        ├── ResultMismatch            a publish names one result object, its callback another
        ├── JournalError              a framed file (runner journal, ledger) cannot be used as asked
        │   ├── JournalLocked         another writer holds its lock (refused at once)
        │   ├── JournalHeaderInvalid  not a file this code can read (magic, version, header CRC)
        │   ├── JournalRunnerMismatch the file belongs to another runner id
        │   ├── JournalCorrupt        a bad frame followed by valid frames: fatal, never truncated
        │   ├── JournalTornTail       append refused: the torn tail must be repaired first
        │   ├── JournalRecordInvalid  a record that is not a JSON object, or too large
        │   ├── JournalUnavailable    its file or directory cannot be created or opened
        │   └── JournalBroken         a write or fsync failed: the handle is finished, reopen
        └── ObjectStoreError          the result object store cannot serve the request
            ├── ObjectKeyInvalid      not a content address (``sha256-<64 hex>``)
            ├── ObjectNotFound        no object under that key
            ├── ObjectCorrupt         the stored bytes no longer hash to their key
            └── ObjectStoreUnavailable its directory cannot be created or written

``FenceLost.failed_check`` is the first lease field that no longer matches (its typed
``reason`` stays ``fence_lost``): ``missing``,
``tenant``, ``operation``, ``generation``, ``owner``, ``attempt``, ``state``, ``epoch``,
``frozen``, ``lease_expired`` (or ``row_count`` if the guarded update touched no row).
"""

from __future__ import annotations

from accord.schemas.errors import AccordError

#: Every reason the SQL fence (jobs.fence) can give, in the order it checks them.
FENCE_REASONS = (
    "missing",
    "tenant",
    "operation",
    "generation",
    "owner",
    "attempt",
    "state",
    "epoch",
    "frozen",
    "lease_expired",
    "row_count",
)


class JobsError(AccordError):
    """The jobs module refused."""

    reason = "jobs"


class JobConflict(JobsError):
    """The operation was already submitted with another digest."""

    reason = "job_conflict"


class JobNotFound(JobsError):
    """No such job."""

    reason = "job_not_found"


class InvalidLeaseLength(JobsError):
    """A lease must be finite and positive (and at most a day)."""

    reason = "invalid_lease"


class FenceLost(JobsError):
    """The caller no longer holds this job; its write-back was refused."""

    reason = "fence_lost"
    #: The first lease field that no longer matches (one of FENCE_REASONS).
    failed_check: str


class EffectError(JobsError):
    """The effect record refuses this transition."""

    reason = "effect"


class EffectsDisabled(EffectError):
    """External effects are not enabled for this workflow class."""

    reason = "effects_disabled"


class EffectUndeclared(EffectError):
    """This effect key is not among the job class's declared effect keys: nothing was begun
    and nothing was sent. Declare it (``app.job(..., effects=(...))``) with the provider that
    owns it; only an owner's lookup can ever resolve an effect whose reply is lost."""

    reason = "effect_undeclared"


class EffectIntentInvalid(EffectError):
    """The effect's intent is not canonical JSON (RFC 8785: no NaN, no integer past 2**53,
    string keys), so it has no digest: nothing was begun or sent. Pass plain JSON values."""

    reason = "effect_intent_invalid"


class ReceiptInvalid(EffectError):
    """An effect call's ``Success`` receipt is not one the database and the journal can keep:
    a string of at most ``limit`` characters, with no NUL and no lone surrogate. The receipt
    is the provider's proof for one request (a charge id, a message id): return that id, not
    the provider's response body. The request left, and its proof cannot be kept: the
    outcome is recorded unknown, and the handler gets EffectUnknown caused by this."""

    reason = "receipt_invalid"


class IdempotencyKeyMismatch(EffectError):
    """The idempotency key given for this effect is not ``ctx.idempotency_key(effect_key)``,
    the key ``accord reconcile`` asks the provider's lookup about: an effect whose reply is
    lost could then be resolved by another key's answer and sent again. Nothing was begun or
    sent. Call the provider with ``ctx.idempotency_key(effect_key)``; a provider that needs
    another form of key can derive it from that one by a fixed mapping, in the call and in
    its lookup alike."""

    reason = "idempotency_key_mismatch"


class EffectAlreadyBegun(EffectError):
    """This effect key was already begun and did not fail before dispatch."""

    reason = "effect_already_begun"


class EffectConflict(EffectError):
    """This effect key was begun with another intent digest."""

    reason = "effect_conflict"


class EffectNotPending(EffectError):
    """This attempt has no pending record of this effect key to finish."""

    reason = "effect_not_pending"


class EffectsUnresolved(EffectError):
    """An effect of this job is pending or unknown; it cannot be published as succeeded."""

    reason = "effects_unresolved"


class RegistrationError(JobsError):
    """The workflow class's registration does not allow this."""

    reason = "registration"


class WorkflowNotRegistered(RegistrationError):
    """No queue owner is registered for this workflow class; refusing to serve it."""

    reason = "workflow_not_registered"


class WorkflowOwnedElsewhere(RegistrationError):
    """Another queue owner serves this workflow class; refusing to serve it."""

    reason = "workflow_owned_elsewhere"


class WorkflowNotDrained(RegistrationError):
    """The workflow class still has queued, running, unknown or held work; transfer it
    explicitly (jobs.registry.transfer)."""

    reason = "workflow_not_drained"


class AuthorityError(JobsError):
    """Authority cannot be verified, or a change of it was refused."""

    reason = "authority"


class LedgerUnavailable(AuthorityError):
    """The authority ledger cannot be read or written; refusing to trust the database alone."""

    reason = "ledger_unavailable"


class AuthorityRefused(AuthorityError):
    """The database refused the authority change."""

    reason = "authority_refused"


class AuthorityUnchecked(AuthorityError):
    """No authority check has passed since the worker's last new or lost database connection:
    it claims nothing until one does (DESIGN §8)."""

    reason = "authority_unchecked"


class RestoreDetected(AuthorityError):
    """The database is behind the authority ledger (a restore): affected tenants are frozen."""

    reason = "restore_detected"


class RepairRefused(JobsError):
    """The repair was refused."""

    reason = "repair_refused"


class LookupUnavailable(JobsError):
    """The provider's receipt lookup gave no definite answer; the effect stays unresolved."""

    reason = "lookup_unavailable"


class JournalError(JobsError):
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


class JournalUnavailable(JournalError):
    """The runner journal's file or directory cannot be created or opened: fix its path.

    A path under a file, or one without permission: ACCORD_JOURNAL_DIR (or --journal) and
    its permissions."""

    reason = "journal_unavailable"


class JournalBroken(JournalError):
    """A journal write or fsync failed; this handle is unusable, reopen the journal to rescan."""

    reason = "journal_broken"


class ObjectStoreError(JobsError):
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


class ObjectStoreUnavailable(ObjectStoreError):
    """The object store's directory cannot be created or written: fix its path.

    A path under a file, or one without permission: ACCORD_OBJECT_DIR and its permissions."""

    reason = "object_store_unavailable"


class PruneBlocked(JobsError):
    """Retention is blocked: another schema's foreign key forbids removing a finished job.

    ``constraint`` and ``table`` name the reference (``schema`` its schema): make it
    ``ON DELETE SET NULL`` (or ``CASCADE``) in that application's migrations, or the pruner
    stays blocked at that job.
    """

    reason = "prune_blocked"


class ResultMismatch(JobsError):
    """A publish names one result object and its callback recorded another: a job has one
    result (its jobs.results row). Record the key the publish names, or name none."""

    reason = "result_mismatch"
