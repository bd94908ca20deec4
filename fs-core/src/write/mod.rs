//! The write path's building blocks: staging on the local disk, the durable journal, and
//! uploads.
//!
//! `write()` lands in a sparse [`staging::StagingFile`] on the cache disk, at local-disk speed.
//! Before `close()` or `fsync()` is acknowledged, the file's [`journal::Record`] is durable, so
//! nothing acknowledged is lost to a crash; [`upload`] then moves it to the bucket under a
//! generation precondition, saving a conflict copy rather than overwriting someone else's newer
//! object. The [`cache_dir::CacheDir`] lock keeps two mounts from sharing one cache directory.
//!
//! These pieces are not yet wired into the facade: until they are, the mount is read-only.

pub mod cache_dir;
pub mod journal;
pub mod ranges;
pub mod staging;
pub mod upload;
pub mod writeback;
