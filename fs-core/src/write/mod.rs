//! The write path: staging on the local disk, the durable journal, and uploads.
//!
//! `write()` lands in a sparse working copy on the cache disk, at local-disk speed. Before
//! `close()` is acknowledged the file's version is in the journal (in the kernel, so it
//! survives a crash of the daemon), and a commit within `--commit-interval` makes it durable
//! against a power cut ([`commit`]); `fsync()` is durable at once. The engine then moves it
//! to the bucket under a generation precondition.
//!
//! # Invariants
//!
//! Each is checked by the deterministic simulation (`fs-core/tests/sim.rs`) and the end-to-end
//! soak (`tests/e2e/faults.rs`), and stated for users in `docs/semantics.md`.
//!
//! - **I1, nothing acknowledged is lost.** Every version acknowledged by `fsync()`, or by
//!   `close()` (across a power cut: more than one commit interval before it), ends in the
//!   bucket, or as a conflict copy, or is superseded by a later acknowledged version of the
//!   same file, or its name was deleted or renamed by the user; across any number of crashes.
//!   (The journal record is written before the acknowledgement and durable by the commit; a
//!   superseded version stays until the newer one's commit; a version's bytes are never edited
//!   in place while it is pending; replay re-creates every record whose bytes check.)
//! - **I2, never mixed.** The bucket never holds bytes no version had. Parts are checked
//!   against the version's local bytes by CRC32C before any compose; a version that cannot be
//!   verified starts over. After a crash mid-edit the object holds the last acknowledged
//!   version.
//! - **I3, removed names stay removed.** Namespace changes pause the file's uploads and wait
//!   for any in flight; the journal follows a rename in one line, so a replay uploads under the
//!   new name only; an unlink drops the record only after the bucket delete succeeded.
//! - **I4, conflicts are real.** A precondition failure is checked against the object: our own
//!   earlier write whose answer was lost is recognised by CRC32C and size.
//! - **I5, works offline.** Opening, reading, overwriting and closing a staged file make no
//!   bucket request.
//! - **I6, always progresses.** The scheduler alone owns delays and backoff; a failing item
//!   sleeps without an upload slot; missing parts mean starting over.
//! - **I7, clean, and mounts never hurt each other.** Temporary parts are named per cache
//!   directory; a mount removes its own leftovers at start-up and other mounts' only once old.
//!
//! Files the kernel writes itself ([`passthrough`]) are edited in place by design: their
//! versions are *live*, the staged file as it is. I1 holds for them across a crash or kill
//! (the kernel keeps the pages) and, across a power cut, for what a commit covered (as the disk
//! kept it, block by block, like a local file edited in place); I2 holds for the bucket, whose
//! uploads check the bytes they send against the version's CRC32C and start over with the file
//! as it is now when they differ.
//!
//! A bucket is shared (other mounts, other tools); these hold for any number of writers, and
//! the multi-mount simulation (`fs-core/tests/sim/shared.rs`) checks them:
//!
//! - **I8, nobody else's bytes are destroyed.** Deletes, copies over a name and uploads carry
//!   the generation this mount saw there as their precondition, never one a fresh look found:
//!   another writer's object is left as it is, and ours goes beside it as a conflict copy
//!   ([`name_changes`], `filesystem/changes.rs`).
//! - **I9, every acknowledged version of every mount survives** (acknowledged as in I1).
//!   Nothing acknowledged is
//!   dropped on a conflict or a vanished base: it is uploaded beside, or kept staged and
//!   reported as not saved.
//! - **I10, a failed write never replaces a good object.** A failed write, truncate or commit
//!   fsync holds the item ([`item`]): its changes are never committed until the file is
//!   rewritten whole; a failed commit is never retried in the background; changes not saved
//!   are journaled and survive a crash ([`journal`]'s `NotSaved`, [`replay`]).
//! - **I11, a cache directory belongs to one bucket and prefix.** Its marker names them before
//!   anything is staged, and the claim under the lock refuses a directory of another owner, or
//!   with records of an unknown one unless adopted, so records are never uploaded to another
//!   bucket or prefix; a mount of another bucket or prefix works in a directory of its own, and
//!   the default directory does not depend on the mountpoint ([`cache_dir`]).
//!
//! # Modules
//!
//! - [`item`]: one file's state machine (working copy, pending version, life).
//! - [`writeback`]: the engine the facade calls: its items by name, open, drain, status.
//! - [`working_copy`]: a file's working copy: reads, writes, truncates, copy-on-write, space.
//! - [`seal`]: commit (a working copy becomes an acknowledged version), close, fsync, release.
//! - [`commit`]: when closed versions become durable against a power cut (`--commit-interval`).
//! - [`passthrough`]: files the kernel writes itself (FUSE passthrough), and their live
//!   versions.
//! - [`name_changes`]: deletes and renames of files being written, and the pause that keeps
//!   uploads out of their way (I3, I8).
//! - [`scheduler`]: when an upload may start (write-back delay, backoff).
//! - [`uploader`]: runs attempts and files their outcomes.
//! - [`upload`]: one attempt against the bucket (single, composite, resumable).
//! - [`journal`]: the durable log of pending versions (group commit).
//! - [`replay`]: start-up recovery and leftover cleanup.
//! - [`staging`], [`ranges`]: local files and which of their bytes are present.
//! - [`staging_pool`]: empty staging files with durable names, made ahead and recycled.
//! - [`space`]: `--cache-size` accounting. [`status`]: counters for `bucketdrive status`.
//! - [`cache_dir`]: the locked cache directory, its tag and its owner; which one a mount uses.

pub mod cache_dir;
pub mod commit;
pub mod disk_errors;
pub mod item;
pub mod journal;
pub mod name_changes;
pub mod passthrough;
pub mod ranges;
pub mod replay;
pub mod scheduler;
pub mod seal;
pub mod space;
pub mod space_watch;
pub mod staging;
pub mod staging_pool;
pub mod status;
pub mod upload;
pub mod uploader;
pub mod working_copy;
pub mod writeback;
