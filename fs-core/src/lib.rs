//! `fs-core`: the platform-neutral heart of bucketdrive.
//!
//! Requests flow one way: an adapter (FUSE or WinFsp) calls the [`Filesystem`] facade, which
//! uses the [`namespace`] (what exists, inode numbers, caches) and the [`read`] path
//! (read-ahead within a memory budget), which both talk to the bucket only through the
//! [`store::ObjectStore`] trait. No layer knows about the one above it. [`windows`] holds what
//! Windows needs to see differently (names, times, attributes), tested here on Linux.

pub mod buffer_pool;
#[cfg(feature = "cli")]
pub mod cli;
pub mod clock;
pub mod config;
pub mod error;
pub mod filesystem;
pub mod metrics;
pub mod namespace;
pub mod platform;
pub mod read;
pub mod store;
pub mod windows;
pub mod write;

pub use config::MountConfig;
pub use error::{FsError, FsResult};
pub use filesystem::{Filesystem, Opened, StatFs};
pub use namespace::{Attr, DirEntry, Ino, Kind, ROOT_INO};
